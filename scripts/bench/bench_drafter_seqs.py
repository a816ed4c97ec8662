#!/usr/bin/env python3
"""The drafter for batched slots: N draft blocks as N decodes of N drafter contexts (what
runtime/batch.py does) against one decode over N sequences of one drafter context (issue 48).

    python -m scripts.bench.bench_drafter_seqs --json docs/results/concurrency/drafter-seqs.json

Both sides decode the block [bonus, MASK * depth] of each of N sequences after ``--context``
injected context rows (random features, the same for both), on one thread; the statistic
(fixed before the run) is the median over ``--reps`` repetitions of the process CPU time of one
round's drafter passes, interleaved, so that other processes on the machine count for neither.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from scripts.arguments import int_list
from scripts.recorded import command_line, write_json


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", type=int_list(1, 64), default=(2, 4, 8))
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    import llama_cpp.llama_cpp as ll

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.llama import Context, ContextParams, Model
    from laguna_dflash.runtime.open_pair import resolve_pair

    pair = resolve_pair(assets.TINY_TARGET, assets.converted_tiny_drafter())
    spec = pair.drafter
    target, drafter = Model(pair.target.path), Model(pair.drafter.path)
    tctx = Context(target, ContextParams(n_ctx=1024, n_threads=1))
    width = len(spec.capture_slots) * target.n_embd
    feats = np.random.default_rng(0).standard_normal((args.context, width)).astype(np.float32)
    block = [1] + [spec.mask_token_id] * args.depth

    def drafter_ctx(n_seq: int) -> Context:
        ctx = Context(drafter, ContextParams(n_ctx=1024 * n_seq, n_batch=512, n_ubatch=128, n_threads=1,
                                             n_seq=n_seq), other=tctx)
        ctx.set_causal(True)
        return ctx

    rows = []
    for n in args.seqs:
        separate = [drafter_ctx(1) for _ in range(n)]
        shared = drafter_ctx(n)
        for c in separate:
            c.decode_embd(feats, np.arange(args.context))
        # the embedding batch's rows are sequence 0's; the others get a copy of its stream
        shared.decode_embd(feats, np.arange(args.context))
        for s in range(1, n):
            ll.llama_memory_seq_cp(ll.llama_get_memory(shared.ptr), 0, s, -1, -1)
        t_sep, t_one = [], []
        for _ in range(args.reps):
            c0 = time.process_time()
            for c in separate:
                c.decode_block(block, args.context, first_output=1)
                c.seq_rm(args.context, -1)
            t_sep.append(time.process_time() - c0)
            c0 = time.process_time()
            shared.decode_seqs([(s, block, args.context, 1) for s in range(n)])
            for s in range(n):
                shared.seq_rm(args.context, -1, s)
            t_one.append(time.process_time() - c0)
        row = {"seqs": n, "separate_ms": 1e3 * statistics.median(t_sep), "one_decode_ms": 1e3 * statistics.median(t_one)}
        rows.append(row)
        print(f"{n} sequences, depth {args.depth}: {n} decodes {row['separate_ms']:.2f} ms CPU, "
              f"one decode {row['one_decode_ms']:.2f} ms")
        for c in separate + [shared]:
            c.close()
    if args.json:
        write_json(args.json, {"command": command_line(__file__, argv), "depth": args.depth,
                               "context": args.context, "reps": args.reps, "rows": rows}, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
