#!/usr/bin/env python3
"""A/B two builds of the llama.cpp libraries pass by pass, in lockstep, over many pairs of processes:
resolves a few percent on a VM whose pace swings between processes seconds apart.

bench_lib_ab.py and bench_batched_lib_ab.py alternate whole worker processes, A, B, A, B, each a
second or more; on a shared 2-core VM their ratios spread from about 0.6 to 2.0, and a 5% change
of a kernel is lost (docs/results/kernels, section 21). Here a pair of worker processes, one per
build (``LLAMA_CPP_LIB_PATH``), each with a context on the same target after the same prompt,
take turns one burst of decoding passes at a time: A's burst, B's, B's, A's, ... (the order
alternates so that neither side always runs second); only one side computes at any moment, the
other waits on its pipe. A pass of ``k`` rows is one sequence's ``k`` tokens after the prompt,
logits on every row (a verify pass; ``k = 1`` a plain step), then the same cells are removed, so
every pass of a row count computes the same thing. A row spec ``k1:k2`` cycles through passes of
k1 and k2 rows, as ``auto`` alternates plain steps and verifies, so that what a change of batch
shape costs (a graph rebuilt) is in its time. A burst is ``--burst`` cycles (a cycle is one pass
of each of the spec's row counts), of which the first is not timed (the side's threads wake and
its data return to the caches); a burst's time is the median of its cycles' times. A process can
keep its own pace for its life (in probes the same library ran 0.81x-1.16x itself in the other
process of a pair, turn after turn; the cause was not found), so the run takes ``--pairs`` fresh
pairs in turn.

Per pair and row spec, after ``--warmup`` untimed turns, the median of the per-turn ratios
B/A (a turn's two bursts run milliseconds apart and share the machine's pace); per row spec,
the median over the pairs of those medians, their range, each side's median ms a cycle (a pass,
for a single row count), and whether every pass of both builds had the same logits bits.
Statistic fixed here, before any run. Beside it, since the start order of a pair's processes
was found to move a pass about 5% (docs/results/kernels, section 29): the median over couples
of consecutive pairs, one of each start order, of the geometric mean of their two medians.

    python -m scripts.bench.bench_pass_ab --a ~/lib-before --rows 1,2,5,20,1:5 --pairs 12 --json ab.json --png ab.png
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scripts.arguments import require_at_least
from scripts.bench.bench_lib_ab import installed_lib_dir, require_libs
from scripts.recorded import command_line, write_results

PROMPT_TOKENS = 96
MAX_ROWS = 64


def row_specs(text: str) -> tuple[tuple[int, ...], ...]:
    """``1,2,5,20,1:5``: passes of 1, 2, 5 and 20 rows, and passes of 1 and 5 rows in turn."""
    try:
        specs = tuple(tuple(int(k) for k in item.split(":")) for item in text.split(","))
    except ValueError:
        specs = ()
    if not specs or any(not 1 <= k <= MAX_ROWS for spec in specs for k in spec):
        raise argparse.ArgumentTypeError(f"row counts in 1..{MAX_ROWS}, comma-separated, a cycle of them "
                                         f"joined by ':'; found {text!r}")
    return specs


def spec_name(spec: tuple[int, ...]) -> str:
    return ":".join(map(str, spec))


def serve(args) -> None:
    """The worker: one context after the prompt; per line ``spec burst`` from the parent, the
    burst's cycles timed, answered with the median cycle's ms and the digests of its passes' logits
    (one per place in the cycle where the burst's passes there agree)."""
    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.llama import Context, ContextParams, Model

    model = Model(args.target or assets.TINY_TARGET)
    # flash attention, as the engine runs a target on the CPU (runtime/engine.target_flash_attn)
    ctx = Context(model, ContextParams(n_ctx=1024, n_threads=args.threads, kv_type="f16", flash_attn=True))
    tokens = model.tokenize(assets.read_prompts(assets.CODE_PROMPTS)[0])[:PROMPT_TOKENS]
    ctx.decode_block(tokens, 0, len(tokens) - 1)
    pos = len(tokens)
    print("ready", flush=True)
    for line in sys.stdin:
        spec, burst = line.split()
        cycle = [int(k) for k in spec.split(":")]
        ms = []
        digests = [set() for _ in cycle]  # each place of the cycle: its passes' logits
        for _ in range(int(burst)):
            cycle_ms = 0.0
            for place, k in enumerate(cycle):
                t0 = time.perf_counter()
                ctx.decode_block(tokens[:k], pos, 0)
                cycle_ms += 1e3 * (time.perf_counter() - t0)
                digests[place].add(hashlib.sha256(ctx.logits_block(k).tobytes()).hexdigest()[:12])
                ctx.seq_rm(pos)
            ms.append(cycle_ms)
        # one digest a place where every pass there had the same logits, else all of them (summary
        # reads a comma as logits that differ)
        sha = ":".join(",".join(sorted(d)) for d in digests)
        # the first cycle of a burst wakes the threads and refills the caches the other side used
        print(json.dumps({"ms": statistics.median(ms[1:]) if len(ms) > 1 else ms[0], "logits_sha": sha}), flush=True)


class Worker:
    def __init__(self, lib: Path, wargs: list[str]) -> None:
        env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(lib))
        self.proc = subprocess.Popen([sys.executable, "-m", "scripts.bench.bench_pass_ab", "--worker", *wargs],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=Path(__file__).resolve().parents[2])
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"worker with {lib} did not start (exit code {self.proc.wait()})")

    def run(self, spec: tuple[int, ...], burst: int) -> dict:
        self.proc.stdin.write(f"{spec_name(spec)} {burst}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker died (exit code {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def summary(pairs: list[dict[str, list[dict]]]) -> dict:
    """Per row spec: the median over pairs of each pair's median per-turn B/A, with their range;
    each side's median ms per burst over every turn; whether every pass had the same logits.

    And by couples of pairs: pair 2k starts A's process first, pair 2k+1 B's, and in the runs of
    docs/results/kernels sections 28-29 the process started second ran about 5% faster for its
    pair's life, so per-pair ratios fall in two clusters and their median lands between them.
    A couple's ratio, the geometric mean of its two pairs' medians, has one of each start order;
    the median over the couples and their range are reported beside (none for a single pair)."""
    res = {}
    for spec in pairs[0]:
        per_pair = [statistics.median(t["B"]["ms"] / t["A"]["ms"] for t in p[spec]) for p in pairs]
        per_couple = [math.sqrt(per_pair[i] * per_pair[i + 1]) for i in range(0, len(per_pair) - 1, 2)]
        a = [t["A"]["ms"] for p in pairs for t in p[spec]]
        b = [t["B"]["ms"] for p in pairs for t in p[spec]]
        shas = {t[side]["logits_sha"] for p in pairs for t in p[spec] for side in "AB"}
        res[spec] = {"A_ms": statistics.median(a), "B_ms": statistics.median(b),
                     "B/A": statistics.median(per_pair), "B/A min": min(per_pair), "B/A max": max(per_pair),
                     "B/A per pair": per_pair,
                     "B/A by couples": statistics.median(per_couple) if per_couple else None,
                     "B/A couples min": min(per_couple, default=None),
                     "B/A couples max": max(per_couple, default=None),
                     "logits_equal": len(shas) == 1 and "," not in next(iter(shas))}
    return res


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["summary"]
    keys = list(rows)
    fig, ax = plt.subplots(figsize=(1.2 * len(keys) + 3, 4))
    for i, k in enumerate(keys):
        ax.scatter([i] * len(rows[k]["B/A per pair"]), rows[k]["B/A per pair"], s=12, color="tab:blue", alpha=0.5)
        ax.hlines(rows[k]["B/A"], i - 0.3, i + 0.3, color="black")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(keys)), [f"{k} rows\nA {rows[k]['A_ms']:.2f} ms" for k in keys])
    ax.set_ylabel("B/A: each pair's median (dots), their median (bar)")
    ax.set_title(f"{Path(result['lib_b']).name} over {Path(result['lib_a']).name}: {result['pairs']} pairs x "
                 f"{result['turns']} turns, {result['threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, help="library dir A (the baseline)")
    ap.add_argument("--b", type=Path, default=None, help="library dir B (default: the installed wheel's)")
    ap.add_argument("--target", type=Path, help="target GGUF (default: the bundled tiny target)")
    ap.add_argument("--rows", type=row_specs, default=((1,), (2,), (5,), (20,)),
                    help="rows of a pass, comma separated; k1:k2 passes of k1 and k2 rows in turn")
    ap.add_argument("--pairs", type=int, default=12, help="pairs of worker processes, one after another")
    ap.add_argument("--turns", type=int, default=40, help="timed turns (one burst of each side) a row spec and pair")
    ap.add_argument("--burst", type=int, default=5,
                    help="cycles a burst (a pass of each row count of a spec), the first untimed")
    ap.add_argument("--warmup", type=int, default=4, help="untimed turns before them")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    require_at_least(ap, args, pairs=1, turns=1, burst=1, warmup=0, threads=1)
    if args.target is not None and not args.worker:
        from laguna_dflash.runtime.llama import LlamaError, check_gguf_file

        try:  # here, not in a worker's traceback
            check_gguf_file(args.target)
        except LlamaError as e:
            ap.error(f"--target: {e}")
    wargs = ["--threads", str(args.threads), *(["--target", str(args.target)] if args.target else [])]
    if args.worker:
        serve(args)
        return 0
    if args.a is None:
        ap.error("--a is required: the baseline's llama_cpp/lib folder")
    lib_b = args.b or installed_lib_dir()
    require_libs(ap, {"--a": args.a, "--b": lib_b}, "libllama.so")
    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=True)
    t0 = time.time()
    pairs: list[dict[str, list[dict]]] = []
    with Progress(console=console) as progress:
        task = progress.add_task("turns", total=args.pairs * len(args.rows) * (args.warmup + args.turns))
        for pair in range(args.pairs):
            start = ("A", "B") if pair % 2 == 0 else ("B", "A")
            sides = {side: Worker({"A": args.a, "B": lib_b}[side], wargs) for side in start}
            turns: dict[str, list[dict]] = {}
            try:
                for spec in args.rows:
                    turns[spec_name(spec)] = []
                    for i in range(args.warmup + args.turns):
                        order = "AB" if i % 2 == 0 else "BA"
                        turn = {side: sides[side].run(spec, args.burst) for side in order}
                        if i >= args.warmup:
                            turns[spec_name(spec)].append(turn)
                        progress.advance(task)
            finally:
                for w in sides.values():
                    w.close()
            pairs.append(turns)
    res = summary(pairs)
    for spec, row in res.items():
        console.print(f"{spec:>4s} rows  A {row['A_ms']:7.3f} ms  B {row['B_ms']:7.3f} ms  "
                      f"B/A {row['B/A']:.3f} [{row['B/A min']:.3f}-{row['B/A max']:.3f}]  "
                      + (f"by couples {row['B/A by couples']:.3f} [{row['B/A couples min']:.3f}-"
                         f"{row['B/A couples max']:.3f}]  " if row["B/A by couples"] is not None else "") +
                      f"logits equal: {row['logits_equal']}")
    result = {"command": command_line(__file__, argv), "lib_a": str(args.a), "lib_b": str(lib_b),
              "target": str(args.target or "bundled tiny target"), "threads": args.threads, "pairs": args.pairs,
              "turns": args.turns, "burst": args.burst, "warmup": args.warmup, "prompt_tokens": PROMPT_TOKENS,
              "seconds": time.time() - t0, "summary": res,
              "turns_ms": [{k: [[t["A"]["ms"], t["B"]["ms"]] for t in v] for k, v in p.items()} for p in pairs]}
    write_results(result, args.json, args.png, plot, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
