#!/usr/bin/env python3
"""Is a GPU bundle (scripts/gpu_bundle.sh) complete, and does scripts/gpu_check.sh get as far as
the GPU with it?

    python -m scripts.gpu.check_bundle .gpu              # what gpu_bundle.sh runs last
    python -m scripts.gpu.check_bundle .gpu --no-dry-run # the contents only

A GPU machine reaches no package registry and gets one try, so everything is checked here first:
the bundle's wheel is the CUDA wheel of this tree's patches and flags; every library its
libraries need from the bundle is in it under the name the loader asks for; the CUDA library
needs the driver (``libcuda.so.1``) and cannot find the link-time stub; the rpc-server and the
pure-Python wheels are there; the tiny-target fixture is the one this tree's generator makes;
and every script gpu_check.sh runs exists. Then (the dry run) gpu_check.sh itself runs on the
bundle with no stage selected: it installs the bundle, and its ``load`` stage must either see a
GPU or stop at the driver, this machine lacking one, and at nothing before it. Exit 0 on a pass,
1 with one line per problem otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from laguna_dflash.runtime.setup import wheel as bw
from tests.helpers import tiny_target

REPO = Path(__file__).resolve().parents[2]
TARBALL = "llama_cpp_cuda.tar.xz"
# what gpu_check.sh loads by name: llama_cpp opens libllama.so, laguna-rpc-server runs the server
LOADED_BY_NAME = ("libllama.so", "ggml-rpc-server")


def is_elf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def check_libraries(lib: Path) -> list[str]:
    problems = [f"{TARBALL}: lacks llama_cpp/lib/{n}" for n in LOADED_BY_NAME if not (lib / n).is_file()]
    for elf in sorted(p for p in lib.iterdir() if p.is_file() and is_elf(p)):
        needed, _ = bw.dynamic_section(elf)
        problems += [f"{TARBALL}: {elf.name} needs {n}, which the bundle lacks" for n in needed
                     if n.startswith(("libggml", "libllama")) and not (lib / n).is_file()]
    try:
        bw.check_driver_link(lib, TARBALL)
    except bw.BuildError as e:
        problems.append(str(e))
    return problems


def check_contents(bundle: Path, arch: str) -> list[str]:
    problems = []
    key = bw.cache_key(bw.series(), bw.build_flags(True, arch))
    wheel_name = (bundle / "WHEEL").read_text().strip() if (bundle / "WHEEL").exists() else ""
    if bw.wheel_version(key) not in wheel_name:
        problems.append(f"{bundle / 'WHEEL'}: names {wheel_name or 'nothing'}, expected the wheel of this tree's "
                        f"patches and flags ({bw.wheel_version(key)}, sm_{arch}): rerun scripts/gpu_bundle.sh")
    for pattern in ("gguf-*.whl", "diskcache-*.whl", "llguidance-*.whl"):
        if not list(bundle.glob(pattern)):
            problems.append(f"{bundle}: no {pattern} (gpu_check.sh installs it offline)")
    fixture = bundle / "fixtures" / f"tiny-target-{tiny_target.generator_fingerprint()}" / "fingerprint"
    if not fixture.exists():
        problems.append(f"{fixture}: missing (the GPU machine cannot build the tiny target: it lacks the sdist)")
    gpu_check = (REPO / "scripts/gpu_check.sh").read_text()
    modules = [m.replace(".", "/") + ".py" for m in re.findall(r"-m (scripts(?:\.\w+)+)", gpu_check)]
    for script in sorted(set(re.findall(r"\bscripts/[\w/.-]+\.(?:py|sh)\b", gpu_check)) | set(modules)):
        if not (REPO / script).is_file():
            problems.append(f"scripts/gpu_check.sh: runs {script}, which does not exist")
    if not (bundle / TARBALL).is_file():
        return problems + [f"{bundle / TARBALL}: missing"]
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(bundle / TARBALL) as tf:
            tf.extractall(tmp, filter="data")
        init = Path(tmp) / "llama_cpp" / "__init__.py"
        version = re.search(r'__version__ = "(.+?)"', init.read_text()).group(1) if init.exists() else None
        if version != bw.wheel_version(key):
            problems.append(f"{TARBALL}: llama_cpp {version}, expected {bw.wheel_version(key)}")
        problems += check_libraries(Path(tmp) / "llama_cpp" / "lib")
    return problems


def dry_run(bundle: Path) -> list[str]:
    """gpu_check.sh with no stage selected: it installs the bundle, then ``load`` sees a GPU or stops."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, GPU_BUNDLE=str(bundle.resolve()), OUT=f"{tmp}/out", GPU_CHECK_STAGES="none",
                   GPU_SITE=f"{tmp}/site", LAGUNA_DFLASH_CACHE=f"{tmp}/cache",
                   PYTHON=os.environ.get("PYTHON", sys.executable))
        r = subprocess.run(["bash", str(REPO / "scripts/gpu_check.sh")], env=env, cwd=REPO, capture_output=True,
                           text=True, timeout=300)
        load = Path(tmp, "out", "load.log")
        log = load.read_text() if load.exists() else ""
    if r.returncode == 0 and "gpu True" in log:
        print("[check_bundle] dry run: the bundle loads and sees a GPU")
        return []
    if "libcuda.so.1" in log:
        print("[check_bundle] dry run: installed; the load stage stops at the driver (libcuda.so.1), "
              "which this machine lacks")
        return []
    tail = "\n".join((log or r.stdout + r.stderr).splitlines()[-15:])
    return [f"scripts/gpu_check.sh (dry run, exit {r.returncode}) stopped before the GPU:\n{tail}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path, nargs="?", default=REPO / ".gpu", help="the bundle folder (default: .gpu)")
    ap.add_argument("--cuda-arch", default=os.environ.get("LAGUNA_CUDA_ARCH", "90"),
                    help="the architecture the bundle was built for (default: %(default)s)")
    ap.add_argument("--no-dry-run", action="store_true", help="check the contents only")
    args = ap.parse_args(argv)
    if not args.bundle.is_dir():
        print(f"[check_bundle] {args.bundle}: no such folder (make it with scripts/gpu_bundle.sh)", file=sys.stderr)
        return 1
    problems = check_contents(args.bundle, args.cuda_arch)
    if not problems and not args.no_dry_run:
        problems = dry_run(args.bundle)
    for p in problems:
        print(f"[check_bundle] {p}", file=sys.stderr)
    if not problems:
        print(f"[check_bundle] {args.bundle}: complete")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
