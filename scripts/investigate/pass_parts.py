#!/usr/bin/env python3
"""Where a pass of several sequences spends what a one-row pass does not: the same target
context times, interleaved, a one-row pass; ``--rows`` rows of one sequence with logits on the
last row only; the same with logits on every row; and ``--rows`` sequences of one row each (a
batched engine's plain decoding pass).

    X=~/.cache/laguna-dflash/costmodel/78a62070aa
    python -m scripts.investigate.pass_parts --target $X/laguna-xs-shapes-L5-Q4_K_M.gguf --json parts.json

The differences between neighbouring cells split the multi-sequence pass's cost over one row into
the body's added rows (weights read for each row's experts, products of more rows), the head's
added logit rows, and the sequences' own KV streams. Each sequence first takes a prompt of
``--context`` tokens, so attention has cells to read; the context is the batched engine's
(F16 cache, a stream per sequence, flash attention as the engine sets it). Statistic: per cell
the median wall time of ``--reps`` interleaved passes, with min and max.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from scripts.recorded import command_line, write_json

CELLS = ("one row", "one sequence, logits on its last row", "one sequence, logits on every row",
         "one row of each sequence")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, required=True, help="target GGUF")
    ap.add_argument("--rows", type=int, default=4, help="rows of the multi-row cells (and sequences)")
    ap.add_argument("--context", type=int, default=96, help="prompt tokens each sequence holds first")
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.rows < 2 or args.context < 1 or args.reps < 1:
        ap.error("--rows must be at least 2, --context and --reps at least 1")

    from laguna_dflash.runtime.engine import EngineConfig, target_flash_attn
    from laguna_dflash.runtime.llama import Context, ContextParams, Model

    cfg = EngineConfig(n_threads=args.threads, kv_type="f16", prompt_cache=False)
    n = args.rows
    per_seq = args.context + (2 * n + 1) * (args.reps + 1) + 8  # sequence 1 takes 2n + 1 rows a round
    params = ContextParams(n_ctx=per_seq * n, n_batch=max(512, n), n_ubatch=max(512, n), kv_type="f16",
                           n_threads=args.threads, swa_full=True, n_seq=n, flash_attn=target_flash_attn(cfg))
    times: dict[str, list[float]] = {c: [] for c in CELLS}
    with Model(args.target) as target, Context(target, params) as ctx:
        vocab = target.n_vocab
        pos = [0] * n

        def tokens(k: int, salt: int) -> list[int]:
            return [(1000 + 7919 * (salt + i)) % vocab for i in range(k)]

        def take(s: int, k: int) -> int:
            """The next k positions of sequence s: the first of them."""
            pos[s] += k
            return pos[s] - k

        for s in range(n):  # each sequence's prompt, in parts a one-slot engine would take
            for p0 in range(0, args.context, 32):
                k = min(32, args.context - p0)
                ctx.decode_seqs([(s, tokens(k, p0), take(s, k), k - 1)])

        def timed(parts: list[tuple[int, list[int], int, int]]) -> float:
            t = time.perf_counter()
            ctx.decode_seqs(parts)
            return time.perf_counter() - t

        for rep in range(args.reps + 1):  # the first round warms each shape and is dropped
            got = {
                CELLS[0]: timed([(0, tokens(1, rep), take(0, 1), 0)]),
                CELLS[1]: timed([(1, tokens(n, rep), take(1, n), n - 1)]),
                CELLS[2]: timed([(1, tokens(n, rep + 1), take(1, n), 0)]),
                CELLS[3]: timed([(s, tokens(1, rep + s), take(s, 1), 0) for s in range(n)]),
            }
            if rep:
                for c, v in got.items():
                    times[c].append(v)

    one = statistics.median(times[CELLS[0]])
    table = {}
    for c in CELLS:
        v = times[c]
        m = statistics.median(v)
        table[c] = {"median_ms": 1000 * m, "min_ms": 1000 * min(v), "max_ms": 1000 * max(v), "x_one_row": m / one}
        print(f"{c:38s} {1000 * m:8.2f} ms  x{m / one:.2f}  [{1000 * min(v):.2f}-{1000 * max(v):.2f}]")
    if args.json:
        write_json(args.json, {"command": command_line(__file__, argv), "target": args.target.name,
                               "rows": n, "context": args.context, "reps": args.reps, "threads": args.threads,
                               "cells": table})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
