"""The CUDA wheel links where no driver is installed, executables included, and never loads the stub.

``laguna-run setup --cuda`` (runtime/setup/wheel.py) links ggml-cuda against a stub of the driver when the machine has none.
An executable linked against that library (the wheel's rpc-server) makes the linker look for the
library's needs by soname, ``libcuda.so.1``; CMake also records the stub's directory in the
library's RUNPATH. Both are reproduced here with a two-function ``cuda.h`` and ``cc``, in well
under a second, instead of the 20-40 minute CUDA compile (``scripts/gpu/check_cuda_build.py``).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from laguna_dflash.runtime.setup import wheel as bw

pytestmark = pytest.mark.skipif(not (shutil.which("cc") and shutil.which("readelf")), reason="needs cc and readelf")

CUDA_H = """typedef int CUresult;
CUresult cuInit(unsigned int flags);
CUresult cuMemCreate(void *handle, unsigned long size, const void *prop, unsigned long long flags);
"""
LIBRARY_C = "typedef int CUresult;\nCUresult cuMemCreate(void *, unsigned long, const void *, unsigned long long);\n" \
            "int ggml_cuda_alloc(void) { return cuMemCreate(0, 0, 0, 0); }\n"
SERVER_C = "int ggml_cuda_alloc(void);\nint main(void) { return ggml_cuda_alloc(); }\n"


def _cc(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["cc", *map(str, args)], cwd=cwd, capture_output=True, text=True)


@pytest.fixture
def stub(tmp_path, monkeypatch) -> dict[str, str]:
    """The stub the build makes on a driverless machine, as the CMake definitions it returns."""
    cuda = tmp_path / "cuda"
    (cuda / "include").mkdir(parents=True)
    (cuda / "include" / "cuda.h").write_text(CUDA_H)
    monkeypatch.setenv("CUDA_HOME", str(cuda))
    monkeypatch.setenv("LAGUNA_DFLASH_CACHE", str(tmp_path / "cache"))
    flags = bw.driver_flags()
    if not flags:
        pytest.skip("this machine has a driver (or the toolkit's stub): the build makes no stub")
    return dict(f.removeprefix("-D").split("=", 1) for f in flags)


def _cuda_library(tmp_path: Path, stub: dict[str, str], with_stub: bool = True) -> Path:
    """libggml-cuda as CMake links it: --as-needed, RUNPATH $ORIGIN plus the linked libraries' folders."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (tmp_path / "lib.c").write_text(LIBRARY_C)
    driver = Path(stub["CUDA_cuda_driver_LIBRARY"])
    extra = [driver] if with_stub else []
    r = _cc("-shared", "-fPIC", "-Wl,--as-needed", "-Wl,-soname,libggml-cuda.so", f"-Wl,-rpath,$ORIGIN:{driver.parent}",
            "-o", lib / "libggml-cuda.so", "lib.c", *extra, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return lib


def test_an_executable_links_against_the_cuda_library_through_the_stub(tmp_path, stub):
    lib = _cuda_library(tmp_path, stub)
    assert "libcuda.so.1" in bw.dynamic_section(lib / "libggml-cuda.so")[0]
    (tmp_path / "server.c").write_text(SERVER_C)

    without = _cc("-o", lib / "server", "server.c", lib / "libggml-cuda.so", cwd=tmp_path)
    assert without.returncode != 0 and "libcuda.so.1" in without.stderr  # issue 34's failure, reproduced

    linker_flags = stub["CMAKE_EXE_LINKER_FLAGS"].split()
    r = _cc("-o", lib / "server", "server.c", lib / "libggml-cuda.so", *linker_flags, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    needed, runpath = bw.dynamic_section(lib / "server")
    assert "libggml-cuda.so" in needed and not runpath  # -rpath-link is for the linker only
    bw.check_driver_link(lib, "test")


def test_a_runpath_that_leads_to_the_stub_is_refused(tmp_path, stub):
    lib = _cuda_library(tmp_path, stub)
    driver = Path(stub["CUDA_cuda_driver_LIBRARY"])
    # naming the stub by its soname in its own folder would also link executables, but the
    # library's RUNPATH names that folder: the loader would take the stub for the driver
    (driver.parent / "libcuda.so.1").symlink_to(driver.name)
    with pytest.raises(bw.BuildError, match="RUNPATH entry .* leads to the link-time driver stub"):
        bw.check_driver_link(lib, "test")


def test_a_cuda_library_that_does_not_need_the_driver_is_refused(tmp_path, stub):
    lib = _cuda_library(tmp_path, stub, with_stub=False)
    with pytest.raises(bw.BuildError, match="does not need libcuda.so.1"):
        bw.check_driver_link(lib, "test")
