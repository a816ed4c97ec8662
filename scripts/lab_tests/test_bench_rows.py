"""bench_rows' configurations run their binary over LIBDIR's libggml-cpu, even where the binary's
own build folder holds one (the vendored llama-bench's does), and refuse to run over another."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from scripts.bench.bench_rows import Config

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("ldd") is None,
                                reason="needs a C compiler and ldd")


def _lib(folder: Path, value: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / "cpu.c"
    src.write_text(f"int ggml_cpu_build(void) {{ return {value}; }}\n")
    out = folder / "libggml-cpu.so.0"
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libggml-cpu.so.0", str(src), "-o", str(out)], check=True)
    (folder / "libggml-cpu.so").symlink_to("libggml-cpu.so.0")
    return out


@pytest.fixture()
def build(tmp_path: Path) -> Path:
    """A build folder like the vendored llama.cpp's: a binary whose RUNPATH is its own folder,
    which holds the libggml-cpu it was linked with."""
    bindir = tmp_path / "build" / "bin"
    _lib(bindir, 1)
    main = tmp_path / "main.c"
    main.write_text("int ggml_cpu_build(void);\nint main(void) { return ggml_cpu_build(); }\n")
    subprocess.run(["cc", str(main), "-o", str(bindir / "llama-bench"), f"-L{bindir}", "-lggml-cpu",
                    "-Wl,--enable-new-dtags", f"-Wl,-rpath,{bindir}"], check=True)
    return bindir


def test_libdir_shadows_the_binary_folders_own_library(build: Path, tmp_path: Path):
    other = _lib(tmp_path / "other", 2)
    cfg = Config.parse(f"b={build / 'llama-bench'}:{other.parent}")
    assert cfg.env()["LD_LIBRARY_PATH"].split(":")[0] == str(other.parent)
    assert Path(cfg.ggml_cpu()["path"]) == other.resolve()
    # the binary really runs the other build's code
    assert subprocess.run([cfg.binary], env=cfg.env()).returncode == 2


def test_a_libdir_without_libggml_cpu_is_refused(build: Path, tmp_path: Path):
    empty = tmp_path / "empty"
    empty.mkdir()
    cfg = Config.parse(f"b={build / 'llama-bench'}:{empty}")
    with pytest.raises(SystemExit, match=r"--config b: .* loads .*build/bin/libggml-cpu.so.0, expected the libggml-cpu of LIBDIR"):
        cfg.ggml_cpu()


def test_without_libdir_the_binary_keeps_its_own(build: Path):
    cfg = Config.parse(f"b={build / 'llama-bench'}")
    lib = cfg.ggml_cpu()
    assert Path(lib["path"]) == (build / "libggml-cpu.so.0").resolve() and len(lib["sha256"]) == 16
    assert subprocess.run([cfg.binary], env=cfg.env()).returncode == 1


def test_a_build_with_ggml_in_one_library_is_recorded_without_libdir(tmp_path: Path):
    """ik_llama.cpp links one libggml (no libggml-cpu): recorded as it is, when no LIBDIR is asked."""
    bindir = tmp_path / "ik" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "ggml.c").write_text("int ggml_build(void) { return 3; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libggml.so", str(bindir / "ggml.c"), "-o",
                    str(bindir / "libggml.so")], check=True)
    (tmp_path / "main.c").write_text("int ggml_build(void);\nint main(void) { return ggml_build(); }\n")
    subprocess.run(["cc", str(tmp_path / "main.c"), "-o", str(bindir / "llama-bench"), f"-L{bindir}", "-lggml",
                    "-Wl,--enable-new-dtags", f"-Wl,-rpath,{bindir}"], check=True)
    assert Path(Config.parse(f"ik={bindir / 'llama-bench'}").ggml_cpu()["path"]) == (bindir / "libggml.so").resolve()
    with pytest.raises(SystemExit, match="ldd finds no libggml-cpu"):
        Config.parse(f"ik={bindir / 'llama-bench'}:{bindir}").ggml_cpu()
