#!/usr/bin/env python3
"""Issue 48's tiny-pair line taken apart, sample by sample, beside the two CPUs' round trip.

The line is 4 streams in two lanes (one thread each) over the same requests one at a time on two
threads. Per sample, between two round-trip measurements (scripts/bench/core_round_trip.c, as in
core_distance.py), four cells run the benchmark's workload (8 greedy completions of 64 tokens on
96-token code prompts, depth 4, F16 cache, prompt cache off) once each, in turn: one at a time on
two threads and on one thread, one lane of two streams on one thread, two lanes of four streams;
their aggregate tokens/s give the line (two lanes over one at a time on two threads) and its
factors: what the second thread gives one sequence, what batching two sequences gives one
thread, and what the second lane adds. Samples are classed near, far or mixed by the round trip,
and per class each figure's median is reported with its range.

    python -m scripts.investigate.lanes_by_distance --samples 12 --pause 20 --json lanes-distance.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from scripts.arguments import require_at_least
from scripts.bench.bench_concurrency import in_a_thread, run_batched, run_separate
from scripts.investigate.core_distance import add_round_trip_args, build_round_trip, by_class, classify, round_trip_ns
from scripts.recorded import command_line, write_json

#: the cells in their order within a sample: (kind, threads, streams, lanes)
CELLS = {"alone, 2 threads": ("separate", 2, 1, 1), "alone, 1 thread": ("separate", 1, 1, 1),
         "one lane of 2, 1 thread": ("batched", 1, 2, 1), "two lanes of 2, a thread each": ("batched", 2, 4, 2)}
#: the line and its factors, each a ratio of two cells
RATIOS = {"line: two lanes / alone on 2 threads": ("two lanes of 2, a thread each", "alone, 2 threads"),
          "second thread for one sequence": ("alone, 2 threads", "alone, 1 thread"),
          "two sequences on one thread": ("one lane of 2, 1 thread", "alone, 1 thread"),
          "second lane": ("two lanes of 2, a thread each", "one lane of 2, 1 thread")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--pause", type=float, default=20.0, help="seconds of idle between samples")
    add_round_trip_args(ap)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    require_at_least(ap, args, samples=1, rounds=2)

    from rich.progress import Progress

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.cores import cpu_facts
    from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions
    from laguna_dflash.runtime.lanes import make_engine
    from laguna_dflash.runtime.llama import Model
    from laguna_dflash.runtime.open_pair import resolve_pair

    pair = resolve_pair(assets.TINY_TARGET, assets.converted_tiny_drafter())
    target, drafter = Model(pair.target.path), Model(pair.drafter.path)
    texts = assets.read_prompts(assets.CODE_PROMPTS)
    prompts = [target.tokenize(texts[i % len(texts)])[:96] for i in range(8)]
    opts = GenerateOptions(n_predict=64, n_max=4)

    def config(threads: int) -> EngineConfig:
        return EngineConfig(n_ctx=1024, n_threads=threads, kv_type="f16", prompt_cache=False)

    engines = {}
    for name, (kind, threads, streams, lanes) in CELLS.items():
        if kind == "separate":
            engines[name] = Engine(target, config=config(threads), drafter_model=drafter, pair=pair)
        else:
            engines[name] = make_engine(target, pair, config(threads), streams, lanes, drafter)

    def run(name: str) -> tuple[float, list[list[int]]]:
        kind, _, streams, _ = CELLS[name]
        if kind == "separate":
            summary, tokens = run_separate([engines[name]], prompts, opts, 1)
        else:
            summary, tokens = in_a_thread(run_batched, engines[name], prompts, opts, streams)
        return summary["aggregate"], tokens

    samples: list[dict] = []
    reference: list[list[int]] | None = None
    unequal = 0
    with tempfile.TemporaryDirectory() as tmp:
        binary = build_round_trip(Path(tmp))
        for name in CELLS:  # one untimed run of each: graphs built, caches warm
            run(name)
        t_start = time.perf_counter()
        with Progress() as progress:
            task = progress.add_task("samples", total=args.samples)
            for _ in range(args.samples):
                before = round_trip_ns(binary, args.rounds)
                rates = {}
                for name in CELLS:
                    rates[name], tokens = run(name)
                    reference = reference or tokens
                    unequal += tokens != reference
                after = round_trip_ns(binary, args.rounds)
                samples.append({"t_s": round(time.perf_counter() - t_start, 2), "round_trip_ns": [before, after],
                                "class": classify(before, after, args.near_ns), "tokens_per_s": rates})
                progress.advance(task)
                time.sleep(args.pause)
    for engine in engines.values():
        engine.close()

    summary = {}
    for cls, rows in by_class(samples).items():
        figures = {name: [s["tokens_per_s"][name] for s in rows] for name in CELLS}
        figures |= {label: [s["tokens_per_s"][a] / s["tokens_per_s"][b] for s in rows]
                    for label, (a, b) in RATIOS.items()}
        summary[cls] = {"samples": len(rows), **{k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                                                 for k, v in figures.items()}}
        print(f"{cls}: {len(rows)} samples")
        for k, v in summary[cls].items():
            if k != "samples":
                print(f"  {k:40s} {v['median']:9.2f} ({v['min']:.2f}-{v['max']:.2f})")
    print(f"outputs unlike the first run's: {unequal} of {len(samples) * len(CELLS)} runs")
    if args.json:
        write_json(args.json, {"command": command_line(__file__, argv), "cpu": cpu_facts(), "near_ns": args.near_ns,
                               "summary": summary, "runs_whose_outputs_differ": unequal, "samples": samples})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
