#!/usr/bin/env python3
"""A/B the CPU cost of two builds of the llama.cpp libraries on the demo pair, interleaved.

A kernel patch is judged by what it costs the engine: plain decoding (one-row steps) and
speculative rounds (a drafter pass plus a verify of k+1 rows). Two library directories (each
holding libllama.so and libggml*.so; ``--a`` defaults to the installed wheel's) are loaded in
alternating worker processes, A, B, A, B, ... (``LLAMA_CPP_LIB_PATH``); each worker generates
greedily on the same prompts with plain decoding and at each ``--n-max``, per thread count.
Per worker and setting it reports ms per round (a plain step at n_max 0), the verify part of a
round and the process CPU time of the generations (with one thread the steadier measure on a
shared machine). The summary is the median over workers, with min and max, and B's median over
A's; the statistic is fixed here, before any run.

    python -m scripts.bench.bench_lib_ab --b /work/kbuild/build/bin --pairs 6 --json ab.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scripts.recorded import command_line, write_json


def installed_lib_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    return Path(spec.origin).parent / "lib"


def worker(args) -> dict:
    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions
    from laguna_dflash.runtime.llama import Model

    prompts = assets.read_prompts(assets.CODE_PROMPTS)[: args.prompts]
    drafter = assets.converted_tiny_drafter("q8_0")
    out = {}
    with Model(assets.TINY_TARGET) as target:
        for threads in args.threads:
            with Engine(target, drafter, EngineConfig(n_ctx=2048, n_threads=threads)) as eng:
                eng.generate(prompts[0], GenerateOptions(n_predict=16, n_max=0))  # warm caches and graphs
                for depth in [0, *args.n_max]:
                    total = verify = cpu = 0.0
                    rounds = tokens = 0
                    outputs = []
                    for p in prompts:
                        c0 = time.process_time()
                        r = eng.generate(p, GenerateOptions(n_predict=args.n_predict, n_max=depth))
                        # CPU time of the whole call, prefill included: on a shared machine it
                        # tracks the work done where wall time tracks the neighbours' load
                        cpu += time.process_time() - c0
                        total += r.stats.t_total
                        verify += r.stats.t_verify
                        rounds += r.stats.rounds
                        tokens += r.stats.n_generated
                        outputs.append(r.tokens)
                    out[f"t{threads}/n_max{depth}"] = {
                        "ms_per_round": 1e3 * total / rounds, "ms_verify_per_round": 1e3 * verify / rounds,
                        "cpu_s": cpu,
                        "tokens_per_s": tokens / total, "rounds": rounds, "tokens": tokens,
                        "outputs_sha": hashlib.sha256(json.dumps(outputs).encode()).hexdigest()[:12]}
    return out


def run_worker(lib: Path, argv: list[str], module: str = "scripts.bench.bench_lib_ab") -> dict:
    """``module --worker argv`` in a process of its own over the libraries in ``lib``; its last
    line of output, as JSON (bench_attention's workers run here too)."""
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(lib))
    r = subprocess.run([sys.executable, "-m", module, "--worker", *argv], env=env,
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    if r.returncode != 0:
        raise RuntimeError(f"worker with {lib} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def summary(trials: dict[str, list[dict]]) -> dict:
    keys = trials["A"][0].keys()
    res = {}
    for k in keys:
        row = {}
        for side in ("A", "B"):
            for metric in ("ms_per_round", "ms_verify_per_round", "tokens_per_s", "cpu_s"):
                v = [t[k][metric] for t in trials[side]]
                row[f"{side}_{metric}"] = {"median": statistics.median(v), "min": min(v), "max": max(v)}
        row["B/A ms_per_round"] = row["B_ms_per_round"]["median"] / row["A_ms_per_round"]["median"]
        row["B/A ms_verify_per_round"] = (row["B_ms_verify_per_round"]["median"] /
                                          row["A_ms_verify_per_round"]["median"])
        row["B/A cpu_s"] = row["B_cpu_s"]["median"] / row["A_cpu_s"]["median"]
        res[k] = row
    return res


def require_libs(ap: argparse.ArgumentParser, libs: dict[str, Path], name: str) -> None:
    """Refuse, in argparse's one line, a library folder (by its flag) that does not hold ``name``."""
    for flag, lib in libs.items():
        if not (lib / name).is_file():
            ap.error(f"{flag}: no {name} in {lib}")


def interleaved_trials(libs: dict[str, Path], pairs: int, wargs: list[str], module: str, console) -> dict[str, list[dict]]:
    """``pairs`` rounds of one ``module`` worker per side (``libs``: side -> library folder, in
    the order they take turns), a progress bar on ``console``: per side, each worker's result."""
    from rich.progress import Progress

    trials: dict[str, list[dict]] = {side: [] for side in libs}
    with Progress(console=console) as progress:
        task = progress.add_task("workers", total=len(libs) * pairs)
        for _ in range(pairs):
            for side, lib in libs.items():
                trials[side].append(run_worker(lib, wargs, module))
                progress.advance(task)
    return trials


def cells_summary(trials: dict[str, list[dict]], value: str, digest: str) -> dict:
    """Per cell of interleaved A and B workers (each worker: {cell: {value: .., digest: ..}}): each
    side's median, min, max and per-worker ``value``, B's median over A's, and whether every worker
    on both sides gave the same ``digest``."""
    res = {}
    for key in trials["A"][0]:
        row = {}
        for side in ("A", "B"):
            v = [t[key][value] for t in trials[side]]
            row[side] = {"median": statistics.median(v), "min": min(v), "max": max(v), "per_worker": v}
        row["B/A"] = row["B"]["median"] / row["A"]["median"]
        row["outputs_equal"] = len({t[key][digest] for side in ("A", "B") for t in trials[side]}) == 1
        res[key] = row
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, default=None, help="library dir A (default: the installed wheel's)")
    ap.add_argument("--b", type=Path, required=False, help="library dir B")
    ap.add_argument("--pairs", type=int, default=6, help="A,B worker pairs, interleaved")
    ap.add_argument("--threads", default="1,2", help="thread counts, comma separated")
    ap.add_argument("--n-max", default="4", help="speculative depths besides plain decoding")
    ap.add_argument("--prompts", type=int, default=5, help="first N prompts of runtime/data/prompts/code.txt")
    ap.add_argument("--n-predict", type=int, default=96)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.threads = [int(x) for x in str(args.threads).split(",")]
    args.n_max = [int(x) for x in str(args.n_max).split(",") if x]
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    if args.b is None:
        ap.error("--b is required")
    lib_a = args.a or installed_lib_dir()
    wargs = ["--threads", ",".join(map(str, args.threads)), "--n-max", ",".join(map(str, args.n_max)),
             "--prompts", str(args.prompts), "--n-predict", str(args.n_predict)]
    trials: dict[str, list[dict]] = {"A": [], "B": []}
    t0 = time.time()
    for i in range(args.pairs):
        for side, lib in (("A", lib_a), ("B", args.b)):
            trials[side].append(run_worker(lib, wargs))
        print(f"pair {i + 1}/{args.pairs} done ({time.time() - t0:.0f} s)", flush=True)
    res = summary(trials)
    for k, row in res.items():
        a, b = row["A_ms_per_round"], row["B_ms_per_round"]
        print(f"{k:14s} ms/round A {a['median']:.3f} [{a['min']:.3f}-{a['max']:.3f}]  "
              f"B {b['median']:.3f} [{b['min']:.3f}-{b['max']:.3f}]  B/A {row['B/A ms_per_round']:.3f}  "
              f"(verify B/A {row['B/A ms_verify_per_round']:.3f}; CPU s A {row['A_cpu_s']['median']:.2f} "
              f"B {row['B_cpu_s']['median']:.2f}, B/A {row['B/A cpu_s']:.3f})")
    if args.json:
        write_json(args.json, {"command": command_line(__file__, argv), "lib_a": str(lib_a),
                               "lib_b": str(args.b), "load_avg": os.getloadavg(),
                               "summary": res, "trials": trials}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
