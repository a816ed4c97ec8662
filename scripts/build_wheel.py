#!/usr/bin/env python3
"""Build llama-cpp-python 0.3.36 from its PyPI sdist with the patches in ``patches/``: the
project's scripts call this name; the work is ``laguna-run setup``'s (the installed package's
``laguna_dflash.runtime.setup.wheel``), so a pip user and a clone build the same wheel.

The wheel is cached under ``$LAGUNA_DFLASH_CACHE`` (default ``~/.cache/laguna-dflash``) keyed by
the sdist hash, the content of every patch in ``patches/series`` order and the build flags, so a
second run (from any clone or install on the same machine) skips the compile. Every flag is
``laguna-run setup``'s:

    python scripts/build_wheel.py                 # CPU wheel, build or reuse, then install
    python scripts/build_wheel.py --cuda --cuda-arch 90
    python scripts/build_wheel.py --source-dir    # print the patched source tree and exit
    python scripts/build_wheel.py --wheel-path    # print the cached wheel's path (building if needed)
    python scripts/build_wheel.py --no-install    # build or reuse, install nothing
"""

import sys

from laguna_dflash.runtime.cli import main

if __name__ == "__main__":
    sys.exit(main(["setup", *sys.argv[1:]]))
