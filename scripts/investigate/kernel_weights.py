#!/usr/bin/env python3
"""Weight matmuls of the ggml CPU backend at XS widths: row invariance and time per row count.

The target's weight matmuls (``ggml_mul_mat`` on a quantized weight, ``ggml_mul_mat_id`` on the
experts) run in the installed wheel's CPU backend exactly as llama.cpp runs them: the weight
lives in the buffer llama.cpp would put it in (``CPU_REPACK`` when the backend repacks its type,
Q4_K on x86; a plain CPU buffer otherwise), the activations are F32, and the graph is computed by
the CPU backend. No model and no llama.cpp graph are involved.

Two questions per weight type and row count n:

* ``--check``: is every row of an n-row product bit-identical to the same row computed alone?
  (greedy speculative decoding is exact only if it is)
* ``--time``: CPU time of one product of n rows, median of ``--reps`` (one thread by default).

    python -m scripts.investigate.kernel_weights --check
    python -m scripts.investigate.kernel_weights --time --rows 1,2,3,4,5,8,9,16 --json w.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from scripts.recorded import command_line, write_json
from tests.helpers.kernel_weights import Backend, Product, WeightShape

#: XS 2.1 weight matmuls of one MoE layer as the Q4_K_M file stores them (hidden 2048, 64 heads
#: of 128, 8 KV heads, 256 experts of 512 with 8 used, shared expert 512), and the output head.
XS_SHAPES = [
    WeightShape("attn_q", "q4_K", 2048, 8192),
    WeightShape("attn_output", "q4_K", 8192, 2048),
    WeightShape("attn_v (Q6_K layers)", "q6_K", 2048, 1024),
    WeightShape("ffn_up_shexp", "q4_K", 2048, 512),
    WeightShape("ffn_down (Q6_K layers)", "q6_K", 8192, 2048),
    WeightShape("ffn_up_exps", "q4_K", 2048, 512, 256, 8),
    WeightShape("ffn_down_exps", "q4_K", 512, 2048, 256, 8),
    WeightShape("ffn_down_exps (Q6_K layers)", "q6_K", 512, 2048, 256, 8),
    WeightShape("output", "q6_K", 2048, 100352 // 8),  # an eighth of the head: same per-row cost shape
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--rows", default="1,2,3,4,5,8,9,16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--only", default="", help="comma-separated substrings of shape names")
    ap.add_argument("--shared-routing", action="store_true", help="every row picks the same experts")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    be = Backend(args.threads)
    shapes = [s for s in XS_SHAPES if not args.only or any(o in s.name for o in args.only.split(","))]
    result = {"command": command_line(__file__, argv), "threads": args.threads,
              "shared_routing": args.shared_routing, "check": {}, "time_ms": {}}
    for s in shapes:
        prod = Product(be, s)
        if args.check:
            for n in rows:
                if n < 2:
                    continue
                bad, worst = prod.row_mismatches(n, shared_routing=args.shared_routing)
                result["check"].setdefault(s.name, {})[n] = bad
                print(f"check {s.name:28s} {s.type:5s} rows {n:2d}: {bad} rows differ from the row alone"
                      + (f" (max |diff| {worst:.2e})" if bad else ""), flush=True)
        if args.time:
            line = {}
            for n in rows:
                x, ids = prod.inputs(n, 2, args.shared_routing)
                _, times = prod.run(x, ids, reps=args.reps + 1)
                line[n] = 1e3 * statistics.median(times[1:])
            result["time_ms"][s.name] = line
            base = line.get(1)
            print(f"time  {s.name:28s} {s.type:5s} " + "  ".join(
                f"{n}:{v:.2f}" + (f"({v / base:.2f})" if base and n > 1 else "") for n, v in line.items()), flush=True)
    if args.json:
        write_json(args.json, result, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
