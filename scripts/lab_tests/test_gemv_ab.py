"""scripts/bench/gemv_ab.c: both kernel types, against the installed wheel and a library that
computes other bits."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")

SRC = Path(__file__).resolve().parents[1] / "bench" / "gemv_ab.c"

# one-row and rows entry points of both types that write zeros: bits other than the wheel's
FAKE = """
#include <stddef.h>
static void zero(float * s, int nc) { for (int i = 0; i < nc; i++) s[i] = 0.0f; }
void ggml_gemv_q8_0_4x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) { zero(s, nc); }
void ggml_gemv_q8_0_4x8_q8_0_rows(int n, float * const * s, const void * vx, const void * const * vy, int nr, int nc) {
    for (int r = 0; r < nr; r++) zero(s[r], nc);
}
void ggml_gemv_q4_K_8x8_q8_K(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) { zero(s, nc); }
void ggml_gemv_q4_K_8x8_q8_K_rows(int n, float * const * s, const void * vx, const void * const * vy, int nr, int nc) {
    for (int r = 0; r < nr; r++) zero(s[r], nc);
}
"""


@pytest.fixture(scope="module")
def tools(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemv_ab")
    subprocess.run(["cc", "-O2", str(SRC), "-o", str(d / "gemv_ab"), "-ldl"], check=True)
    (d / "fake.c").write_text(FAKE)
    subprocess.run(["cc", "-shared", "-fPIC", str(d / "fake.c"), "-o", str(d / "libfake.so")], check=True)
    llama_cpp = pytest.importorskip("llama_cpp")
    wheel = Path(llama_cpp.__file__).parent / "lib" / "libggml-cpu.so"
    if not wheel.exists():
        pytest.skip("no libggml-cpu.so in the installed llama_cpp")
    return d / "gemv_ab", wheel, d / "libfake.so"


def run(tool, *args):
    return subprocess.run([str(tool), *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("typed", [("q8_0", 128, 64), ("q4_K", 256, 16), (256, 16)], ids=["q8_0", "q4_K", "untyped"])
def test_the_same_library_twice_gives_the_same_bits_at_every_row_count(tools, typed):
    tool, wheel, _ = tools
    *kind, n_in, n_out = typed
    out = run(tool, *kind, wheel, wheel, n_in, n_out)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["rows  1", "rows  2", "rows  5", "rows  9", "rows 16"]
    assert all(line.endswith("bits same") for line in lines)


@pytest.mark.parametrize("kind", ["q8_0", "q4_K"])
def test_other_bits_are_reported(tools, kind):
    tool, wheel, fake = tools
    out = run(tool, kind, wheel, fake, 256, 16)
    assert out.returncode == 0, out.stderr
    assert all(line.endswith("bits DIFFER") for line in out.stdout.splitlines())


def test_an_unknown_type_is_refused(tools):
    tool, wheel, _ = tools
    out = run(tool, "q6_K", wheel, wheel, 256, 16)
    assert out.returncode == 2
    assert "usage" in out.stderr
