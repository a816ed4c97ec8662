#!/usr/bin/env python3
"""Does a row's logit depend on how many rows share its batch? (the root of greedy exactness)

Greedy speculative decoding gives plain decoding's tokens only if the target scores a position
the same in a verify batch of k+1 rows as in a one-row plain step. On the CPU the kernels are
row-independent; on a GPU the batch size picks the kernel. This decodes a prompt, then at each
of the next positions decodes the same token alone and as the first row of batches of k rows,
and reports per k: the largest logit difference, how often the argmax differs, and the
smallest top-2 gap seen (a flip needs a gap below the difference).

    python -m scripts.investigate.batch_invariance --device cuda --json out.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from scripts.recorded import write_json


BATCH_SIZES = (2, 3, 5, 8, 9, 16)


def measure(model, kv_type: str, flash_attn: bool, prompt: list[int], steps: int) -> dict:
    from laguna_dflash.runtime.llama import Context, ContextParams

    params = ContextParams(n_ctx=1024, n_batch=512, n_ubatch=512, kv_type=kv_type, flash_attn=flash_attn)
    out = {k: {"max_abs_diff": 0.0, "argmax_flips": 0} for k in BATCH_SIZES}
    min_gap = float("inf")
    with Context(model, params) as ctx:
        ctx.decode(prompt, np.arange(len(prompt)), logits="last")
        tok = int(ctx.logits_row(-1).argmax())
        for step in range(steps):
            p = len(prompt) + step
            rows = {}
            for k in BATCH_SIZES:
                filler = [tok] * k  # the other rows' content does not matter for row 0 (causal)
                ctx.decode(filler, np.arange(p, p + k), logits="all")
                rows[k] = ctx.logits_row(0).copy()
                ctx.seq_rm(p)
            ctx.decode([tok], [p], logits="last")
            single = ctx.logits_row(-1).copy()
            top2 = np.sort(single)[-2:]
            min_gap = min(min_gap, float(top2[1] - top2[0]))
            for k, r in rows.items():
                out[k]["max_abs_diff"] = max(out[k]["max_abs_diff"], float(np.abs(r - single).max()))
                out[k]["argmax_flips"] += int(r.argmax() != single.argmax())
            tok = int(single.argmax())
    return {"kv_type": kv_type, "flash_attn": flash_attn, "steps": steps, "min_top2_gap": min_gap,
            "by_batch_size": {str(k): v for k, v in out.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--model", type=Path, action="append", help="target GGUF (repeatable; default: the bundled one)")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.llama import Model
    from laguna_dflash.runtime.placement import resolve

    placement = resolve(args.device)
    results = []
    for path in args.model or [assets.TINY_TARGET]:
        with Model(path, n_gpu_layers=placement.n_gpu_layers) as model:
            prompt = model.tokenize(assets.read_prompts(assets.CODE_PROMPTS)[0])
            for kv_type in ("f16", "f32"):
                for flash in (False, True):
                    r = measure(model, kv_type, flash, prompt, args.steps)
                    r["model"] = path.name
                    results.append(r)
                    worst = {k: (v["max_abs_diff"], v["argmax_flips"]) for k, v in r["by_batch_size"].items()}
                    print(f"{path.name} kv {kv_type} flash {flash}: min top-2 gap {r['min_top2_gap']:.2e}; "
                          + ", ".join(f"k={k}: {d:.1e}/{f} flips" for k, (d, f) in worst.items()), flush=True)
    if args.json:
        write_json(args.json, {"placement": placement.describe(), "results": results}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
