#!/usr/bin/env python3
"""How close can ``auto`` come to the best fixed depth at several streams? ``auto`` as it is, against
a ceiling: the same engine with every pass of two or more sequences held to plain steps and the
target's capture off through them (what a planner that knew drafting loses there, and paid
nothing to learn it, would do), passes of one sequence still ``auto``.

    python -m scripts.investigate.auto_ceiling --engines 5 --runs 5 --json ceiling.json

The workload of ``bench_concurrency``'s ``auto`` cells (``--requests`` greedy completions of
``--n-predict`` tokens on the first 96 tokens of the bundled code prompts, F16 cache, prompt cache
off, ``--streams`` in ``--lanes``). A fresh engine per variant and per ``--engines`` round, as each
benchmark run starts one, and its first ``--runs`` runs (auto learns across them, as in that
benchmark's repetitions); one engine at fixed depths 0 and 4 beside them, runs interleaved.
Statistic: per engine, the median of its runs over the best fixed depth's median over all rounds;
reported per variant as the mean over engines with each engine's figure.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from scripts.recorded import command_line, write_json

VARIANTS = ("auto", "ceiling")


def hold_multi_sequence_passes_plain(active: dict) -> None:
    """The ceiling: while ``active["on"]``, a pass of two or more sequences is planned plain and
    promised plain for good (so the drafters switch the target's capture off)."""
    from laguna_dflash.runtime.tuner import batch as tb

    choose, ahead = tb.PassDepth.choose, tb.SlotDepth.plain_rounds_ahead

    def plain_choose(self):
        depth = choose(self)
        return 0 if active["on"] and self.n >= 2 else depth

    def plain_ahead(self):
        current = self.planner.current
        if active["on"] and current is not None and current.n >= 2 and self.planned == 0:
            return 1 << 30
        return ahead(self)

    tb.PassDepth.choose, tb.SlotDepth.plain_rounds_ahead = plain_choose, plain_ahead


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--lanes", type=int, default=2)
    ap.add_argument("--engines", type=int, default=5, help="fresh engines per variant")
    ap.add_argument("--runs", type=int, default=5, help="runs of each engine")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.progress import Progress

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.engine import EngineConfig, GenerateOptions
    from laguna_dflash.runtime.lanes import make_engine
    from laguna_dflash.runtime.llama import Model
    from laguna_dflash.runtime.open_pair import resolve_pair

    active = {"on": False}
    hold_multi_sequence_passes_plain(active)
    pair = resolve_pair(assets.TINY_TARGET, assets.converted_tiny_drafter())
    cfg = EngineConfig(n_ctx=1024, n_threads=args.threads, kv_type="f16", prompt_cache=False)
    texts = assets.read_prompts(assets.CODE_PROMPTS)
    runs: dict[str, list[list[float]]] = {v: [] for v in VARIANTS}
    fixed: dict[int, list[float]] = {0: [], 4: []}
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
                engines = {v: new_engine() for v in VARIANTS}
                for v in VARIANTS:
                    runs[v].append([])
                for _ in range(args.runs):
                    for v, engine in engines.items():
                        active["on"] = v == "ceiling"
                        runs[v][-1].append(rate(engine, "auto"))
                        active["on"] = False
                    for depth in fixed:
                        fixed[depth].append(rate(at_fixed, depth))
                    bar.advance(task)
                for engine in engines.values():
                    engine.close()
    best_depth = max(fixed, key=lambda d: statistics.median(fixed[d]))
    best = statistics.median(fixed[best_depth])
    per_engine = {v: [statistics.median(r) / best for r in runs[v]] for v in VARIANTS}
    for v in VARIANTS:
        print(f"{v:8s} {statistics.mean(per_engine[v]):.3f} of the best fixed depth ({best_depth}: {best:.0f} tok/s); "
              f"engines {' '.join(f'{x:.3f}' for x in per_engine[v])}")
    if args.json:
        write_json(args.json, {
            "command": command_line(__file__, argv), "streams": args.streams, "lanes": args.lanes,
            "threads": args.threads, "requests": args.requests, "n_predict": args.n_predict,
            "engines": args.engines, "runs": args.runs,
            "fixed_tokens_per_s": {str(d): v for d, v in fixed.items()}, "best_fixed_depth": best_depth,
            "auto_tokens_per_s": runs, "over_best_fixed_per_engine": per_engine,
            "over_best_fixed_mean": {v: statistics.mean(x) for v, x in per_engine.items()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
