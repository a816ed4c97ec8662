"""Elementwise ops of the target's graph (``ggml_rms_norm``, alone and fused with the norm's weight,
and the binary ops with a broadcast src1) in the installed wheel's CPU backend, through ctypes,
with NumPy references that compute what upstream's code computes in the same order: a row's
sum of squares as one chain of double additions, every other step one float32 operation. Used by
tests/test_elementwise_rows.py.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .kernel_rows import _InitParams
from .kernel_weights import TYPES, Backend


class ElementwiseBackend(Backend):
    """The CPU backend with the ggml calls of rms_norm and the binary ops."""

    def __init__(self, n_threads: int = 1) -> None:
        super().__init__(n_threads)
        base, p, i64 = self.base, ctypes.c_void_p, ctypes.c_int64
        self.bind({
            (base, "ggml_new_tensor_4d"): ([p, ctypes.c_int, i64, i64, i64, i64], p),
            (base, "ggml_rms_norm"): ([p, p, ctypes.c_float], p),
            (base, "ggml_mul"): ([p, p, p], p),
            (base, "ggml_add"): ([p, p, p], p),
        })

    def compute(self, build, inputs: list[np.ndarray], out_shape: tuple[int, ...]) -> np.ndarray:
        """Build ``build(ctx, *tensors)`` over F32 tensors holding ``inputs`` (NumPy arrays in
        row-major order, so ggml's ne0 is the last axis), compute it and return the result."""
        ctx = self.ggml_init(_InitParams(1 << 20, None, True))
        try:
            tensors = []
            for a in inputs:
                ne = list(reversed(a.shape)) + [1] * (4 - a.ndim)
                tensors.append(self.ggml_new_tensor_4d(ctx, TYPES["f32"], *ne))
            out = build(ctx, *tensors)
            gf = self.ggml_new_graph(ctx)
            self.ggml_build_forward_expand(gf, out)
            buf = self.ggml_backend_alloc_ctx_tensors_from_buft(ctx, self.cpu_buft)
            try:
                for t, a in zip(tensors, inputs):
                    a = np.ascontiguousarray(a, np.float32)
                    self.ggml_backend_tensor_set(t, a.ctypes.data, 0, a.nbytes)
                if self.ggml_backend_graph_compute(self.backend, gf) != 0:
                    raise RuntimeError("graph compute failed")
                res = np.empty(out_shape, np.float32)
                self.ggml_backend_tensor_get(out, res.ctypes.data, 0, res.nbytes)
                return res
            finally:
                self.ggml_backend_buffer_free(buf)
        finally:
            self.ggml_free(ctx)

    def rms_norm(self, x: np.ndarray, eps: float, weight: np.ndarray | None = None) -> np.ndarray:
        """rms_norm over the last axis of ``x``; with ``weight`` times it, which the CPU backend
        runs as one fused op."""
        if weight is None:
            return self.compute(lambda ctx, t: self.ggml_rms_norm(ctx, t, eps), [x], x.shape)
        return self.compute(lambda ctx, t, w: self.ggml_mul(ctx, self.ggml_rms_norm(ctx, t, eps), w),
                            [x, weight], x.shape)

    def binary(self, op: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``ggml_add`` or ``ggml_mul`` of ``x`` and ``y``, which ggml repeats to x's shape."""
        fn = {"add": self.ggml_add, "mul": self.ggml_mul}[op]
        return self.compute(lambda ctx, a, b: fn(ctx, a, b), [x, y], x.shape)


def rms_norm_reference(x: np.ndarray, eps: float, weight: np.ndarray | None = None) -> np.ndarray:
    """Upstream's rms_norm row by row: the float32 squares summed in double, in order; the mean
    rounded to float; 1 / sqrt(mean + eps) and the products in float32."""
    x = np.asarray(x, np.float32)
    rows = x.reshape(-1, x.shape[-1])
    out = np.empty_like(rows)
    n = rows.shape[1]
    w = None if weight is None else np.asarray(weight, np.float32)
    for i, row in enumerate(rows):
        # np.add.accumulate adds in order (np.sum would add pairwise)
        total = np.add.accumulate((row * row).astype(np.float64))[-1]
        mean = np.float32(total / n)
        scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
        out[i] = row * scale
        if w is not None:
            out[i] = out[i] * w
    return out.reshape(x.shape)


def repeat_to(y: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``y`` tiled to ``shape`` as ggml repeats a src1 (every axis a whole number of times)."""
    return np.tile(y, tuple(s // t for s, t in zip(shape, y.shape)))


def wide_values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Values over eight decades, so that a sum of squares added in another order would round
    differently somewhere."""
    return (rng.standard_normal(shape) * 10.0 ** rng.uniform(-5, 3, shape)).astype(np.float32)
