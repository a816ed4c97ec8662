#!/usr/bin/env python3
"""What a change of batch shape costs the target's decode, by the shape before and after.

The tiny target alone in one context (no drafter, no engine): after a 96-token prompt, cycles
of two 5-row verify passes (one row kept after each) and eight one-row steps, as a drafting
round and the plain steps after it. Each decode is timed and filed under (rows of the pass
before, rows of this one): a pass after one of another shape rebuilds its graph in upstream
llama.cpp. Median ms per kind over ``--repeats`` runs of the cycles, and the extra of a changed
shape over the same shape settled. Run it under two builds with ``LLAMA_CPP_LIB_PATH``:

    python -m scripts.investigate.shape_switch --json after.json
    LLAMA_CPP_LIB_PATH=~/lib-before python -m scripts.investigate.shape_switch --json before.json
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from pathlib import Path

from scripts.arguments import require_at_least
from scripts.recorded import command_line, write_json


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    require_at_least(ap, args, repeats=1, threads=1)

    import numpy as np

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.llama import Context, ContextParams, Model

    times: dict[tuple[int, int], list[float]] = collections.defaultdict(list)
    with Model(assets.TINY_TARGET) as model, \
            Context(model, ContextParams(n_ctx=1024, n_threads=args.threads, kv_type="f16")) as ctx:
        prompt = model.tokenize(assets.read_prompts(assets.CODE_PROMPTS)[0])[:96]
        for _ in range(args.repeats):
            ctx.clear()
            ctx.decode(prompt, np.arange(len(prompt)), logits="last")
            pos, before = len(prompt), len(prompt)
            while pos < 900:
                for rows in (5, 5, 1, 1, 1, 1, 1, 1, 1, 1):
                    t0 = time.perf_counter()
                    if rows == 1:
                        ctx.step(105, pos)
                    else:
                        ctx.decode_block([100, 101, 102, 103, 104], pos)
                        ctx.seq_rm(pos + 1, -1)
                    times[(before, rows)].append(time.perf_counter() - t0)
                    pos, before = pos + 1, rows
    med = {f"{a}->{b} rows": 1e3 * statistics.median(v) for (a, b), v in sorted(times.items()) if a in (1, 5)}
    extra = {"1-row step after a 5-row pass": med["5->1 rows"] - med["1->1 rows"],
             "5-row pass after a 1-row step": med["1->5 rows"] - med["5->5 rows"]}
    for k, v in med.items():
        print(f"{k:12s} {v:.3f} ms")
    for k, v in extra.items():
        print(f"extra of a {k}: {v:.3f} ms")
    if args.json:
        write_json(args.json, {"command": command_line(__file__, argv), "threads": args.threads,
                               "repeats": args.repeats, "median_ms": med, "extra_ms": extra,
                               "passes": {f"{a}->{b}": len(v) for (a, b), v in times.items()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
