#!/usr/bin/env python3
"""Does the CUDA wheel still build here, where no GPU or driver is, and is it one a GPU can load?

    python -m scripts.gpu.check_cuda_build                 # sm_90 (the H200s this project is lent)
    python -m scripts.gpu.check_cuda_build --cuda-arch 89 --rebuild

Compile only: ``laguna-run setup --cuda`` builds (or reuses) the wheel of the current
cache key, then the wheel is checked as a GPU machine will need it: its CUDA library needs
``libcuda.so.1`` (the driver, resolved where it loads), no RUNPATH of its files leads to the
link-time driver stub, and it carries ``ggml-rpc-server`` and the RPC client library. A pass is
recorded under ``$LAGUNA_DFLASH_CACHE/checks/``, keyed by the wheel's cache key (sdist, patches,
flags) and the build module's content (``laguna_dflash.runtime.setup.wheel``), so the check costs nothing until one of those changes.
The compile takes 20-40 minutes on a 2-core machine; a wheel of the same key already in the
cache is checked without recompiling (``--rebuild`` compiles it afresh, for a change to
the build steps that the key does not cover). Exit 0 on a pass, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

from laguna_dflash.runtime.cli import main as laguna_run
from laguna_dflash.runtime.setup import wheel as bw


def stamp_path(key: str) -> Path:
    script = hashlib.sha256(Path(bw.__file__).read_bytes()).hexdigest()[:12]
    return bw.cache_root() / "checks" / f"cuda-build-{key}-{script}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuda-arch", default=os.environ.get("LAGUNA_CUDA_ARCH", "90"),
                    help="CMAKE_CUDA_ARCHITECTURES (default: %(default)s)")
    ap.add_argument("--rebuild", action="store_true", help="compile even if a wheel of this key is cached")
    args = ap.parse_args(argv)
    try:
        key = bw.cache_key(bw.series(), bw.build_flags(True, args.cuda_arch))
        stamp = stamp_path(key)
        if stamp.exists() and not args.rebuild:
            print(f"[check_cuda_build] passed before for this key and build script: {stamp.read_text().strip()}")
            return 0
        build = ["--cuda", "--cuda-arch", args.cuda_arch, "--no-install", *(["--rebuild"] if args.rebuild else [])]
        if laguna_run(["setup", *build]) != 0:
            return 1
        wheel = sorted((bw.cache_root() / "wheels" / key).glob("*.whl"))[0]
        bw.check_rpc_server(wheel)
        bw.check_cuda_wheel(wheel)
    except bw.BuildError as e:
        print(f"[check_cuda_build] FAILED: {e}", file=sys.stderr)
        return 1
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(f"{wheel}\n")
    print(f"[check_cuda_build] passed: {wheel.name} needs libcuda.so.1, no RUNPATH leads to the stub, "
          "carries ggml-rpc-server")
    return 0


if __name__ == "__main__":
    sys.exit(main())
