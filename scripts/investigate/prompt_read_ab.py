#!/usr/bin/env python3
"""Whether queueing a prompt's rows for the first draft changed a drafting run's speed: new against old in one process.

The drafter reads a prompt's visible rows at the first draft (``Drafter.queue_visible``); before,
it read each prompt part's rows right after that part's prefill. This runs the bundled pair's
code prompts through a one-slot engine (greedy, prompt cache off) at each of ``--depths``, under
both: ``new`` as shipped, ``old`` with ``queue_visible`` replaced by the read at prefill. The cells
take turns for ``--rounds`` rounds; per cell the median of each round's tokens/s, and per depth
the median and spread of the rounds' new/old ratios. Both must give the same tokens. A probe:

    python -m scripts.investigate.prompt_read_ab --depths 4,auto --rounds 10 --json ab.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from scripts.arguments import int_list, require_at_least
from scripts.recorded import command_line, write_json


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--depths", type=int_list(1, 15, ("auto",)), default=(4, "auto"),
                    help="comma-separated drafting depths and/or auto")
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    require_at_least(ap, args, prompts=1, n_predict=1, rounds=1, threads=1)

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions
    from laguna_dflash.runtime.open_pair import resolve_pair
    from tests.helpers.prefill_read import read_at_prefill

    pair = resolve_pair(assets.TINY_TARGET, assets.converted_tiny_drafter())
    prompts = assets.read_prompts(assets.CODE_PROMPTS)[:args.prompts]
    cells = [(d, way) for d in args.depths for way in ("new", "old")]
    speed: dict[tuple, list[float]] = {c: [] for c in cells}
    tokens: dict[tuple, list] = {}
    with Engine.open(pair, EngineConfig(n_threads=args.threads, prompt_cache=False)) as engine:
        drafter = engine.drafter
        read_now, old_reads = read_at_prefill(drafter), [0]

        def old(*part):  # counted: the old way must really have run
            old_reads[0] += 1
            read_now(*part)
        for rnd in range(args.rounds):
            for depth, way in cells:
                if way == "old":
                    drafter.queue_visible = old
                t0, out = time.perf_counter(), []
                for p in prompts:
                    out.append(engine.generate(p, GenerateOptions(n_predict=args.n_predict, n_max=depth)).tokens)
                wall = time.perf_counter() - t0
                if way == "old":
                    del drafter.queue_visible  # the method again
                speed[(depth, way)].append(sum(map(len, out)) / wall)
                tokens.setdefault((depth, way), out)
                if out != tokens[(depth, way)]:
                    raise SystemExit(f"depth {depth} ({way}): other tokens in round {rnd + 1}")
    same_tokens = all(tokens[(d, "new")] == tokens[(d, "old")] for d in args.depths)
    result = {}
    for d in args.depths:
        ratios = [n / o for n, o in zip(speed[(d, "new")], speed[(d, "old")])]
        result[str(d)] = {"new_tok_s": statistics.median(speed[(d, "new")]),
                          "old_tok_s": statistics.median(speed[(d, "old")]),
                          "new_over_old": {"median": statistics.median(ratios), "min": min(ratios),
                                           "max": max(ratios), "rounds": ratios}}
        r = result[str(d)]
        print(f"depth {d}: new {r['new_tok_s']:.1f}, old {r['old_tok_s']:.1f} tok/s; new/old median "
              f"{r['new_over_old']['median']:.3f} ({r['new_over_old']['min']:.3f}-{r['new_over_old']['max']:.3f})")
    print(f"same tokens both ways: {same_tokens}; prompt parts read the old way: {old_reads[0]}")
    if args.json:
        write_json(args.json, {"command": command_line(__file__, argv), "threads": args.threads,
                               "rounds": args.rounds, "prompts": args.prompts, "n_predict": args.n_predict,
                               "depths": result, "same_tokens_both_ways": same_tokens,
                               "old_prefill_reads": old_reads[0]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
