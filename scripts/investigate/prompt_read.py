#!/usr/bin/env python3
"""What the drafter's read of a prompt costs at a pair's widths, beside the prompt's prefill and a plain step.

Until a prompt's rows waited for the first draft (runtime/drafter.py, ``queue_visible``), every
request that could draft paid, right after its prefill, the drafter's read of the prompt's last
window of captured rows; a request that ``auto`` keeps plain now pays nothing for them. This
times that read for prompts of ``--prompts`` random tokens: the target prefills the prompt with
capture on, in parts of ``--n-batch``, the drafter reads each part's visible rows as the
engine's prefill did (``inject_visible``), and one plain step follows; each is timed, ``--reps``
times per prompt length (median, min-max). Pass a pair whose drafter pairs with the target
(``check_pair``). A probe:

    python -m scripts.investigate.prompt_read --target T.gguf --drafter D.gguf --prompts 96,512,2048 --json read.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from scripts.arguments import int_list, require_at_least
from scripts.recorded import command_line, write_json


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, required=True, help="the target GGUF")
    ap.add_argument("--drafter", type=Path, required=True, help="a drafter GGUF that pairs with it")
    ap.add_argument("--prompts", type=int_list(1, 65536), default=(96, 512, 2048),
                    help="comma-separated prompt lengths in tokens")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-batch", type=int, default=512)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    require_at_least(ap, args, reps=1, threads=1, n_batch=16)  # a batch takes a draft block
    for name in ("target", "drafter"):
        if not getattr(args, name).is_file():
            ap.error(f"--{name}: no file {getattr(args, name)}")
    from laguna_dflash.convert.gguf.errors import UserError
    from laguna_dflash.runtime.open_pair import resolve_pair

    try:  # the files and the pair, read in Python before anything loads
        pair = resolve_pair(args.target, args.drafter)
    except UserError as e:
        ap.error(str(e))

    import numpy as np

    from laguna_dflash.runtime.drafter import Drafter
    from laguna_dflash.runtime.llama import Context, ContextParams, Model

    rng = np.random.default_rng(0)
    results = {}
    with Model(pair.target.path) as model:
        params = ContextParams(n_ctx=max(args.prompts) + 16, n_batch=args.n_batch, n_ubatch=args.n_batch,
                               n_threads=args.threads, kv_type="f16")
        with Context(model, params) as ctx, Drafter(pair.drafter.path, ctx, n_threads=args.threads,
                                                     n_batch=args.n_batch, spec=pair.drafter) as drafter:
            drafter.enable_capture()
            for n in args.prompts:
                tokens = [int(t) for t in rng.integers(300, model.n_vocab, n)]
                times = {"prefill": [], "read": [], "step": []}
                for _ in range(args.reps):
                    ctx.clear()
                    drafter.reset()
                    prefill = read = 0.0
                    for i0 in range(0, n, args.n_batch):
                        part = tokens[i0:i0 + args.n_batch]
                        t0 = time.perf_counter()
                        ctx.decode(part, np.arange(i0, i0 + len(part)), logits="last")
                        features = drafter.captured_features()
                        t1 = time.perf_counter()
                        drafter.inject_visible(features, i0, n)
                        t2 = time.perf_counter()
                        prefill, read = prefill + t1 - t0, read + t2 - t1
                    rows_read = drafter.ctx.pos_max() - drafter.ctx.pos_min() + 1  # what its cache holds
                    t0 = time.perf_counter()
                    ctx.step(tokens[-1], n)
                    step = time.perf_counter() - t0
                    for key, value in (("prefill", prefill), ("read", read), ("step", step)):
                        times[key].append(1e3 * value)
                row = {key: {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v)}
                       for key, v in times.items()}
                med = {key: row[key]["median_ms"] for key in row}
                row.update(rows_read=rows_read, read_over_prefill=med["read"] / med["prefill"],
                           read_in_plain_steps=med["read"] / med["step"])
                results[str(n)] = row
                print(f"prompt {n:6d}: prefill {med['prefill']:9.1f} ms, drafter's read of {rows_read} rows "
                      f"{med['read']:8.1f} ms ({row['read_over_prefill']:.3f} of the prefill, "
                      f"{row['read_in_plain_steps']:.1f} plain steps of {med['step']:.1f} ms)", flush=True)
    if args.json:
        write_json(args.json, {"command": command_line(__file__, argv), "threads": args.threads,
                               "n_batch": args.n_batch, "reps": args.reps, "target": args.target.name,
                               "drafter": args.drafter.name, "prompts": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
