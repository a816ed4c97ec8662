"""The CPU backend's Q8_K quantization writes the reference's bytes, block for block.

Every product of a K-quant weight (Q2_K-Q6_K: the Laguna targets' Q4_K_M and Q6_K tensors)
quantizes its activation rows with ``quantize_row_q8_K`` first; on x86 with AVX2, patch 0041
vectorises it. Its claim is that nothing downstream changes: each block's scale, quants and sums
of 16 are the bytes ``quantize_row_q8_K_ref`` (ggml-base's scalar code) writes. The rows below
are built to catch what a vector version can get wrong: the block's first value of the largest
magnitude decides the scale's sign (a later one of the other sign would negate every quant);
products that land halfway between integers round to even; values on the quant grid, sparse
rows, all-zero blocks (the reference writes no sums there, so both start from the same bytes),
denormals (whose scale overflows), infinities and NaNs (which the reference quantizes its own
way); one block and rows of many.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from helpers.kernel_rows import _lib_dir

QK_K = 256
BLOCK_BYTES = 4 + QK_K + 2 * (QK_K // 16)  # float d, 256 quants, 16 int16 sums


@pytest.fixture(scope="module")
def quantizers():
    import llama_cpp.llama_cpp  # noqa: F401  (loads the libraries with their dependencies)

    d = _lib_dir()
    base = ctypes.CDLL(str(d / "libggml-base.so"))
    cpu = ctypes.CDLL(str(d / "libggml-cpu.so"))
    fns = (cpu.quantize_row_q8_K, base.quantize_row_q8_K_ref)
    for f in fns:
        f.argtypes, f.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    return fns


def _quantize(fn, x: np.ndarray) -> bytes:
    x = np.ascontiguousarray(x, np.float32)
    out = np.full(len(x) // QK_K * BLOCK_BYTES, 0x5A, np.uint8)  # the same bytes where nothing is written
    fn(x.ctypes.data, out.ctypes.data, len(x))
    return out.tobytes()


def _rows(rng: np.random.Generator) -> dict[str, np.ndarray]:
    n = 8 * QK_K
    wide = (rng.random(n, dtype=np.float32) - 0.5) * np.float32(10.0) ** rng.integers(-4, 5, n).astype(np.float32)
    ties = rng.integers(-126, 126, QK_K).astype(np.float32) + np.float32(0.5)
    ties[5] = -127.0  # the block's largest magnitude: the scale is exactly 1, every other product a half
    first_max = rng.standard_normal(QK_K).astype(np.float32)
    first_max[[3, 200]] = (4.0, -4.0)  # the first of two equal magnitudes sets the sign
    last_lane_max = rng.standard_normal(QK_K).astype(np.float32)
    last_lane_max[255] = -9.0
    grid = rng.integers(-127, 128, n).astype(np.float32) / np.float32(127.0) * np.float32(3.0)
    sparse = np.where(rng.random(n) < 0.9, np.float32(0.0), rng.standard_normal(n).astype(np.float32))
    zero_block = rng.standard_normal(3 * QK_K).astype(np.float32)
    zero_block[QK_K:2 * QK_K] = 0.0
    denormal = (rng.integers(-3, 4, 2 * QK_K) * 1e-40).astype(np.float32)
    non_finite = rng.standard_normal(4 * QK_K).astype(np.float32)
    non_finite[[7, QK_K + 100, 2 * QK_K + 255]] = (np.inf, -np.inf, np.nan)
    return {"wide": wide, "ties": ties, "first-max": first_max, "last-lane-max": last_lane_max, "grid": grid,
            "sparse": sparse, "zero-block": zero_block, "denormal": denormal, "non-finite": non_finite}


@pytest.mark.parametrize("kind", list(_rows(np.random.default_rng(0))))
def test_the_backend_writes_the_reference_bytes(quantizers, kind):
    backend, reference = quantizers
    for seed in range(20):
        x = _rows(np.random.default_rng(seed))[kind]
        got, want = _quantize(backend, x), _quantize(reference, x)
        if got != want:
            block = next(i for i in range(len(x) // QK_K)
                         if got[i * BLOCK_BYTES:(i + 1) * BLOCK_BYTES] != want[i * BLOCK_BYTES:(i + 1) * BLOCK_BYTES])
            pytest.fail(f"{kind}, seed {seed}: block {block} differs from quantize_row_q8_K_ref's bytes")


def test_the_quants_are_what_the_reference_defines(quantizers):
    """The reference itself, read back: a block's scale from its first largest magnitude, each
    quant the product rounded half to even, the sums of 16 (so the comparison above compares
    against the algorithm, not against a second copy of a mistake)."""
    backend, _ = quantizers
    rng = np.random.default_rng(7)
    x = rng.standard_normal(2 * QK_K).astype(np.float32)
    x[[10, 300]] = (-6.0, 7.5)
    raw = np.frombuffer(_quantize(backend, x), np.uint8).reshape(2, BLOCK_BYTES)
    for b, amax_value in enumerate((-6.0, 7.5)):
        d = raw[b, :4].view(np.float32)[0]
        qs = raw[b, 4:4 + QK_K].view(np.int8).astype(np.int32)
        sums = raw[b, 4 + QK_K:].view(np.int16).astype(np.int32)
        iscale = np.float32(-127.0) / np.float32(amax_value)
        want = np.minimum(np.rint(iscale * x[b * QK_K:(b + 1) * QK_K]).astype(np.int32), 127)
        assert d == np.float32(1.0) / iscale
        np.testing.assert_array_equal(qs, want)
        np.testing.assert_array_equal(sums, want.reshape(16, 16).sum(axis=1))
