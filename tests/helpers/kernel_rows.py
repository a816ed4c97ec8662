"""ggml's CPU matmul driven directly through ctypes (no model, no llama.cpp graph): one
``ggml_mul_mat`` with the shapes and types of the target's attention matmuls, computed once with
n rows and once per row alone, compared bit for bit (a verify row must be the one-row decode
step's for greedy speculation to be exact). scripts/investigate/kernel_rows.py asks the
question over many shapes; tests/test_exact_f16.py holds the answer.

Shapes named after llama.cpp's non-flash attention (``build_attn_mha``): ``kq`` multiplies the F16
K cache view [head_dim, n_kv, n_head_kv] by the permuted F32 queries [head_dim, rows, n_head];
``kqv`` multiplies the transposed F16 V cache [n_kv, head_dim, n_head_kv] by the F32
probabilities [n_kv, rows, n_head].
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np

GGML_TYPE_F32, GGML_TYPE_F16 = 0, 1
_NP = {GGML_TYPE_F32: np.float32, GGML_TYPE_F16: np.float16}


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _lib_dir() -> Path:
    import os

    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    if override:
        return Path(override)
    import llama_cpp

    return Path(llama_cpp.__file__).parent / "lib"


class Ggml:
    """The handful of ggml entry points a matmul or an attention op needs, from the libraries
    llama_cpp loads (tests/helpers/kernel_attention.py drives ``ggml_flash_attn_ext``)."""

    def __init__(self) -> None:
        import llama_cpp.llama_cpp  # noqa: F401  (loads libggml-base/libggml-cpu with their dependencies)

        d = _lib_dir()
        base = ctypes.CDLL(str(d / "libggml-base.so"))
        cpu = ctypes.CDLL(str(d / "libggml-cpu.so"))
        p = ctypes.c_void_p
        i64 = ctypes.c_int64
        sigs = {
            (base, "ggml_init"): ([_InitParams], p),
            (base, "ggml_free"): ([p], None),
            (base, "ggml_new_tensor_3d"): ([p, ctypes.c_int, i64, i64, i64], p),
            (base, "ggml_new_tensor_4d"): ([p, ctypes.c_int, i64, i64, i64, i64], p),
            (base, "ggml_flash_attn_ext"): ([p, p, p, p, p, ctypes.c_float, ctypes.c_float, ctypes.c_float], p),
            (base, "ggml_permute"): ([p, p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int], p),
            (base, "ggml_mul_mat"): ([p, p, p], p),
            (base, "ggml_new_graph"): ([p], p),
            (base, "ggml_build_forward_expand"): ([p, p], None),
            (base, "ggml_get_data"): ([p], p),
            (base, "ggml_nbytes"): ([p], ctypes.c_size_t),
            (cpu, "ggml_graph_compute_with_ctx"): ([p, p, ctypes.c_int], ctypes.c_int),
            (cpu, "ggml_cpu_init"): ([], None),
        }
        for (lib, name), (args, res) in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
            setattr(self, name, fn)
        self.ggml_cpu_init()

    def fill(self, t: int, values: np.ndarray) -> None:
        n = self.ggml_nbytes(t)
        assert values.nbytes == n, (values.nbytes, n)
        ctypes.memmove(self.ggml_get_data(t), values.ctypes.data, n)

    def read(self, t: int, shape: tuple[int, ...]) -> np.ndarray:
        out = np.empty(shape, np.float32)
        ctypes.memmove(out.ctypes.data, self.ggml_get_data(t), out.nbytes)
        return out


@dataclass(frozen=True)
class MatmulShape:
    """One matmul as an op of the target issues it: ``name`` (kq or kqv) at these widths."""

    name: str
    head_dim: int
    n_kv: int
    n_head: int
    n_head_kv: int


def attention_matmul(g: Ggml, shape: MatmulShape, queries: np.ndarray, cache: np.ndarray, n_threads: int,
                     cache_type: int = GGML_TYPE_F16) -> np.ndarray:
    """Compute ``shape.name`` for ``queries`` (rows x n_head x inner, float32) against the
    ``cache`` (n_head_kv x outer x inner) stored as ``cache_type`` (F16, the default KV cache,
    or F32); returns rows x n_head x outer, float32."""
    rows, n_head, inner = queries.shape
    n_head_kv, outer, _ = cache.shape
    mem = 64 * 2**20 + 4 * (queries.nbytes + cache.nbytes + rows * n_head * outer * 4)
    ctx = g.ggml_init(_InitParams(mem, None, False))
    if not ctx:
        raise RuntimeError("ggml_init failed")
    try:
        a = g.ggml_new_tensor_3d(ctx, cache_type, inner, outer, n_head_kv)
        g.fill(a, np.ascontiguousarray(cache, _NP[cache_type]))
        if shape.name == "kq":
            # queries are stored [inner, n_head, rows] and permuted, as llama.cpp permutes q
            q = g.ggml_new_tensor_3d(ctx, GGML_TYPE_F32, inner, n_head, rows)
            g.fill(q, np.ascontiguousarray(queries, np.float32))
            b = g.ggml_permute(ctx, q, 0, 2, 1, 3)
        else:
            # the softmax output is contiguous [n_kv, rows, n_head]
            b = g.ggml_new_tensor_3d(ctx, GGML_TYPE_F32, inner, rows, n_head)
            g.fill(b, np.ascontiguousarray(queries.transpose(1, 0, 2), np.float32))
        out = g.ggml_mul_mat(ctx, a, b)
        gf = g.ggml_new_graph(ctx)
        g.ggml_build_forward_expand(gf, out)
        status = g.ggml_graph_compute_with_ctx(ctx, gf, n_threads)
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute failed ({status})")
        return g.read(out, (n_head, rows, outer)).transpose(1, 0, 2).copy()
    finally:
        g.ggml_free(ctx)


def inputs(shape: MatmulShape, rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if shape.name == "kq":
        inner, outer = shape.head_dim, shape.n_kv
        q = rng.standard_normal((rows, shape.n_head, inner)).astype(np.float32)
    else:
        inner, outer = shape.n_kv, shape.head_dim
        logits = rng.standard_normal((rows, shape.n_head, inner)) * 3
        q = np.exp(logits - logits.max(-1, keepdims=True))
        q = (q / q.sum(-1, keepdims=True)).astype(np.float32)
    cache = rng.standard_normal((shape.n_head_kv, outer, inner)).astype(np.float16)
    return q, cache


def row_mismatches(g: Ggml, shape: MatmulShape, rows: int, n_threads: int, seed: int = 0,
                   cache_type: int = GGML_TYPE_F16) -> tuple[int, float]:
    """Rows of an n-row matmul that differ from the same row computed alone: (count, max |diff|)."""
    q, cache = inputs(shape, rows, seed)
    batch = attention_matmul(g, shape, q, cache, n_threads, cache_type)
    bad, worst = 0, 0.0
    for r in range(rows):
        alone = attention_matmul(g, shape, q[r:r + 1], cache, n_threads, cache_type)[0]
        if not np.array_equal(alone.view(np.uint32), batch[r].view(np.uint32)):
            bad += 1
            worst = max(worst, float(np.abs(alone - batch[r]).max()))
    return bad, worst


#: the demo target (head_dim 32, 8 query heads on sliding layers, 2 KV heads) and XS 2.1
#: (head_dim 128, 64 query heads, 8 KV heads), at cache lengths llama.cpp pads to (256)
SHAPES = [
    MatmulShape("kq", 32, 256, 8, 2), MatmulShape("kqv", 32, 256, 8, 2),
    MatmulShape("kq", 32, 2048, 4, 2), MatmulShape("kqv", 32, 2048, 4, 2),
    MatmulShape("kq", 128, 512, 64, 8), MatmulShape("kqv", 128, 512, 64, 8),
]
