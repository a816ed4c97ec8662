"""ggml's CPU flash attention (``ggml_flash_attn_ext``) driven directly through ctypes, no model:
queries against a K/V cache with a mask, as llama.cpp's attention issues it for a CPU-resident
target, and the same in float64 numpy as the reference. tests/test_flash_attention_rows.py asks
whether a row comes out the same in any pass and whether it is right.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kernel_rows import _NP, GGML_TYPE_F16, GGML_TYPE_F32, Ggml, _InitParams


@dataclass(frozen=True)
class AttentionShape:
    """Head width, query heads and KV heads of one attention layer."""

    head_dim: int
    n_head: int
    n_head_kv: int


#: the tiny target's layers (head_dim 16, 8 query heads, 2 KV heads) and XS 2.1's (128, 64, 8)
#: with fewer heads, which the kernel treats alike
TINY = AttentionShape(16, 8, 2)
XS_LIKE = AttentionShape(128, 8, 2)


def flash_attention(fa: Ggml, queries: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray,
                    n_threads: int, cache_type: int = GGML_TYPE_F16) -> np.ndarray:
    """``queries`` rows x n_head x head_dim (float32), ``k`` and ``v`` n_head_kv x n_kv x head_dim
    (stored as ``cache_type``), ``mask`` rows x n_kv (0 or -inf, stored as F16); returns rows x
    n_head x head_dim, float32, with llama.cpp's scale 1/sqrt(head_dim)."""
    rows, n_head, dk = queries.shape
    n_head_kv, n_kv, dv = v.shape
    cache_bytes = k.size * np.dtype(_NP[cache_type]).itemsize * 2
    mem = 16 * 2**20 + 2 * (queries.nbytes + cache_bytes + mask.size * 2 + rows * n_head * dv * 4)
    ctx = fa.ggml_init(_InitParams(mem, None, False))
    if not ctx:
        raise RuntimeError("ggml_init failed")
    try:
        q = fa.ggml_new_tensor_4d(ctx, GGML_TYPE_F32, dk, rows, n_head, 1)
        fa.fill(q, np.ascontiguousarray(queries.transpose(1, 0, 2), np.float32))
        kt = fa.ggml_new_tensor_4d(ctx, cache_type, dk, n_kv, n_head_kv, 1)
        fa.fill(kt, np.ascontiguousarray(k, _NP[cache_type]))
        vt = fa.ggml_new_tensor_4d(ctx, cache_type, dv, n_kv, n_head_kv, 1)
        fa.fill(vt, np.ascontiguousarray(v, _NP[cache_type]))
        mt = fa.ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, rows, 1, 1)
        fa.fill(mt, np.ascontiguousarray(mask, np.float16))
        out = fa.ggml_flash_attn_ext(ctx, q, kt, vt, mt, 1.0 / np.sqrt(dk), 0.0, 0.0)
        gf = fa.ggml_new_graph(ctx)
        fa.ggml_build_forward_expand(gf, out)
        status = fa.ggml_graph_compute_with_ctx(ctx, gf, n_threads)
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute failed ({status})")
        return fa.read(out, (rows, n_head, dv))
    finally:
        fa.ggml_free(ctx)


def reference(queries: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray,
              cache_type: int = GGML_TYPE_F16) -> np.ndarray:
    """The same attention in float64 over the cache's stored values."""
    rows, n_head, dk = queries.shape
    group = n_head // k.shape[0]
    kk = np.repeat(np.asarray(k, _NP[cache_type]).astype(np.float64), group, axis=0)
    vv = np.repeat(np.asarray(v, _NP[cache_type]).astype(np.float64), group, axis=0)
    s = np.einsum("rhd,hcd->rhc", queries.astype(np.float64), kk) / np.sqrt(dk) + mask[:, None, :]
    s = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("rhc,hcd->rhd", s / s.sum(-1, keepdims=True), vv)


def inputs(shape: AttentionShape, rows: int, n_kv: int, seed: int, window: int | None = None
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Random queries and cache; a causal mask for ``rows`` new tokens at the cache's end, the
    last ``window`` positions only when given (a sliding-window layer)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((rows, shape.n_head, shape.head_dim)).astype(np.float32)
    k = rng.standard_normal((shape.n_head_kv, n_kv, shape.head_dim)).astype(np.float32)
    v = rng.standard_normal((shape.n_head_kv, n_kv, shape.head_dim)).astype(np.float32)
    pos = n_kv - rows + np.arange(rows)[:, None]
    cell = np.arange(n_kv)[None, :]
    visible = cell <= pos
    if window is not None:
        visible &= cell > pos - window
    mask = np.where(visible, 0.0, -np.inf).astype(np.float32)
    return q, k, v, mask
