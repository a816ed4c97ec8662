#!/usr/bin/env python3
"""Benchmark ``laguna-gguf convert`` on a random drafter with the exact Laguna XS 2.1 shapes.

    python -m scripts.bench.bench_convert                    # Q8_0, in a temporary directory
    python -m scripts.bench.bench_convert --outtype bf16 --workdir /tmp/bench --keep

The checkpoint (0.9 GB bf16: hidden 2048, 5 layers, 64/8 heads of 128, intermediate 8192,
target layers [1, 13, 25, 33, 39] of 40, vocab 100352) and a metadata-only target GGUF with a
100352-token vocabulary are generated first (not timed). The conversion then runs as the user
would run it, in a child process; we report its wall time and its peak resident memory
(``getrusage(RUSAGE_CHILDREN).ru_maxrss``, which counts only that child).

Note: the checkpoint was just written, so it is read from the page cache; a cold read of
0.9 GB adds the disk's read time.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from laguna_dflash.runtime.cores import cpu_facts
from tests.helpers.synthetic import XS_2_1, write_drafter, write_target_gguf

REPO = Path(__file__).resolve().parents[2]

LIMIT_SECONDS = 60.0
LIMIT_RSS_BYTES = 1.5e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--outtype", default="q8_0", choices=["q8_0", "bf16", "f16", "f32"])
    ap.add_argument("--workdir", type=Path, default=None, help="where to put the checkpoint and output "
                    "(default: a temporary directory, removed afterwards)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-convert-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        drafter, target, out = work / "Laguna-XS-2.1-DFlash-random", work / "target.gguf", work / "out.gguf"
        t0 = time.perf_counter()
        write_drafter(drafter, **XS_2_1, seed=args.seed, name_or_path="poolside/Laguna-XS-2.1-DFlash")
        write_target_gguf(target, n_layer=XS_2_1["num_target_layers"], hidden=XS_2_1["hidden"],
                          vocab_size=XS_2_1["vocab_size"], name="Laguna XS 2.1 (stand-in)")
        ckpt = sum(f.stat().st_size for f in drafter.iterdir())
        print(f"generated {drafter} ({ckpt / 1e9:.2f} GB) and {target} in {time.perf_counter() - t0:.1f} s",
              flush=True)

        cmd = [sys.executable, "-m", "laguna_dflash.convert.cli", "convert", str(drafter), "--target", str(target),
               "-o", str(out), "--outtype", args.outtype]
        print("running:", " ".join(cmd), flush=True)
        t0 = time.perf_counter()
        res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux reports KiB
        if res.returncode != 0:
            print(res.stdout + res.stderr, file=sys.stderr)
            return 1
        print(res.stdout.rstrip())
        result = {
            "outtype": args.outtype,
            "checkpoint_bytes": ckpt,
            "output_bytes": out.stat().st_size,
            "wall_seconds": round(wall, 2),
            "peak_rss_bytes": peak,
            "peak_rss_gb": round(peak / 1e9, 3),
            "within_limits": wall <= LIMIT_SECONDS and peak <= LIMIT_RSS_BYTES,
            "cpu": cpu_facts(),
        }
        print(f"wall time {wall:.1f} s (limit {LIMIT_SECONDS:.0f} s), peak RSS {peak / 1e9:.3f} GB "
              f"(limit {LIMIT_RSS_BYTES / 1e9:.1f} GB): {'OK' if result['within_limits'] else 'OVER'}")
        print(json.dumps(result))
        return 0 if result["within_limits"] else 1
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
