"""The elementwise ops of a pass compute every row as upstream's code does, in any batch.

Patch 0040 runs rms_norm's sums of squares for up to eight rows in lockstep and binary ops with
a one-value-per-row src1 as one vectorised loop, with row indices advanced instead of divided
out. Its claim is exactness: each row's sum is the same chain of double additions in the same
order, each other output the same float32 operation on the same operands. So every output here
must equal, bit for bit, a NumPy reference that computes upstream's order row by row: a sum
taken in float32 lanes, a src1 value read from the wrong row when the indices wrap, a row scaled
by another row's norm or weight, or a row's result depending on its neighbours or on the thread
split would each fail it. The values span eight decades, so that a changed rounding shows.

Shapes: the tiny target's heads (32 wide, 4 or 8 to a row) and hidden rows (128), the XS
drafter's and target's 2,048; 1, 5 and 20 rows (a plain step, a verify pass at depth 4, four
streams at depth 4); one and two threads, whose row ranges start inside a head's group.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.elementwise import ElementwiseBackend, repeat_to, rms_norm_reference, wide_values

EPS = 1e-6
#: (width, heads) of rms_norm's rows: a query's heads, a key's, the hidden row, an XS-wide row
NORM_SHAPES = [(32, 8), (32, 2), (128, 1), (2048, 1)]
TOKENS = (1, 5, 20)


@pytest.fixture(scope="module", params=[1, 2], ids=["t1", "t2"])
def backend(request):
    return ElementwiseBackend(n_threads=request.param)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("width,heads", NORM_SHAPES)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("fused", [True, False], ids=["with-weight", "alone"])
def test_rms_norm_rows_match_upstream_order(backend, width, heads, tokens, fused):
    rng = np.random.default_rng(width * 1000 + heads * 100 + tokens)
    x = wide_values(rng, (tokens, heads, width))
    w = (1.0 + 0.1 * rng.standard_normal(width)).astype(np.float32) if fused else None
    got = backend.rms_norm(x, EPS, w)
    want = rms_norm_reference(x, EPS, w)
    bad = [(t, h) for t in range(tokens) for h in range(heads) if not _same_bits(got[t, h], want[t, h])]
    assert not bad, f"rows differing from upstream's order: {bad[:8]} of {tokens * heads}"


def test_rms_norm_reference_tells_a_float_sum_apart():
    """The reference would catch the sum vectorised in float32 lanes (eight accumulators, then
    added): on these values it changes the norm's bits in some rows. (Reassociating the double
    sum moves it by about 1e-16, which the mean's rounding to float hides.)"""
    rng = np.random.default_rng(7)
    x = wide_values(rng, (64, 128))
    changed = 0
    for row in x:
        squares = row * row
        in_order = np.add.accumulate(squares.astype(np.float64))[-1]
        lanes = np.zeros(8, np.float32)
        for k in range(0, 128, 8):
            lanes = lanes + squares[k:k + 8]
        changed += np.float32(in_order / 128) != np.float32(np.float64(lanes.sum(dtype=np.float32)) / 128)
    assert changed > 0


# (x's shape, src1's shape) in NumPy order (ggml's ne0 last): the attention's per-head gate and the
# MoE routing weights (one value per row); src1 repeated along every axis; a full row broadcast
BINARY_SHAPES = [
    ((20, 8, 32), (20, 8, 1)),
    ((5, 2, 128), (5, 2, 1)),
    ((1, 4, 32), (1, 4, 1)),
    ((2, 3, 4, 32), (2, 1, 2, 1)),
    ((2, 3, 4, 32), (1, 3, 2, 32)),
    ((3, 5, 7, 16), (1, 1, 7, 16)),
    ((20, 128), (1, 128)),
    ((4, 1, 16), (4, 1, 1)),
    ((2, 3, 1, 16), (1, 3, 1, 1)),
    ((3, 5, 7, 64), (3, 5, 7, 64)),
]


@pytest.mark.parametrize("op", ["mul", "add"])
@pytest.mark.parametrize("x_shape,y_shape", BINARY_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_binary_op_rows_match_float32(backend, op, x_shape, y_shape):
    rng = np.random.default_rng(len(x_shape) * 100 + x_shape[-1])
    x = wide_values(rng, x_shape)
    y = wide_values(rng, y_shape)
    got = backend.binary(op, x, y)
    full = repeat_to(y, x_shape)
    want = x * full if op == "mul" else x + full
    rows = got.reshape(-1, x_shape[-1])
    bad = [i for i, (g, w) in enumerate(zip(rows, want.reshape(-1, x_shape[-1]))) if not _same_bits(g, w)]
    assert not bad, f"rows differing from float32 {op}: {bad[:8]} of {len(rows)}"
