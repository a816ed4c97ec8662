#!/usr/bin/env python3
"""Build llama-cpp-python 0.3.36 from its PyPI sdist with the patches in ``patches/``.

The wheel is cached under ``$LAGUNA_DFLASH_CACHE`` (default ``~/.cache/laguna-dflash``)
keyed by the sdist hash, the content of every patch in ``patches/series`` order and the
build flags, so a second run (from any clone on the same machine) skips the compile.

    python scripts/build_wheel.py                 # CPU wheel, build or reuse, then install
    python scripts/build_wheel.py --cuda --cuda-arch 90
    python scripts/build_wheel.py --source-dir    # print the patched source tree and exit
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
DEFAULT_CUDA_ARCH = "native"

REPO = Path(__file__).resolve().parent.parent
PATCH_DIR = REPO / "patches"


class BuildError(RuntimeError):
    pass


def cache_root() -> Path:
    return Path(os.environ.get("LAGUNA_DFLASH_CACHE", Path.home() / ".cache" / "laguna-dflash"))


def log(msg: str) -> None:
    print(f"[build_wheel] {msg}", flush=True)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def series() -> list[Path]:
    """Patches in the order ``patches/series`` lists them (one file name a line, '#' comments)."""
    listing = PATCH_DIR / "series"
    if not listing.exists():
        raise BuildError(f"{listing}: missing; it lists the patches in the order they apply")
    names = [ln.split("#", 1)[0].strip() for ln in listing.read_text().splitlines()]
    patches = [PATCH_DIR / n for n in names if n]
    for p in patches:
        if not p.exists():
            raise BuildError(f"{listing}: names {p.name}, which does not exist")
    unlisted = sorted({p.name for p in PATCH_DIR.glob("*.patch")} - {p.name for p in patches})
    if unlisted:
        raise BuildError(f"{listing}: does not list {', '.join(unlisted)}")
    return patches


def build_flags(cuda: bool, cuda_arch: str) -> list[str]:
    # GGML_RPC: llama.cpp's RPC backend (client) and, through patch 0020, its rpc-server, in the
    # CPU and the CUDA wheel alike; the flag is part of the cache key like every other flag
    flags = ["-DLLAVA_BUILD=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DGGML_RPC=ON"]
    if cuda:
        flags += ["-DGGML_CUDA=on", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}", *cublas_flags(), *driver_flags()]
    return flags


def driver_flags() -> list[str]:
    """ggml-cuda links libcuda (the driver). Where no driver or toolkit stub is installed (a
    build-only machine), link against a stub with the driver's soname that defines every
    function cuda.h declares: the symbols resolve at run time from the real driver of the
    machine that loads the wheel. An empty stub does not do: the linker (--as-needed) then
    drops libcuda.so.1 from the library's needs, and loading it fails on `cuMemCreate`."""
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    candidates = [home / "lib64" / "stubs" / "libcuda.so", Path("/usr/lib/x86_64-linux-gnu/libcuda.so")]
    if any(p.exists() for p in candidates):
        return []
    header = home / "include" / "cuda.h"
    if not header.exists():
        raise BuildError(f"{header}: missing; the CUDA toolkit's driver API header is needed for --cuda")
    # the preprocessor applies cuda.h's versioned names (cuMemAlloc -> cuMemAlloc_v2)
    pre = subprocess.run(["cc", "-E", "-P", str(header)], capture_output=True, text=True, check=True).stdout
    names = sorted(set(re.findall(r"\b(cu[A-Z]\w*)\s*\(", pre)))
    source = "/* link-time stand-in for the CUDA driver; never loaded */\n" + "".join(
        f"void {n}(void) {{}}\n" for n in names)
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    stub = cache_root() / f"cuda-stub-{digest}" / "libcuda.so"  # the path is part of the wheel's cache key
    if not stub.exists():
        stub.parent.mkdir(parents=True, exist_ok=True)
        src = stub.with_suffix(".c")
        src.write_text(source)
        subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub), str(src)], check=True)
    # Linking an executable against libggml-cuda (the rpc-server) makes the linker look for the
    # library's needs by soname, libcuda.so.1, to check that every symbol resolves. The stub
    # answers to that name only in a directory of its own named by -rpath-link, which no built
    # file records: a RUNPATH can never lead a machine's loader to the stub instead of its driver.
    by_soname = stub.parent / "soname"
    link = by_soname / "libcuda.so.1"
    if not link.is_symlink():
        by_soname.mkdir(exist_ok=True)
        try:
            link.symlink_to(Path("..") / stub.name)
        except FileExistsError:  # a concurrent build made it
            pass
    return [f"-DCUDA_cuda_driver_LIBRARY={stub}", f"-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,{by_soname}"]


def dynamic_section(path: Path) -> tuple[list[str], list[str]]:
    """An ELF file's NEEDED sonames and RUNPATH (or RPATH) directories, as ``readelf -d`` lists them."""
    dyn = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dyn)
    paths = [d for entry in re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*?)\]", dyn)
             for d in entry.split(":") if d]
    return needed, paths


def check_driver_link(lib_dir: Path, where: str) -> None:
    """The CUDA library in ``lib_dir`` must name libcuda.so.1 among its needs, or it cannot load
    anywhere; and no file there may find the driver stub through its RUNPATH (CMake records the
    directories of the libraries it linked, the stub's among them), or a machine holding this
    cache would load the stub instead of its driver."""
    cuda = sorted(lib_dir.glob("libggml-cuda.so*"))
    if not cuda:
        raise BuildError(f"{where}: no libggml-cuda.so (built without -DGGML_CUDA=on?)")
    if "libcuda.so.1" not in dynamic_section(cuda[0])[0]:
        raise BuildError(f"{where}: {cuda[0].name} does not need libcuda.so.1 (the driver stub exported nothing?)")
    for elf in sorted(p for p in lib_dir.iterdir() if p.is_file() and not p.is_symlink()):
        with open(elf, "rb") as f:
            if f.read(4) != b"\x7fELF":
                continue
        for d in dynamic_section(elf)[1]:
            driver = (Path(d.replace("$ORIGIN", str(lib_dir))) / "libcuda.so.1").resolve()
            if driver.exists() and driver.parent.name.startswith("cuda-stub-"):
                raise BuildError(f"{where}: {elf.name}'s RUNPATH entry {d} leads to the link-time driver stub")


def check_cuda_wheel(wheel: Path) -> None:
    import zipfile

    with zipfile.ZipFile(wheel) as z, tempfile.TemporaryDirectory() as tmp:
        for name in z.namelist():
            if name.startswith("llama_cpp/lib/"):
                z.extract(name, tmp)
        check_driver_link(Path(tmp) / "llama_cpp" / "lib", wheel.name)


RPC_SERVER = "llama_cpp/lib/ggml-rpc-server"


def check_rpc_server(wheel: Path) -> None:
    """The wheel must carry the RPC client library and the rpc-server built with it (patch 0020)."""
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    missing = [n for n in (RPC_SERVER, "llama_cpp/lib/libggml-rpc.so") if n not in names]
    if missing:
        raise BuildError(f"{wheel.name}: lacks {', '.join(missing)} (built without -DGGML_RPC=ON, or patch 0020 "
                         "did not install the server)")


def cublas_flags() -> list[str]:
    """ggml-cuda links cuBLAS. A toolkit without it (nvcc alone) gets NVIDIA's PyPI wheel of it."""
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    if any((home / d / "libcublas.so").exists() for d in ("lib64", "lib")):
        return []
    root = cache_root() / "cublas"
    lib, inc = root / "nvidia" / "cu13" / "lib", root / "nvidia" / "cu13" / "include"
    if not (lib / "libcublas.so").exists():
        log("no cuBLAS in the CUDA toolkit; fetching nvidia-cublas 13 from PyPI")
        dl = root / "download"
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "nvidia-cublas==13.*",
                        "-d", str(dl)], check=True)
        import zipfile

        with zipfile.ZipFile(next(dl.glob("*.whl"))) as z:
            z.extractall(root)
        for name in ("libcublas", "libcublasLt"):
            (lib / f"{name}.so").unlink(missing_ok=True)
            (lib / f"{name}.so").symlink_to(f"{name}.so.13")
    return [f"-DCUDA_cublas_LIBRARY={lib / 'libcublas.so'}", f"-DCUDA_cublasLt_LIBRARY={lib / 'libcublasLt.so'}",
            f"-DCMAKE_CUDA_FLAGS=-I{inc}", f"-DCMAKE_CXX_FLAGS=-I{inc}"]


def cache_key(patches: list[Path], flags: list[str]) -> str:
    h = hashlib.sha256()
    h.update(SDIST_SHA256.encode())
    for p in patches:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(" ".join(flags).encode())
    return h.hexdigest()[:16]


def wheel_version(key: str) -> str:
    # a local version label keeps `llama-cpp-python==0.3.36` satisfied while naming the patch set
    return f"{SDIST_VERSION}+laguna.{key[:10]}"


def installed_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        return None


def fetch_sdist() -> Path:
    dest = cache_root() / "sdist"
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / SDIST_FILE
    if not path.exists():
        log(f"fetching {SDIST_NAME}=={SDIST_VERSION} sdist with pip")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             f"{SDIST_NAME}=={SDIST_VERSION}", "-d", str(dest), "-q"],
            check=True,
        )
    digest = sha256_of(path)
    if digest != SDIST_SHA256:
        path.unlink()
        raise BuildError(f"{path}: sha256 {digest}, expected {SDIST_SHA256}; refusing to build")
    return path


def apply_patches(tree: Path, patches: list[Path]) -> None:
    for p in patches:
        # --dry-run first, so a patch that does not apply leaves no half-patched tree behind
        for extra in (["--dry-run"], []):
            r = subprocess.run(["patch", "-p1", "--forward", "--batch", "--silent", *extra, "-i", str(p)],
                               cwd=tree, capture_output=True, text=True)
            if r.returncode != 0:
                raise BuildError(f"patch {p.name} does not apply to {SDIST_FILE}:\n{r.stdout}{r.stderr}")
        log(f"applied {p.name}")


def patched_source(patches: list[Path], key: str) -> Path:
    """The extracted sdist with every patch applied, made once per cache key."""
    root = cache_root() / "src" / key
    tree = root / f"llama_cpp_python-{SDIST_VERSION}"
    if (root / ".complete").exists():
        return tree
    sdist = fetch_sdist()
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    with tarfile.open(sdist) as tf:
        tf.extractall(root, filter="data")
    apply_patches(tree, patches)
    (root / ".complete").write_text(key)
    return tree


def build(tree: Path, flags: list[str], out: Path, cuda: bool) -> Path:
    env = dict(os.environ)
    env["CMAKE_ARGS"] = " ".join(flags)
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    log(f"building wheel ({'CUDA' if cuda else 'CPU'}; CMAKE_ARGS={env['CMAKE_ARGS']})")
    t0 = time.time()
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp), str(tree)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        (tmp / "build.log").write_text(r.stdout + r.stderr)
        tail = "\n".join((r.stdout + r.stderr).splitlines()[-40:])
        raise BuildError(f"wheel build failed (full log: {tmp / 'build.log'}):\n{tail}")
    log(f"built in {time.time() - t0:.0f} s")
    check_rpc_server(next(tmp.glob("*.whl")))
    if cuda:
        check_cuda_wheel(next(tmp.glob("*.whl")))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return next(out.glob("*.whl"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuda", action="store_true", help="build with -DGGML_CUDA=on")
    ap.add_argument("--cuda-arch", default=os.environ.get("LAGUNA_CUDA_ARCH", DEFAULT_CUDA_ARCH),
                    help="CMAKE_CUDA_ARCHITECTURES (default: %(default)s; e.g. 90 for Hopper)")
    ap.add_argument("--no-install", action="store_true", help="build or reuse the wheel, do not install it")
    ap.add_argument("--source-dir", action="store_true", help="print the patched source tree and exit")
    ap.add_argument("--wheel-path", action="store_true", help="print the cached wheel path (building if needed)")
    ap.add_argument("--rebuild", action="store_true",
                    help="build even if a wheel with this cache key is cached (the key covers the sdist, the "
                         "patches and the flags, not this script)")
    args = ap.parse_args(argv)

    try:
        patches = series()
        flags = build_flags(args.cuda, args.cuda_arch)
        key = cache_key(patches, flags)
        src_key = cache_key(patches, [])
        if args.source_dir:
            print(patched_source(patches, src_key))
            return 0
        out = cache_root() / "wheels" / key
        wheels = sorted(out.glob("*.whl")) if out.exists() and not args.rebuild else []
        if wheels:
            wheel = wheels[0]
            log(f"reusing cached wheel {wheel} (key {key})")
        else:
            tree = patched_source(patches, src_key)
            # build from a private copy so concurrent CPU/CUDA builds never share a build dir
            work = cache_root() / "work" / key
            if work.exists():
                shutil.rmtree(work)
            shutil.copytree(tree, work, symlinks=True)
            init = work / "llama_cpp" / "__init__.py"
            init.write_text(init.read_text().replace(f'__version__ = "{SDIST_VERSION}"',
                                                     f'__version__ = "{wheel_version(key)}"'))
            wheel = build(work, flags, out, args.cuda)
            shutil.rmtree(work, ignore_errors=True)
        if args.wheel_path:
            print(wheel)
            return 0
        if not args.no_install:
            if installed_version() == wheel_version(key):
                log(f"llama-cpp-python {wheel_version(key)} already installed")
                return 0
            log(f"installing {wheel.name}")
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall",
                            str(wheel)], check=True)
        return 0
    except BuildError as e:
        print(f"[build_wheel] error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
