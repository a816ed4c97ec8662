#!/usr/bin/env python3
"""A/B two builds of the llama.cpp libraries on the batched engine's concurrency workload, interleaved.

bench_lib_ab.py judges a library change by the one-stream engine at fixed depths, where the
batch shape changes only at a sequence's end. The batched engine (``laguna-run serve``) changes
shape far more often: under ``auto`` between plain steps and verify passes, at 4 streams as
sequences join and leave and prompts take turns with decoding passes. This runs the workload of
bench_concurrency.py (``--requests`` greedy completions of 64 tokens on 96-token code prompts,
the bundled pair, ``-t 2``) in alternating worker processes, A, B, A, B, ... (each loads its
libraries through ``LLAMA_CPP_LIB_PATH``), each a fresh engine per cell of ``--streams`` x
``--depths``, so ``auto`` learns from nothing in every worker. Per cell and side: the median
over workers of the aggregate tokens/s, with min and max, and B's median over A's; and whether
every worker's outputs are the same on both sides. Statistic fixed here, before any run.

    python -m scripts.bench.bench_batched_lib_ab --a ~/lib-before --pairs 7 --json ab.json --png ab.png
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

from scripts.arguments import int_list, require_at_least
from scripts.bench.bench_lib_ab import cells_summary, installed_lib_dir, interleaved_trials, require_libs
from scripts.recorded import command_line, write_results


def worker(args) -> dict:
    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.engine import EngineConfig, GenerateOptions
    from laguna_dflash.runtime.lanes import make_engine
    from laguna_dflash.runtime.llama import Model
    from laguna_dflash.runtime.open_pair import resolve_pair
    from scripts.bench.bench_concurrency import in_a_thread, run_batched

    pair = resolve_pair(assets.TINY_TARGET, assets.converted_tiny_drafter())
    cfg = EngineConfig(n_ctx=1024, n_threads=args.threads, kv_type="f16", prompt_cache=False)
    texts = assets.read_prompts(assets.CODE_PROMPTS)
    target, drafter = Model(pair.target.path), Model(pair.drafter.path)
    prompts = [target.tokenize(texts[i % len(texts)])[:96] for i in range(args.requests)]
    out = {}
    for streams in args.streams:
        for depth in args.depths:
            engine = make_engine(target, pair, cfg, streams, min(args.lanes, streams), drafter)
            summary, tokens = in_a_thread(run_batched, engine, prompts, GenerateOptions(n_predict=64, n_max=depth),
                                          streams)
            engine.close()
            out[f"c{streams} d{depth}"] = {"aggregate": summary["aggregate"],
                                           "outputs_sha": hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:12]}
    return out


def summary(trials: dict[str, list[dict]]) -> dict:
    return cells_summary(trials, "aggregate", "outputs_sha")


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["summary"]
    keys = list(rows)
    fig, ax = plt.subplots(figsize=(1.4 * len(keys) + 2, 4))
    for offset, side in ((-0.2, "A"), (0.2, "B")):
        med = [rows[k][side]["median"] for k in keys]
        err = [[m - rows[k][side]["min"] for k, m in zip(keys, med)], [rows[k][side]["max"] - m for k, m in zip(keys, med)]]
        ax.bar([i + offset for i in range(len(keys))], med, 0.4, yerr=err, capsize=3,
               label=f"{side}: {Path(result['lib_' + side.lower()]).name}")
    ax.set_xticks(range(len(keys)), [f"{k}\nB/A {rows[k]['B/A']:.2f}" for k in keys])
    ax.set_ylabel("aggregate tokens/s (median, min-max)")
    ax.set_title(f"batched engine, two library builds, {result['pairs']} interleaved pairs")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, required=False, help="library dir A (the baseline)")
    ap.add_argument("--b", type=Path, default=None, help="library dir B (default: the installed wheel's)")
    ap.add_argument("--pairs", type=int, default=7, help="A,B worker pairs, interleaved")
    ap.add_argument("--streams", type=int_list(1, 64), default=(1, 4))
    ap.add_argument("--depths", type=int_list(0, 15, ("auto",)), default=(0, 4, "auto"))
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lanes", type=int, default=2, help="lanes of the engines of more than one stream")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    require_at_least(ap, args, pairs=1, requests=1, threads=1, lanes=1)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    if args.a is None:
        ap.error("--a is required: the baseline's llama_cpp/lib folder")
    lib_b = args.b or installed_lib_dir()
    require_libs(ap, {"--a": args.a, "--b": lib_b}, "libllama.so")
    wargs = ["--streams", ",".join(map(str, args.streams)), "--depths", ",".join(map(str, args.depths)),
             "--requests", str(args.requests), "--threads", str(args.threads), "--lanes", str(args.lanes)]
    from rich.console import Console

    console = Console(stderr=True)
    t0 = time.time()
    trials = interleaved_trials({"A": args.a, "B": lib_b}, args.pairs, wargs, "scripts.bench.bench_batched_lib_ab",
                                console)
    res = summary(trials)
    for key, row in res.items():
        a, b = row["A"], row["B"]
        console.print(f"{key:10s} A {a['median']:7.1f} [{a['min']:.1f}-{a['max']:.1f}]  "
                      f"B {b['median']:7.1f} [{b['min']:.1f}-{b['max']:.1f}]  B/A {row['B/A']:.3f}  "
                      f"outputs equal: {row['outputs_equal']}")
    result = {"command": command_line(__file__, argv), "lib_a": str(args.a), "lib_b": str(lib_b),
              "pairs": args.pairs, "threads": args.threads, "lanes": args.lanes, "requests": args.requests,
              "seconds": time.time() - t0, "summary": res, "trials": trials}
    write_results(result, args.json, args.png, plot, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
