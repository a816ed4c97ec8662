#!/usr/bin/env python3
"""Where a pass on several threads waits: each graph operation's compute and barrier time, per thread.

ggml's CPU backend runs a graph operation by operation, every thread taking a share of each and
meeting the others at a barrier after it. A thread that finishes its share early spins there, so
a pass on two threads is slower than half of one thread's wherever the shares are uneven (the
split of an operation's rows, one thread slowed by the host) and by a barrier's round trip per
operation. This probe builds `llama-bench` on a copy of the installed wheel's patched llama.cpp
with `op_waits.diff` applied (timestamps around each operation and its barrier, summed per node
and thread, written at exit), runs it at each thread count, and reports per kind of operation
(an op, and for products the weight's type) the milliseconds per graph each thread computed and
waited, and how well the threads' time covered the single thread's.

    python -m scripts.investigate.op_waits -m target.gguf --threads 1,2 --gen 64 --json op-waits.json

Only the graph seen most often is summarised (with `-p 0 -n N`, the one-row decode step). The
build takes the CPU wheel's flags (`build_flags`: ggml's own thread pool, native), so the
instrumented library is this project's kernels plus the timestamps (two `rdtsc` per operation
and thread).
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path

from laguna_dflash.runtime.setup import wheel as bw
from scripts.arguments import int_list
from scripts.recorded import command_line, write_json

DIFF = Path(__file__).with_name("op_waits.diff")
PRODUCTS = ("MUL_MAT", "MUL_MAT_ID")
LONGEST_NODES = 16  # the nodes of longest span each run records


def patched_tree() -> Path:
    return bw.source_tree() / "vendor" / "llama.cpp"


def build(tree: Path, folder: Path) -> Path:
    """llama-bench on an instrumented copy of ``tree``; its path."""
    bench = folder / "build" / "bin" / "llama-bench"
    if bench.exists():
        return bench
    src = folder / "src"
    if not src.exists():
        shutil.copytree(tree, src, symlinks=True)
        subprocess.run(["patch", "-p1", "-d", str(src), "-i", str(DIFF)], check=True)
    # the CPU wheel's flags, and the tools
    subprocess.run(["cmake", "-S", str(src), "-B", str(folder / "build"), "-DCMAKE_BUILD_TYPE=Release",
                    *bw.build_flags(False, bw.DEFAULT_CUDA_ARCH),
                    "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_CURL=OFF"], check=True)
    subprocess.run(["cmake", "--build", str(folder / "build"), "-j", str(os.cpu_count() or 2),
                    "--target", "llama-bench"], check=True)
    return bench


def read_trace(path: Path) -> tuple[float, list[dict]]:
    """The TSC rate and the nodes of the graph run most often."""
    lines = path.read_text().splitlines()
    tsc_hz = float(lines[0].split("\t")[1])
    rows = list(csv.DictReader(lines[1:], delimiter="\t"))
    graphs = {r["graph"]: int(r["graphs"]) for r in rows}
    busiest = max(graphs, key=graphs.get)
    return tsc_hz, [r for r in rows if r["graph"] == busiest]


def kind(row: dict) -> str:
    return f"{row['op']} {row['type']}" if row["op"] in PRODUCTS else row["op"]


def summarise(tsc_hz: float, rows: list[dict], threads: int) -> dict:
    """Per kind, ms per graph: each thread's compute and wait, the uneven share (the larger
    compute less the smaller) and the span (the mean over threads of compute plus wait); and the
    nodes of longest span. The last node meets the graph's closing barrier, outside the timed
    loop: its threads' waits are taken as what each lacks of the slower one's compute."""
    n_graphs = int(rows[0]["graphs"])
    scale = 1e3 / tsc_hz / n_graphs
    last = max(int(r["node"]) for r in rows)
    kinds: dict[str, dict] = defaultdict(lambda: defaultdict(float))
    nodes = []
    for r in rows:
        comp = [int(r[f"comp{i}"]) * scale for i in range(threads)]
        wait = [int(r[f"wait{i}"]) * scale for i in range(threads)]
        if int(r["node"]) == last:
            wait = [max(comp) - c for c in comp]
        nodes.append({"node": int(r["node"]), "name": r["name"], "kind": kind(r), "rows": int(r["ne1"]),
                      "compute": [round(c, 4) for c in comp], "wait": [round(w, 4) for w in wait],
                      "span": round(comp[0] + wait[0], 4)})
        k = kinds[kind(r)]
        k["nodes"] += 1
        for i, (c, w) in enumerate(zip(comp, wait)):
            k[f"compute_{i}"] += c
            k[f"wait_{i}"] += w
        k["uneven"] += max(comp) - min(comp)
        k["span"] += sum(c + w for c, w in zip(comp, wait)) / len(comp)
    out = {name: {key: round(v, 4) for key, v in k.items()} for name, k in kinds.items()}
    return {"graphs": n_graphs, "nodes": len(rows), "kinds": dict(sorted(out.items(), key=lambda kv: -kv[1]["span"])),
            "longest_nodes": sorted(nodes, key=lambda n: -n["span"])[:LONGEST_NODES]}


def run(bench: Path, model: Path, threads: int, args: list[str], trace: Path) -> dict:
    env = dict(os.environ, GGML_OPTRACE=str(trace))
    subprocess.run([str(bench), "-m", str(model), "-t", str(threads), *args], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    tsc_hz, rows = read_trace(trace)
    return summarise(tsc_hz, rows, threads)


def coverage(one: dict, many: dict) -> dict:
    """Per kind, one thread's compute over the threads' span: 2.0 is a perfect split on two."""
    out = {}
    for name, k in many["kinds"].items():
        base = one["kinds"].get(name)
        if base and k["span"] > 0:
            out[name] = round(base["compute_0"] / k["span"], 3)
    return out


def print_run(label: str, result: dict, cover: dict | None) -> None:
    kinds = result["kinds"]
    total = sum(k["span"] for k in kinds.values())
    print(f"\n{label}: {result['graphs']} graphs of {result['nodes']} nodes, {total:.3f} ms a graph in operations")
    print(f"{'kind':28} {'nodes':>5} {'span':>8} {'comp0':>8} {'comp1':>8} {'wait0':>8} {'wait1':>8} {'uneven':>8} {'1t/span':>7}")
    for name, k in kinds.items():
        c = f"{cover[name]:7.2f}" if cover and name in cover else ""
        print(f"{name:28} {int(k['nodes']):5d} {k['span']:8.3f} {k.get('compute_0', 0):8.3f} {k.get('compute_1', 0):8.3f} "
              f"{k.get('wait_0', 0):8.3f} {k.get('wait_1', 0):8.3f} {k['uneven']:8.3f} {c}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", type=Path, required=True, help="target GGUF")
    ap.add_argument("--threads", type=int_list(1, 2), default=(1, 2),
                    help="thread counts, 1 and/or 2 (the trace keeps two threads' times); the first is the base of the coverage")
    ap.add_argument("--gen", type=int, default=64, help="decode steps per repetition (llama-bench -p 0 -n GEN)")
    ap.add_argument("--reps", type=int, default=3, help="llama-bench -r")
    ap.add_argument("--runs", type=int, default=2, help="runs per thread count, taking turns")
    ap.add_argument("--tree", type=Path, help="the patched llama.cpp to instrument (default: the installed series')")
    ap.add_argument("--build-dir", type=Path, default=Path.home() / ".cache/laguna-dflash/op-waits",
                    help="where the instrumented build lives (a folder per source key)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    if not a.model.is_file():
        ap.error(f"--model {a.model}: expected a GGUF file, found none")
    tree = a.tree or patched_tree()
    if not (tree / "ggml/src/ggml-cpu/ggml-cpu.c").is_file():
        ap.error(f"--tree {tree}: expected a llama.cpp source tree, found no ggml/src/ggml-cpu/ggml-cpu.c")
    key = tree.parents[1].parent.name
    bench = build(tree, a.build_dir / key)
    bench_args = ["-p", "0", "-n", str(a.gen), "-r", str(a.reps)]
    runs: dict[str, list[dict]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.runs):
            for t in a.threads:
                runs[str(t)].append(run(bench, a.model, t, bench_args, Path(tmp) / f"t{t}-{i}.tsv"))
    base = str(a.threads[0])
    for t in a.threads:
        for i, r in enumerate(runs[str(t)]):
            cover = coverage(runs[base][i], r) if str(t) != base else None
            if cover is not None:
                r["one_thread_over_span"] = cover
            print_run(f"-t {t}, run {i + 1}", r, cover)
    if a.json:
        write_json(a.json, {"command": command_line(__file__, argv), "model": str(a.model),
                            "source_key": key, "llama_bench": bench_args, "runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
