#!/usr/bin/env python3
"""Does prompts sharing a pass move ``auto`` against the best fixed depth at several streams? The
batched engine as it is (prompts that wait together prefill in one pass) against the same with
one prompt part a turn (``BatchEngine.share_prompts`` off), in one process, runs interleaved.

    python -m scripts.investigate.shared_prompts_auto --engines 6 --runs 5 --json shared.json

The workload of ``bench_concurrency``'s ``auto`` cells (``--requests`` greedy completions of
``--n-predict`` tokens on the first 96 tokens of the bundled code prompts, F16 cache, prompt cache
off, ``--streams`` in ``--lanes``). Per ``--engines`` round and mode, a fresh ``auto`` engine and
its first ``--runs`` runs (auto learns across them, as in that benchmark's repetitions); one engine
at fixed depths 0 and 4 runs beside them in both modes. Statistic: per engine, the median of its
runs over its mode's best fixed depth (median over all rounds); per mode the mean over engines,
with each engine's figure.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from scripts.recorded import command_line, write_json

MODES = {"share": True, "one-a-turn": False}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--lanes", type=int, default=2)
    ap.add_argument("--engines", type=int, default=5, help="fresh auto engines per mode")
    ap.add_argument("--runs", type=int, default=5, help="runs of each engine")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.progress import Progress

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.batch import BatchEngine
    from laguna_dflash.runtime.engine import EngineConfig, GenerateOptions
    from laguna_dflash.runtime.lanes import make_engine
    from laguna_dflash.runtime.llama import Model
    from laguna_dflash.runtime.open_pair import resolve_pair

    pair = resolve_pair(assets.TINY_TARGET, assets.converted_tiny_drafter())
    cfg = EngineConfig(n_ctx=1024, n_threads=args.threads, kv_type="f16", prompt_cache=False)
    texts = assets.read_prompts(assets.CODE_PROMPTS)
    runs: dict[str, list[list[float]]] = {m: [] for m in MODES}
    fixed: dict[str, dict[int, list[float]]] = {m: {0: [], 4: []} for m in MODES}
    try:
        with Model(pair.target.path) as target, Model(pair.drafter.path) as drafter:
            prompts = [target.tokenize(texts[i % len(texts)])[:96] for i in range(args.requests)]

            def new_engine():
                return make_engine(target, pair, cfg, args.streams, min(args.lanes, args.streams), drafter)

            def rate(engine, n_max) -> float:
                t = time.perf_counter()
                results = engine.generate_all(prompts, GenerateOptions(n_predict=args.n_predict, n_max=n_max))
                return sum(len(r.tokens) for r in results) / (time.perf_counter() - t)

            with new_engine() as at_fixed, Progress(console=Console(stderr=True)) as bar:
                task = bar.add_task("runs", total=args.engines * args.runs)
                for _ in range(args.engines):
                    engines = {m: new_engine() for m in MODES}
                    for m in MODES:
                        runs[m].append([])
                    for _ in range(args.runs):
                        for m, engine in engines.items():
                            BatchEngine.share_prompts = MODES[m]
                            runs[m][-1].append(rate(engine, "auto"))
                            for depth in fixed[m]:
                                fixed[m][depth].append(rate(at_fixed, depth))
                        bar.advance(task)
                    for engine in engines.values():
                        engine.close()
    finally:
        BatchEngine.share_prompts = True
    report = {}
    for m in MODES:
        best_depth = max(fixed[m], key=lambda d: statistics.median(fixed[m][d]))
        best = statistics.median(fixed[m][best_depth])
        per_engine = [statistics.median(r) / best for r in runs[m]]
        report[m] = {"best_fixed_depth": best_depth, "best_fixed_tokens_per_s": best,
                     "over_best_fixed_per_engine": per_engine, "over_best_fixed_mean": statistics.mean(per_engine)}
        print(f"{m:10s} auto {statistics.mean(per_engine):.3f} of the best fixed depth ({best_depth}: {best:.0f} tok/s); "
              f"engines {' '.join(f'{x:.3f}' for x in per_engine)}")
    if args.json:
        write_json(args.json, {
            "command": command_line(__file__, argv), "streams": args.streams, "lanes": args.lanes,
            "threads": args.threads, "requests": args.requests, "n_predict": args.n_predict,
            "engines": args.engines, "runs": args.runs, "fixed_tokens_per_s": fixed,
            "auto_tokens_per_s": runs, "modes": report})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
