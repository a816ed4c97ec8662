#!/usr/bin/env python3
"""A/B the CPU flash-attention op of two builds of the libraries, interleaved, at Laguna's head
layouts: the XS 2.1 width (head width 128, 64 query heads on 8 KV heads) and the tiny target's
(32, 24 on 2), over cache lengths and pass widths.

    python -m scripts.bench.bench_attention --b /tmp/kx/lib-p34 --pairs 5 \\
        --json docs/results/kernels/attention-ab.json --png docs/results/kernels/attention-ab.png

One ``ggml_flash_attn_ext`` (F32 queries against an F16 cache, a causal mask as a verify pass
has: row r sees every cell but the last ``rows - 1 - r``) is built once per cell and computed
``--reps`` times (``--reps-long`` past 8k cells); a cell's figure is the median ms of those
computes. Two library directories (``--a``: the installed wheel's by default) are loaded in
alternating worker processes, A, B, A, B, ... (``LLAMA_CPP_LIB_PATH``), ``--pairs`` of each.
Statistic, fixed here before any run: per cell the median over workers with min and max, and
B's median over A's. Each worker also hashes every cell's output: the two builds' outputs are
compared bit for bit (``outputs_equal``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

from scripts.arguments import int_list
from scripts.bench.bench_lib_ab import cells_summary
from scripts.recorded import command_line, write_results

#: name -> (head width, query heads, KV heads)
SHAPES = {"xs": (128, 64, 8), "tiny": (32, 24, 2)}


def cells(args) -> list[tuple[str, int, int, int]]:
    out = []
    for shape in args.shapes:
        for n_kv in (args.xs_contexts if shape == "xs" else args.tiny_contexts):
            for rows in args.rows:
                for threads in args.threads:
                    out.append((shape, n_kv, rows, threads))
    return out


def worker(args) -> dict:
    import numpy as np

    from tests.helpers.kernel_rows import GGML_TYPE_F16, GGML_TYPE_F32, Ggml, _InitParams

    fa = Ggml()
    out = {}
    for shape_name, n_kv, rows, threads in cells(args):
        dk, n_head, n_head_kv = SHAPES[shape_name]
        rng = np.random.default_rng(n_kv + rows)
        q = rng.standard_normal((rows, n_head, dk), dtype=np.float32)
        k = rng.standard_normal((n_head_kv, n_kv, dk), dtype=np.float32).astype(np.float16)
        v = rng.standard_normal((n_head_kv, n_kv, dk), dtype=np.float32).astype(np.float16)
        mask = np.zeros((rows, n_kv), np.float16)
        for r in range(rows):
            if rows - 1 - r:
                mask[r, n_kv - (rows - 1 - r):] = -np.inf
        reps = args.reps_long if n_kv > 8192 else args.reps
        # ggml_graph_compute_with_ctx takes its work buffer from the context at every compute
        mem = 16 * 2**20 + 2 * (q.nbytes + k.nbytes + v.nbytes + mask.nbytes + rows * n_head * dk * 4) + \
            (reps + 1) * 2**18
        ctx = fa.ggml_init(_InitParams(mem, None, False))
        try:
            qt = fa.ggml_new_tensor_4d(ctx, GGML_TYPE_F32, dk, rows, n_head, 1)
            fa.fill(qt, np.ascontiguousarray(q.transpose(1, 0, 2)))
            kt = fa.ggml_new_tensor_4d(ctx, GGML_TYPE_F16, dk, n_kv, n_head_kv, 1)
            fa.fill(kt, k)
            vt = fa.ggml_new_tensor_4d(ctx, GGML_TYPE_F16, dk, n_kv, n_head_kv, 1)
            fa.fill(vt, v)
            mt = fa.ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, rows, 1, 1)
            fa.fill(mt, mask)
            op = fa.ggml_flash_attn_ext(ctx, qt, kt, vt, mt, 1.0 / float(np.sqrt(dk)), 0.0, 0.0)
            graph = fa.ggml_new_graph(ctx)
            fa.ggml_build_forward_expand(graph, op)
            times = []
            for _ in range(reps + 1):  # the first untimed
                t0 = time.perf_counter()
                if fa.ggml_graph_compute_with_ctx(ctx, graph, threads) != 0:
                    raise RuntimeError("ggml_graph_compute failed")
                times.append(time.perf_counter() - t0)
            digest = hashlib.sha256(fa.read(op, (rows, n_head, dk)).tobytes()).hexdigest()[:16]
        finally:
            fa.ggml_free(ctx)
        out[f"{shape_name} n_kv={n_kv} rows={rows} t{threads}"] = {"ms": 1e3 * statistics.median(times[1:]),
                                                                    "sha": digest}
    return out


def summary(trials: dict[str, list[dict]]) -> dict:
    return cells_summary(trials, "ms", "sha")


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(result["cells"])
    ratios = [result["cells"][k]["B/A"] for k in keys]
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(keys) + 1.2))
    ax.barh(range(len(keys)), ratios, color=["tab:green" if r < 1 else "tab:red" for r in ratios])
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_yticks(range(len(keys)), keys, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("B / A, median ms of the attention op (below 1: B faster)")
    ax.set_title(f"flash attention A/B: {result['b']} over {result['a']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, default=None, help="library dir A (default: the installed wheel's)")
    ap.add_argument("--b", type=Path, help="library dir B")
    ap.add_argument("--pairs", type=int, default=5, help="A,B worker pairs, interleaved")
    ap.add_argument("--shapes", type=lambda s: s.split(","), default=["xs", "tiny"], help="of: xs, tiny")
    ap.add_argument("--xs-contexts", type=int_list(8, 1 << 20), default=(1024, 8192, 32768))
    ap.add_argument("--tiny-contexts", type=int_list(8, 1 << 20), default=(256, 1024))
    ap.add_argument("--rows", type=int_list(1, 64), default=(1, 5))
    ap.add_argument("--threads", type=int_list(1, 64), default=(1, 2))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--reps-long", type=int, default=9, help="repetitions past 8k cells")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if any(s not in SHAPES for s in args.shapes):
        ap.error(f"--shapes: expected names among {', '.join(SHAPES)}, found {','.join(args.shapes)}")
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    if args.b is None:
        ap.error("--b: required (the library dir to compare with --a)")
    from rich.console import Console

    from scripts.bench.bench_lib_ab import installed_lib_dir, interleaved_trials, require_libs

    console = Console(stderr=True)
    lib_a = args.a or installed_lib_dir()
    require_libs(ap, {"--a": lib_a, "--b": args.b}, "libggml-cpu.so")
    wargs = ["--shapes", ",".join(args.shapes), "--xs-contexts", ",".join(map(str, args.xs_contexts)),
             "--tiny-contexts", ",".join(map(str, args.tiny_contexts)), "--rows", ",".join(map(str, args.rows)),
             "--threads", ",".join(map(str, args.threads)), "--reps", str(args.reps),
             "--reps-long", str(args.reps_long)]
    trials = interleaved_trials({"A": lib_a, "B": args.b}, args.pairs, wargs, "scripts.bench.bench_attention", console)
    cells_ = summary(trials)
    result = {"command": command_line(__file__, argv), "a": str(lib_a), "b": str(args.b),
              "pairs": args.pairs, "reps": args.reps, "reps_long": args.reps_long, "cells": cells_,
              "outputs_equal": all(c["outputs_equal"] for c in cells_.values())}
    for key, row in cells_.items():
        console.print(f"{key:28s} A {row['A']['median']:9.3f} ms  B {row['B']['median']:9.3f} ms  "
                      f"B/A {row['B/A']:.3f} ({row['B']['min']:.3f}-{row['B']['max']:.3f})"
                      f"{'' if row['outputs_equal'] else '  OUTPUTS DIFFER'}")
    write_results(result, args.json, args.png, plot, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
