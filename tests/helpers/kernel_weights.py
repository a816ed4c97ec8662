"""The target's weight matmuls (``ggml_mul_mat`` on a quantized weight, ``ggml_mul_mat_id`` on the
experts) in the installed wheel's CPU backend, driven through ctypes exactly as llama.cpp runs
them: the weight lives in the buffer llama.cpp would put it in (``CPU_REPACK`` when the backend
repacks its type, Q4_K, Q6_K and Q8_0 on x86; a plain CPU buffer otherwise), the activations are F32, and the
graph is computed by the CPU backend. No model and no llama.cpp graph are involved.
scripts/investigate/kernel_weights.py times and checks them at XS widths;
tests/test_verify_rows_weights.py holds the row-invariance answer.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass

import numpy as np

from laguna_dflash.runtime.threadpool import PoolParams, pool_params

from .kernel_rows import _InitParams, _lib_dir

TYPES = {"f32": 0, "f16": 1, "q8_0": 8, "q4_K": 12, "q6_K": 14}
#: types whose weights llama.cpp puts in the CPU_REPACK buffer on x86 (repack.cpp's
#: ggml_repack_get_optimal_repack_type with AVX2); the others stay in a plain CPU buffer, where
#: the repack buffer would hold them without the traits its compute path needs
REPACKED_X86 = {"q4_K", "q6_K", "q8_0"}


class Backend:
    """The CPU backend and the ggml calls a weight matmul needs (ctypes over the wheel's libraries)."""

    def __init__(self, n_threads: int = 1, own_pool: bool = False) -> None:
        """``own_pool``: the graphs run on one ggml thread pool kept for the backend's life, as
        the runtime's contexts do (runtime/threadpool.py); without it ggml makes a fresh pool, and
        fresh counts, for every graph. The pool is made by this backend's own copy of the CPU
        library (loaded by path below), not by runtime.threadpool.ThreadPool, whose library is
        the one llama.cpp loaded by its soname: a separate file in the wheel, so another copy."""
        import llama_cpp.llama_cpp  # noqa: F401  (loads the libraries with their dependencies)

        d = _lib_dir()
        base = self.base = ctypes.CDLL(str(d / "libggml-base.so"))
        cpu = ctypes.CDLL(str(d / "libggml-cpu.so"))
        p, i64, sz = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t
        sigs = {
            (base, "ggml_init"): ([_InitParams], p),
            (base, "ggml_free"): ([p], None),
            (base, "ggml_new_tensor_2d"): ([p, ctypes.c_int, i64, i64], p),
            (base, "ggml_new_tensor_3d"): ([p, ctypes.c_int, i64, i64, i64], p),
            (base, "ggml_mul_mat"): ([p, p, p], p),
            (base, "ggml_mul_mat_id"): ([p, p, p, p], p),
            (base, "ggml_new_graph"): ([p], p),
            (base, "ggml_build_forward_expand"): ([p, p], None),
            (base, "ggml_nbytes"): ([p], sz),
            (base, "ggml_row_size"): ([ctypes.c_int, i64], sz),
            (base, "ggml_quantize_chunk"): ([ctypes.c_int, p, p, i64, i64, i64, p], sz),
            (base, "ggml_backend_alloc_ctx_tensors_from_buft"): ([p, p], p),
            (base, "ggml_backend_buffer_free"): ([p], None),
            (base, "ggml_backend_tensor_set"): ([p, p, sz, sz], None),
            (base, "ggml_backend_tensor_get"): ([p, p, sz, sz], None),
            (base, "ggml_backend_graph_compute"): ([p, p], ctypes.c_int),
            (base, "ggml_backend_get_device"): ([p], p),
            (base, "ggml_backend_dev_backend_reg"): ([p], p),
            (base, "ggml_backend_reg_get_proc_address"): ([p, ctypes.c_char_p], p),
            (base, "ggml_backend_buft_name"): ([p], ctypes.c_char_p),
            (base, "ggml_backend_get_default_buffer_type"): ([p], p),
            (cpu, "ggml_backend_cpu_init"): ([], p),
            (cpu, "ggml_backend_cpu_set_n_threads"): ([p, ctypes.c_int], None),
            (cpu, "ggml_backend_cpu_set_threadpool"): ([p, p], None),
            (cpu, "ggml_threadpool_new"): ([ctypes.POINTER(PoolParams)], p),
            (cpu, "ggml_threadpool_free"): ([p], None),
        }
        self.bind(sigs)
        self.backend = self.ggml_backend_cpu_init()
        self.ggml_backend_cpu_set_n_threads(self.backend, n_threads)
        self.pool = None
        if own_pool:
            params = pool_params(n_threads)
            self.pool = self.ggml_threadpool_new(ctypes.byref(params))
            self.ggml_backend_cpu_set_threadpool(self.backend, self.pool)
        self.cpu_buft = self.ggml_backend_get_default_buffer_type(self.backend)
        dev = self.ggml_backend_get_device(self.backend)
        reg = self.ggml_backend_dev_backend_reg(dev)
        get_extra = self.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
        self.repack_buft = None
        if get_extra:
            arr = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(get_extra)(dev)
            i = 0
            while arr[i]:
                if self.ggml_backend_buft_name(arr[i]) == b"CPU_REPACK":
                    self.repack_buft = arr[i]
                i += 1

    def close(self) -> None:
        """Free the thread pool of ``own_pool`` (its workers otherwise sleep until the process ends)."""
        if self.pool:
            self.ggml_backend_cpu_set_threadpool(self.backend, None)
            self.ggml_threadpool_free(self.pool)
            self.pool = None

    def bind(self, sigs: dict) -> None:
        """Give the functions ``{(library, name): (argtypes, restype)}`` their types and make
        them attributes of this backend."""
        for (lib, name), (args, res) in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
            setattr(self, name, fn)

    def quantize(self, type_id: int, w: np.ndarray) -> bytes:
        rows, cols = w.shape
        w = np.ascontiguousarray(w, np.float32)
        if type_id == TYPES["f32"]:
            return w.tobytes()
        if type_id == TYPES["f16"]:
            return w.astype(np.float16).tobytes()
        out = ctypes.create_string_buffer(self.ggml_row_size(type_id, cols) * rows)
        self.ggml_quantize_chunk(type_id, w.ctypes.data, out, 0, rows, cols, None)
        return out.raw


@dataclass(frozen=True)
class WeightShape:
    """A weight matmul of the target: ``name``, ``type``, in -> out features; ``n_expert`` > 0
    makes it a ``ggml_mul_mat_id`` over that many experts with ``n_used`` picked per row."""

    name: str
    type: str
    n_in: int
    n_out: int
    n_expert: int = 0
    n_used: int = 0


class Product:
    """One weight matmul, set up once (the weight quantized and placed), run for any row count."""

    def __init__(self, be: Backend, shape: WeightShape, seed: int = 0, repack: bool | None = None,
                 raw: bytes | None = None) -> None:
        """``raw``: one matrix's quantized bytes (every expert's) instead of random weights."""
        self.be, self.shape = be, shape
        rng = np.random.default_rng(seed)
        t = TYPES[shape.type]
        n_mat = max(1, shape.n_expert)
        self.wctx = be.ggml_init(_InitParams(1 << 20, None, True))
        if shape.n_expert:
            self.w = be.ggml_new_tensor_3d(self.wctx, t, shape.n_in, shape.n_out, n_mat)
        else:
            self.w = be.ggml_new_tensor_2d(self.wctx, t, shape.n_in, shape.n_out)
        if repack is None:
            repack = shape.type in REPACKED_X86
        buft = be.repack_buft if (repack and be.repack_buft) else be.cpu_buft
        self.wbuf = be.ggml_backend_alloc_ctx_tensors_from_buft(self.wctx, buft)
        if not self.wbuf:
            raise RuntimeError(f"{shape}: could not allocate the weight")
        if raw is not None:
            data = raw * n_mat
        else:
            data = b"".join(be.quantize(t, rng.standard_normal((shape.n_out, shape.n_in)).astype(np.float32) * 0.02)
                            for _ in range(n_mat))
        be.ggml_backend_tensor_set(self.w, data, 0, len(data))
        self.rng = rng

    def inputs(self, rows: int, seed: int, shared_routing: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """Random activations, and for experts random picks per row (``shared_routing``: every
        row picks the first row's experts, the case where a verify's rows share weights)."""
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((rows, self.shape.n_in)).astype(np.float32)
        ids = None
        if self.shape.n_expert:
            ids = np.stack([rng.choice(self.shape.n_expert, self.shape.n_used, replace=False)
                            for _ in range(rows)]).astype(np.int32)
            if shared_routing:
                ids[:] = ids[0]
        return x, ids

    def run(self, x: np.ndarray, ids: np.ndarray | None, reps: int = 1) -> tuple[np.ndarray, list[float]]:
        """Compute the product for the rows of ``x``; returns the output (rows x [n_used x] n_out)
        and the CPU seconds of each of ``reps`` computations of the same graph. The output starts
        as NaN: a new buffer often lands on the memory of the last one freed, whose outputs an
        output left unwritten would otherwise show."""
        be, s = self.be, self.shape
        rows = x.shape[0]
        ctx = be.ggml_init(_InitParams(1 << 20, None, True))
        try:
            if s.n_expert:
                # mul_mat_id: b is [n_in, 1, rows] (one input row shared by a row's experts), ids [n_used, rows]
                b = be.ggml_new_tensor_3d(ctx, TYPES["f32"], s.n_in, 1, rows)
                idt = be.ggml_new_tensor_2d(ctx, 26, s.n_used, rows)  # GGML_TYPE_I32
                out = be.ggml_mul_mat_id(ctx, self.w, b, idt)
                out_shape = (rows, s.n_used, s.n_out)
            else:
                b = be.ggml_new_tensor_2d(ctx, TYPES["f32"], s.n_in, rows)
                out = be.ggml_mul_mat(ctx, self.w, b)
                out_shape = (rows, s.n_out)
            gf = be.ggml_new_graph(ctx)
            be.ggml_build_forward_expand(gf, out)
            buf = be.ggml_backend_alloc_ctx_tensors_from_buft(ctx, be.cpu_buft)
            try:
                be.ggml_backend_tensor_set(b, x.ctypes.data, 0, x.nbytes)
                if s.n_expert:
                    be.ggml_backend_tensor_set(idt, ids.ctypes.data, 0, ids.nbytes)
                unwritten = np.full(out_shape, np.nan, np.float32)
                be.ggml_backend_tensor_set(out, unwritten.ctypes.data, 0, unwritten.nbytes)
                times = []
                for _ in range(reps):
                    c0 = time.process_time()
                    if be.ggml_backend_graph_compute(be.backend, gf) != 0:
                        raise RuntimeError(f"{s}: graph compute failed")
                    times.append(time.process_time() - c0)
                res = np.empty(out_shape, np.float32)
                be.ggml_backend_tensor_get(out, res.ctypes.data, 0, res.nbytes)
                return res, times
            finally:
                be.ggml_backend_buffer_free(buf)
        finally:
            be.ggml_free(ctx)

    def row_mismatches(self, rows: int, seed: int = 1, shared_routing: bool = False) -> tuple[int, float]:
        x, ids = self.inputs(rows, seed, shared_routing)
        batch, _ = self.run(x, ids)
        bad, worst = 0, 0.0
        for r in range(rows):
            alone, _ = self.run(x[r:r + 1], None if ids is None else ids[r:r + 1])
            if not np.array_equal(alone[0].view(np.uint32), batch[r].view(np.uint32)):
                bad += 1
                worst = max(worst, float(np.abs(alone[0] - batch[r]).max()))
        return bad, worst


def rows_bound(monkeypatch, tensors, features=None):
    """runtime/batch.py's rows bound for a target whose header holds ``tensors`` ((type, shape)
    pairs, gguf's types) on a CPU backend listing ``features`` (None: the installed one's)."""
    from types import SimpleNamespace

    from laguna_dflash.convert.gguf.header import TensorInfo
    from laguna_dflash.runtime import batch

    infos = [TensorInfo(f"t{i}", shape, q, 0, 0) for i, (q, shape) in enumerate(tensors)]
    monkeypatch.setattr(batch, "read_header_cached", lambda path: SimpleNamespace(tensors=infos))
    return batch.pass_rows_bound(SimpleNamespace(path="x.gguf"), None if features is None else frozenset(features))
