#!/usr/bin/env python3
"""Weight matmuls of the ggml CPU backend at XS widths: row invariance and time per row count.

The target's weight matmuls (``ggml_mul_mat`` on a quantized weight, ``ggml_mul_mat_id`` on the
experts) run in the installed wheel's CPU backend exactly as llama.cpp runs them: the weight
lives in the buffer llama.cpp would put it in (``CPU_REPACK`` when the backend repacks its type,
Q4_K on x86; a plain CPU buffer otherwise), the activations are F32, and the graph is computed by
the CPU backend. No model and no llama.cpp graph are involved.

Two questions per weight type and row count n:

* ``--check``: is every row of an n-row product bit-identical to the same row computed alone?
  (greedy speculative decoding is exact only if it is)
* ``--time``: CPU time of one product of n rows, median of ``--reps`` (one thread by default).

    python scripts/investigate/kernel_weights.py --check
    python scripts/investigate/kernel_weights.py --time --rows 1,2,3,4,5,8,9,16 --json w.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np


sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # scripts/: recorded.py and every folder's modules
from investigate.kernel_rows import _InitParams, _lib_dir  # noqa: E402
from recorded import command_line  # noqa: E402

TYPES = {"f32": 0, "f16": 1, "q8_0": 8, "q4_K": 12, "q6_K": 14}
#: types whose weights llama.cpp puts in the CPU_REPACK buffer on x86 (repack.cpp's
#: ggml_repack_get_optimal_repack_type with AVX2); the others stay in a plain CPU buffer, where
#: the repack buffer would hold them without the traits its compute path needs
REPACKED_X86 = {"q4_K"}


class Backend:
    """The CPU backend and the ggml calls a weight matmul needs (ctypes over the wheel's libraries)."""

    def __init__(self, n_threads: int = 1) -> None:
        import llama_cpp.llama_cpp  # noqa: F401  (loads the libraries with their dependencies)

        d = _lib_dir()
        base = ctypes.CDLL(str(d / "libggml-base.so"))
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
        }
        for (lib, name), (args, res) in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
            setattr(self, name, fn)
        self.backend = self.ggml_backend_cpu_init()
        self.ggml_backend_cpu_set_n_threads(self.backend, n_threads)
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

    def __init__(self, be: Backend, shape: WeightShape, seed: int = 0, repack: bool | None = None) -> None:
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
        and the CPU seconds of each of ``reps`` computations of the same graph."""
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


#: XS 2.1 weight matmuls of one MoE layer as the Q4_K_M file stores them (hidden 2048, 64 heads
#: of 128, 8 KV heads, 256 experts of 512 with 8 used, shared expert 512), and the output head.
XS_SHAPES = [
    WeightShape("attn_q", "q4_K", 2048, 8192),
    WeightShape("attn_output", "q4_K", 8192, 2048),
    WeightShape("attn_v (Q6_K layers)", "q6_K", 2048, 1024),
    WeightShape("ffn_up_shexp", "q4_K", 2048, 512),
    WeightShape("ffn_down (Q6_K layers)", "q6_K", 8192, 2048),
    WeightShape("ffn_up_exps", "q4_K", 2048, 512, 256, 8),
    WeightShape("ffn_down_exps", "q4_K", 512, 2048, 256, 8),
    WeightShape("ffn_down_exps (Q6_K layers)", "q6_K", 512, 2048, 256, 8),
    WeightShape("output", "q6_K", 2048, 100352 // 8),  # an eighth of the head: same per-row cost shape
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--rows", default="1,2,3,4,5,8,9,16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--only", default="", help="comma-separated substrings of shape names")
    ap.add_argument("--shared-routing", action="store_true", help="every row picks the same experts")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    be = Backend(args.threads)
    shapes = [s for s in XS_SHAPES if not args.only or any(o in s.name for o in args.only.split(","))]
    result = {"command": command_line(__file__, argv), "threads": args.threads,
              "shared_routing": args.shared_routing, "check": {}, "time_ms": {}}
    for s in shapes:
        prod = Product(be, s)
        if args.check:
            for n in rows:
                if n < 2:
                    continue
                bad, worst = prod.row_mismatches(n, shared_routing=args.shared_routing)
                result["check"].setdefault(s.name, {})[n] = bad
                print(f"check {s.name:28s} {s.type:5s} rows {n:2d}: {bad} rows differ from the row alone"
                      + (f" (max |diff| {worst:.2e})" if bad else ""), flush=True)
        if args.time:
            line = {}
            for n in rows:
                x, ids = prod.inputs(n, 2, args.shared_routing)
                _, times = prod.run(x, ids, reps=args.reps + 1)
                line[n] = 1e3 * statistics.median(times[1:])
            result["time_ms"][s.name] = line
            base = line.get(1)
            print(f"time  {s.name:28s} {s.type:5s} " + "  ".join(
                f"{n}:{v:.2f}" + (f"({v / base:.2f})" if base and n > 1 else "") for n, v in line.items()), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
