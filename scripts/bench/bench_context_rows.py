#!/usr/bin/env python3
"""What a verify pass costs against a plain step as the context grows, on any target GGUF
(issue 32, item 3: the XS-width Q4_K_M target, whose random drafter accepts nothing, so its
speedup is read from costs instead).

    python -m scripts.bench.bench_context_rows -m ~/.cache/laguna-dflash/costmodel/*/laguna-xs-shapes-L5-Q4_K_M.gguf \\
        --json docs/results/long-context/long-context-xs-rows.json

The cache is filled with seeded random tokens, in 512-token batches, up to each context of
``--contexts`` in turn (timed: the prefill's tokens/s); at each context, passes of 1 row (a plain
step) and of k + 1 rows (the verify pass of depth k, for each k of ``--depths``) start at that
position and are rolled back, interleaved, ``--repeats`` rounds after one untimed round (graph
builds). Statistic (fixed before the run): per context and row count the median pass time with
min-max, and its ratio to the median one-row pass. A depth's speedup follows as
E(k) x t(1 row) / (t(k + 1 rows) + draft time) for a drafter accepting E(k) - 1 drafts per round
on average; printed: the break-even E(k) (draft time left out, so a lower bound).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from scripts.arguments import int_list
from scripts.recorded import command_line, write_json


def main(argv=None) -> int:
    from rich.progress import Progress

    from laguna_dflash.runtime.llama import Context, ContextParams, Model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=Path, required=True, help="target GGUF")
    ap.add_argument("--contexts", type=int_list(1, 1 << 20), default=(1024, 8192, 16384, 32768))
    ap.add_argument("--depths", type=int_list(1, 15), default=(2, 4, 8), help="verify passes of depth + 1 rows")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-type", default="f16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if not args.model.is_file():
        print(f"bench_context_rows: -m: expected a target GGUF, found no file at {args.model}", file=sys.stderr)
        return 2
    contexts = list(args.contexts)
    rows = [1] + [d + 1 for d in args.depths]

    import numpy as np

    model = Model(args.model)
    rng = np.random.default_rng(args.seed)
    # ids every Laguna vocabulary has (the bundled pairs' hold 4096), none of them special
    tokens = rng.integers(100, 4000, max(contexts) + max(rows)).tolist()
    ctx = Context(model, ContextParams(n_ctx=max(contexts) + max(rows) + 64, n_batch=512, kv_type=args.kv_type,
                                       n_threads=args.threads))
    table, filled = [], 0
    with Progress() as prog:
        task = prog.add_task("contexts", total=len(contexts) * (args.repeats + 1) * len(rows))
        for L in contexts:
            t0 = time.perf_counter()
            for i0 in range(filled, L, 512):
                n = min(512, L - i0)
                ctx.decode(tokens[i0:i0 + n], np.arange(i0, i0 + n), logits="last")
            prefill = (L - filled) / (time.perf_counter() - t0)
            filled = L
            times: dict[int, list[float]] = {r: [] for r in rows}
            for rep in range(args.repeats + 1):
                for r in (rows if rep % 2 == 0 else rows[::-1]):
                    t0 = time.perf_counter()
                    ctx.decode_block(tokens[L:L + r], L)
                    dt = time.perf_counter() - t0
                    ctx.seq_rm(L, -1)
                    if rep:
                        times[r].append(dt)
                    prog.advance(task)
            one = statistics.median(times[1])
            table.append({"context": L, "prefill_tokens_per_s": prefill, "rows": {
                r: {"median_ms": 1e3 * statistics.median(ts), "min_ms": 1e3 * min(ts), "max_ms": 1e3 * max(ts),
                    "over_one_row": statistics.median(ts) / one} for r, ts in times.items()}})
    ctx.close()
    model.close()

    print(f"{args.model.name}; {args.repeats} interleaved repetitions; median ms per pass (x one row) [min-max]")
    print("context  prefill tok/s  " + "  ".join(f"{r:>2} rows{'':14}" for r in rows))
    for row in table:
        cells = [f"{v['median_ms']:7.2f} ({v['over_one_row']:.2f}) [{v['min_ms']:.1f}-{v['max_ms']:.1f}]"
                 for v in row["rows"].values()]
        print(f"{row['context']:>7}  {row['prefill_tokens_per_s']:12.0f}  " + "  ".join(cells))
    print("break-even tokens per round (verify only): " + "; ".join(
        f"{row['context']}: " + ", ".join(f"d{r - 1} {row['rows'][r]['over_one_row']:.2f}" for r in rows[1:])
        for row in table))
    if args.json:
        write_json(args.json, {"command": command_line(__file__, argv), "model": args.model.name,
                               "threads": args.threads, "kv_type": args.kv_type, "repeats": args.repeats,
                               "table": table}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
