"""ggml's CPU flash attention, the op a CPU-resident target's attention runs: a row comes out
bit-identical in any pass, and right.

Greedy speculative decoding is exact only if a verify pass scores each of its rows as the
one-row step at that position would; the prompt cache and the batched slots also need a row not
to depend on the other rows of its pass, on the thread count, or on how far past the last used
cell the cache is padded. The op is driven directly (tests/helpers/kernel_attention.py): each
row of an n-row pass against the row alone, and against float64 numpy. The engine-level checks
(verify rows against steps at 3.3k tokens, a prompt cut anywhere) are in test_exact_f16.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers import kernel_attention as ka
from helpers.kernel_rows import GGML_TYPE_F16, GGML_TYPE_F32, Ggml

CACHE_TYPES = pytest.mark.parametrize("cache_type", [GGML_TYPE_F16, GGML_TYPE_F32], ids=["f16", "f32"])
SHAPES = pytest.mark.parametrize("shape", [ka.TINY, ka.XS_LIKE], ids=["tiny-d16", "xs-d128"])


def _vectorised_kernel() -> bool:
    """Whether this CPU runs the vectorised rows kernel (x86 with AVX2, FMA and F16C); others keep
    ggml's one-sweep kernel, whose F16 accumulator is further from float64."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return False
    return {"avx2", "fma", "f16c"} <= set(flags.split())


@pytest.fixture(scope="module")
def fa():
    return Ggml()


def _bits_differ(a: np.ndarray, b: np.ndarray) -> bool:
    return not np.array_equal(a.view(np.uint32), b.view(np.uint32))


@CACHE_TYPES
@SHAPES
@pytest.mark.parametrize("threads", [1, 2])
# 5: a depth-4 verify; 16 and 70: a prompt's passes (64 rows or more took a tiled kernel in
# ggml); 700 cells: a one-row pass over 512 or more was split between the threads in ggml
@pytest.mark.parametrize("rows,n_kv", [(5, 203), (16, 700), (70, 300), (1, 700)])
def test_each_row_of_a_pass_is_the_row_alone(fa, shape, cache_type, threads, rows, n_kv):
    q, k, v, mask = ka.inputs(shape, rows, n_kv, seed=rows + n_kv)
    batch = ka.flash_attention(fa, q, k, v, mask, threads, cache_type)
    alone_t1 = [ka.flash_attention(fa, q[r:r + 1], k, v, mask[r:r + 1], 1, cache_type)[0] for r in range(rows)]
    bad = [r for r in range(rows) if _bits_differ(batch[r], alone_t1[r])]
    assert not bad, f"rows {bad} of {rows} differ from the row alone at one thread"


@CACHE_TYPES
@SHAPES
def test_padding_past_the_last_used_cell_changes_no_row(fa, shape, cache_type):
    # llama.cpp pads the cache's length (256 cells on the CPU); the padding's cells are masked
    # and hold whatever was there: here NaN, which must not reach a row
    q, k, v, mask = ka.inputs(shape, 5, 203, seed=7, window=128)
    base = ka.flash_attention(fa, q, k, v, mask, 2, cache_type)
    for n_kv in (256, 512):
        pad = n_kv - 203
        kp = np.concatenate([k, np.full((k.shape[0], pad, k.shape[2]), np.nan, np.float32)], axis=1)
        vp = np.concatenate([v, np.full((v.shape[0], pad, v.shape[2]), np.nan, np.float32)], axis=1)
        mp = np.concatenate([mask, np.full((5, pad), -np.inf, np.float32)], axis=1)
        padded = ka.flash_attention(fa, q, kp, vp, mp, 2, cache_type)
        assert not _bits_differ(base, padded), f"padding to {n_kv} cells changed the rows"


@pytest.mark.skipif(not _vectorised_kernel(), reason="ggml's one-sweep kernel on this CPU (no AVX2, FMA or F16C)")
@CACHE_TYPES
@SHAPES
@pytest.mark.parametrize("window", [None, 128], ids=["full", "sliding"])
def test_rows_match_float64_attention(fa, shape, cache_type, window):
    q, k, v, mask = ka.inputs(shape, 9, 1000, seed=3, window=window)
    # a few heavy cells, so the softmax is not flat: a wrong max or a lost rescale shows
    k[:, 500:503] *= 4
    got = ka.flash_attention(fa, q, k, v, mask, 2, cache_type)
    want = ka.reference(q, k, v, mask, cache_type)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)


# head widths around the AVX-512 kernel's blocks of 128 columns (16 and 64: part of one; 192: one
# and a part; 256: two), over caches large enough that a KV head's rows read them together (256
# KiB a KV head: 4,500 cells at width 16, 1,100 at the others)
WIDE_SHAPES = pytest.mark.parametrize("shape,n_kv", [(ka.TINY, 4500), (ka.AttentionShape(64, 8, 2), 1100),
                                                     (ka.AttentionShape(192, 4, 2), 1100),
                                                     (ka.AttentionShape(256, 4, 1), 1100)],
                                      ids=["d16", "d64", "d192", "d256"])


@CACHE_TYPES
@WIDE_SHAPES
# 3 and 33 rows: groups of several sizes, odd ones among them, as the two threads split the rows
@pytest.mark.parametrize("rows", [3, 33])
def test_rows_read_together_are_each_the_row_alone_and_right(fa, shape, n_kv, cache_type, rows):
    q, k, v, mask = ka.inputs(shape, rows, n_kv, seed=rows, window=700)
    k[:, 500:503] *= 4
    batch = ka.flash_attention(fa, q, k, v, mask, 2, cache_type)
    alone = [ka.flash_attention(fa, q[r:r + 1], k, v, mask[r:r + 1], 1, cache_type)[0] for r in range(rows)]
    bad = [r for r in range(rows) if _bits_differ(batch[r], alone[r])]
    assert not bad, f"rows {bad} of {rows} differ from the row alone"
    if _vectorised_kernel():
        np.testing.assert_allclose(batch, ka.reference(q, k, v, mask, cache_type), rtol=0, atol=2e-5)
