#!/usr/bin/env python3
"""Is a row of a ggml CPU matmul computed the same in a batch of n rows as alone?

Greedy speculative decoding returns plain decoding's tokens only if every op of the target
computes a verify row (one of k+1 rows) exactly as the one-row decode step computes it. This
drives the installed wheel's ggml CPU backend directly through ctypes (no model, no llama.cpp
graph): it builds one ``ggml_mul_mat`` with the shapes and types an op of the target has, fills
the inputs with seeded random values, computes it once with ``n`` rows and once per row alone,
and compares the outputs bit for bit.

    python -m scripts.investigate.kernel_rows                     # the attention matmuls of the demo target and of XS
    python -m scripts.investigate.kernel_rows --rows 2,5,16 --threads 2

Shapes named after llama.cpp's non-flash attention (``build_attn_mha``): ``kq`` multiplies the F16
K cache view [head_dim, n_kv, n_head_kv] by the permuted F32 queries [head_dim, rows, n_head];
``kqv`` multiplies the transposed F16 V cache [n_kv, head_dim, n_head_kv] by the F32
probabilities [n_kv, rows, n_head].
"""

from __future__ import annotations

import argparse
import sys

from tests.helpers.kernel_rows import GGML_TYPE_F16, GGML_TYPE_F32, SHAPES, Ggml, row_mismatches


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="2,3,5,8,16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache-type", choices=("f16", "f32"), default="f16")
    args = ap.parse_args(argv)
    cache_type = GGML_TYPE_F16 if args.cache_type == "f16" else GGML_TYPE_F32
    g = Ggml()
    failed = False
    for s in SHAPES:
        for rows in (int(x) for x in args.rows.split(",")):
            bad, worst = row_mismatches(g, s, rows, args.threads, cache_type=cache_type)
            failed |= bad > 0
            print(f"{args.cache_type} {s.name:4s} head_dim {s.head_dim:3d} n_kv {s.n_kv:5d} heads {s.n_head}/{s.n_head_kv} rows {rows:2d}: "
                  f"{bad} rows differ from the row alone" + (f" (max |diff| {worst:.2e})" if bad else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
