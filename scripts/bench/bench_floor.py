#!/usr/bin/env python3
"""laguna-run's plain decoding against the vendored llama.cpp's own C++ decode of the same file.

    scripts/bench/build_peer.sh vendored          # once: llama-bench of the patched tree, outside the repo
    .venv/bin/python -m scripts.bench.bench_floor -t 2 --repeats 7 --json floor.json

Per repetition, in a rotating order: laguna-run plain decoding (the engine, drafter loaded,
n_max 0) of the first ``--prompts`` code prompts, ``-n`` tokens each, one figure = tokens over
generation time; ``llama-bench -p 0 -n N -d D`` with D the prompts' mean length, once with the
engine's own attention settings (its microbatch, flash attention off: the same graph) and once
with llama-bench's defaults (microbatch 512, flash attention auto). The statistic, fixed before
the run: the median over repetitions, spread min/max; ratios of medians. Exit 0 with a message
when llama-bench is not built.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from scripts.recorded import command_line, write_json
from tests.helpers.ik_interop import peer_snapshot, vendored_bin_dir


def llama_bench(bin_dir: Path, target: Path, n: int, depth: int, threads: int, extra: list[str]) -> float:
    cmd = [str(bin_dir / "llama-bench"), "-m", str(target), "-p", "0", "-n", str(n), "-d", str(depth),
           "-t", str(threads), "-r", "1", "-o", "json", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"llama-bench exited with {r.returncode}: {r.stderr.strip().splitlines()[-1:]}")
    return float(json.loads(r.stdout)[0]["avg_ts"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    bin_dir = vendored_bin_dir()
    if bin_dir is None:
        print("bench_floor: the vendored llama-bench is not built (scripts/bench/build_peer.sh vendored); skipped")
        return 0
    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions

    target, drafter = assets.default_pair(None)
    engine = Engine.load(target, drafter, EngineConfig(n_threads=args.threads))
    ub = engine.ctx.params.n_ubatch
    prompts = [engine.tokenize(p) for p in assets.read_prompts(assets.CODE_PROMPTS)[:args.prompts]]
    depth = round(statistics.mean(len(p) for p in prompts))
    engine.generate(prompts[0], GenerateOptions(n_predict=8, n_max=0))

    def ours() -> float:
        n = t = 0
        for p in prompts:
            s = engine.generate(p, GenerateOptions(n_predict=args.n_predict, n_max=0)).stats
            n, t = n + s.n_generated, t + s.t_total
        return n / t

    systems = {
        "laguna-run plain": ours,
        f"llama-bench -ub {ub} -fa 0 (the engine's settings)":
            lambda: llama_bench(bin_dir, target, args.n_predict, depth, args.threads, ["-ub", str(ub), "-fa", "0"]),
        "llama-bench defaults (-ub 512 -fa auto)":
            lambda: llama_bench(bin_dir, target, args.n_predict, depth, args.threads, []),
    }
    names = list(systems)
    samples: dict[str, list[float]] = {k: [] for k in names}
    for r in range(args.repeats):
        for k in names[r % len(names):] + names[:r % len(names)]:
            samples[k].append(systems[k]())
        print(f"repeat {r + 1}/{args.repeats}: " + ", ".join(f"{samples[k][-1]:.0f}" for k in names),
              file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"-t {args.threads}, {len(prompts)} prompts x {args.n_predict} tokens, llama-bench -d {depth}, "
          f"{args.repeats} repetitions; tokens/s median (min, max)")
    for k in names:
        print(f"  {k:55s} {med[k]:7.1f} ({min(samples[k]):.1f}, {max(samples[k]):.1f})")
    for k in names[1:]:
        print(f"  laguna-run / {k}: {med[names[0]] / med[k]:.3f}")
    if args.json:
        write_json(args.json, {"command": command_line(__file__), "threads": args.threads, "depth": depth,
                               "n_ubatch": ub, "samples": samples, "median": med,
                               "peer_snapshot": {"llama.cpp C++ (vendored)": peer_snapshot(bin_dir)}}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
