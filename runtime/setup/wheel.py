"""The patched llama-cpp-python: llama-cpp-python 0.3.36's PyPI sdist with the patches in
``patches/`` (shipped inside this package), built into a wheel and installed.

The wheel is cached under ``$LAGUNA_DFLASH_CACHE`` (default ``~/.cache/laguna-dflash``), keyed by
the sdist's hash, the content of every patch in ``patches/series`` order and the build flags, so
a second setup (from any install or clone on the same machine) skips the compile. Its version
names the series, so that the runtime refuses a wheel built from other patches (an install
upgraded without running setup again).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...convert.files import cache_root, sha256_file
from ..patch_series import SDIST_SHA256, SDIST_VERSION, series, series_key

SDIST_NAME = "llama-cpp-python"
SDIST_FILE = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
DEFAULT_CUDA_ARCH = "native"


class BuildError(RuntimeError):
    pass


def _print_line(msg: str) -> None:
    print(f"[setup] {msg}", flush=True)


#: where progress lines go; the setup command swaps in its console
log: Callable[[str], None] = _print_line


def build_flags(cuda: bool, cuda_arch: str) -> list[str]:
    # GGML_RPC: llama.cpp's RPC backend (client) and, through patch 0020, its rpc-server, in the
    # CPU and the CUDA wheel alike; the flag is part of the cache key like every other flag
    flags = ["-DLLAVA_BUILD=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DGGML_RPC=ON"]
    if cuda:
        flags += ["-DGGML_CUDA=on", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}", *cublas_flags(), *driver_flags()]
    else:
        # ggml's own thread pool instead of OpenMP's: its barrier is one atomic counter where
        # libgomp's costs microseconds, and a graph meets its threads about a thousand times a
        # step on the tiny pair; each context gets a pool (runtime/threadpool.py). The CUDA
        # wheel, which computes on the GPU, keeps OpenMP.
        flags += ["-DGGML_OPENMP=OFF"]
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
    """``<series>.<flags>``: the series' name first, so that a wheel's version says which
    patches it was built from whatever its flags (a CPU or a CUDA build)."""
    return f"{series_key(patches)}.{hashlib.sha256(' '.join(flags).encode()).hexdigest()[:6]}"


def wheel_version(key: str) -> str:
    # a local version label keeps `llama-cpp-python==0.3.36` satisfied while naming the patch set
    return f"{SDIST_VERSION}+laguna.{key}"


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
    digest = sha256_file(path)
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


def patched_source(patches: list[Path]) -> Path:
    """The extracted sdist with every patch applied, made once per series."""
    key = series_key(patches)
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


#: a build step's counter in the compile's output: ninja's "[12/345]" or make's "[ 45%]"
_NINJA_STEP = re.compile(r"^\s*\[(\d+)/(\d+)\]")
_MAKE_PERCENT = re.compile(r"^\s*\[\s*(\d+)%\]")

#: progress of a compile: (steps done, steps in all), called as the build prints them
Progress = Callable[[int, int], None]


def build(tree: Path, flags: list[str], out: Path, cuda: bool, progress: Progress | None = None) -> Path:
    env = dict(os.environ)
    env["CMAKE_ARGS"] = " ".join(flags)
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    log(f"building wheel ({'CUDA' if cuda else 'CPU'}; CMAKE_ARGS={env['CMAKE_ARGS']})")
    t0 = time.time()
    # -v: the compile's own lines, whose step counters drive the progress display
    cmd = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", str(tmp), str(tree)]
    build_log = tmp / "build.log"
    with open(build_log, "w") as keep, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                                        stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            keep.write(line)
            step = _NINJA_STEP.match(line) or _MAKE_PERCENT.match(line)
            if step and progress:
                done, total = (int(step[1]), int(step[2])) if step.re is _NINJA_STEP else (int(step[1]), 100)
                progress(done, total)
    if proc.returncode != 0:
        tail = "\n".join(build_log.read_text().splitlines()[-40:])
        raise BuildError(f"wheel build failed (full log: {build_log}):\n{tail}")
    log(f"built in {time.time() - t0:.0f} s")
    check_rpc_server(next(tmp.glob("*.whl")))
    if cuda:
        check_cuda_wheel(next(tmp.glob("*.whl")))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return next(out.glob("*.whl"))


# --------------------------------------------------------------------------- what setup does


@dataclass(frozen=True)
class Plan:
    """The wheel one setup wants: its build flags and the cache key they give with the patches."""

    cuda: bool
    patches: list[Path]
    flags: list[str]
    key: str

    @property
    def version(self) -> str:
        return wheel_version(self.key)

    @property
    def out(self) -> Path:
        return cache_root() / "wheels" / self.key

    def cached_wheel(self) -> Path | None:
        wheels = sorted(self.out.glob("*.whl")) if self.out.is_dir() else []
        return wheels[0] if wheels else None


def plan(cuda: bool = False, cuda_arch: str = DEFAULT_CUDA_ARCH) -> Plan:
    patches = series()
    flags = build_flags(cuda, cuda_arch)
    return Plan(cuda, patches, flags, cache_key(patches, flags))


def source_tree() -> Path:
    """The patched sdist tree (its vendored llama.cpp serves convert_hf_to_gguf.py), made once."""
    return patched_source(series())


def missing_build_tools() -> list[str]:
    """What a compile needs from the system that this machine lacks (pip brings the rest)."""
    missing = [tool for tool in ("patch", "c++") if shutil.which(tool) is None]
    return missing


def build_requirements() -> list[str]:
    """The sdist's build requirements, installed here because it builds without isolation (so
    that nothing but the sdist, the patches and the flags decides the wheel)."""
    wanted = ["scikit-build-core>=0.9.2", "numpy"]
    if shutil.which("cmake") is None:
        wanted.append("cmake>=3.21")
    return wanted


def ensure_wheel(p: Plan, rebuild: bool = False, progress: Progress | None = None) -> tuple[Path, bool]:
    """The plan's wheel from the cache, or built now; and whether it was built."""
    cached = None if rebuild else p.cached_wheel()
    if cached:
        return cached, False
    missing = missing_build_tools()
    if missing:
        raise BuildError(f"building llama.cpp needs {' and '.join(missing)} on PATH (e.g. apt-get install "
                         "build-essential patch)")
    pip_install(build_requirements())
    tree = source_tree()
    # build from a private copy so concurrent CPU/CUDA builds never share a build dir
    work = cache_root() / "work" / p.key
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(tree, work, symlinks=True)
    init = work / "llama_cpp" / "__init__.py"
    init.write_text(init.read_text().replace(f'__version__ = "{SDIST_VERSION}"', f'__version__ = "{p.version}"'))
    wheel = build(work, p.flags, p.out, p.cuda, progress)
    shutil.rmtree(work, ignore_errors=True)
    return wheel, True


def pip_install(args: list[str]) -> None:
    import importlib.util

    if importlib.util.find_spec("pip") is None:
        raise BuildError(f"{sys.executable} has no pip; install into this environment by hand: "
                         f"<its installer> install {' '.join(args)}")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(f"pip install {' '.join(args)} failed:\n{r.stderr.strip()[-2000:]}")


def wheel_requirements(wheel: Path) -> list[str]:
    """The wheel's own unconditional Requires-Dist (those without an extra)."""
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    reqs = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Requires-Dist:")]
    return [r for r in reqs if "extra ==" not in r]


def install(wheel: Path) -> None:
    """Into the running interpreter's environment: the wheel alone (a reinstall never touches numpy),
    then its own needs."""
    pip_install(["--no-deps", "--force-reinstall", str(wheel)])
    needs = wheel_requirements(wheel)
    if needs:
        pip_install(needs)
