"""A thin, checked layer over llama-cpp-python's low-level API: models, contexts, batches.

Every call into libllama that could trip a GGML_ASSERT (which kills the whole Python process)
is guarded here first: files and every header value llama.cpp reads are checked before loading
(convert/gguf/rules.py), token ids against the vocabulary, row counts against the batch size,
capture slots against the model. A closed model or context refuses further use, and closing a
model first closes the contexts built on it (and a context those that borrow from it), so no
freed pointer is ever passed to libllama. Failures raise :class:`LlamaError` (or ValueError for
a bad token id) with one-line messages.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import numpy as np

from ..convert.gguf.rules import checked_header

from . import bindings

ll = bindings.lowlevel()  # a one-line error, not an ImportError, when llama-cpp-python is missing
from .cores import cpu_features, threads_for_run
from .errors import ClosedError, LlamaError
from .params import MAX_SEQ
from .threadpool import ThreadPool
from ..convert.gguf import keys as K

GGUF_MAGIC = b"GGUF"
_KV_TYPES = {"f32": ll.GGML_TYPE_F32, "f16": ll.GGML_TYPE_F16}


# ---------------------------------------------------------------------------- logging

_LOG_ERROR, _LOG_CONT = 4, 5  # ggml_log_level
_log_state = {"verbose": False, "last": 0}


@ll.llama_log_callback
def _log_callback(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    # errors always reach the user, the rest only with --verbose; CONT continues the last level
    if level != _LOG_CONT:
        _log_state["last"] = level
    if _log_state["verbose"] or _log_state["last"] == _LOG_ERROR:
        sys.stderr.write(text.decode("utf-8", errors="replace"))


def set_verbose(verbose: bool) -> None:
    _log_state["verbose"] = verbose


_backend_ready = False


def _init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        ll.llama_log_set(_log_callback, ctypes.c_void_p(0))
        ll.llama_backend_init()
        bindings.lib()
        _backend_ready = True


@functools.cache
def cpu_backend_features() -> frozenset[str]:
    """What the installed CPU backend was compiled for (``AVX2``, ``AVX512``, ...): it decides
    which kernels run, and so which passes compute a row as it is alone (runtime/batch.py)."""
    return frozenset(cpu_features(ll.llama_print_system_info().decode(errors="replace")))


def gpu_offload_supported() -> bool:
    _init_backend()
    from . import rpc

    # not llama_supports_gpu_offload(): it is true in any wheel built with the RPC backend, and
    # a registered RPC server's devices count as GPUs; this machine's own GPU devices only
    return bool(rpc.local_devices())


# ---------------------------------------------------------------------------- model


def check_gguf_file(path: Path) -> None:
    if not path.exists():
        raise LlamaError(f"{path}: no such file")
    if not path.is_file():
        raise LlamaError(f"{path}: not a file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise LlamaError(f"{path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")


class _BuftOverride(ctypes.Structure):
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]  # llama_model_tensor_buft_override


def _cpu_buft() -> int:
    fn = ll._lib["ggml_backend_cpu_buffer_type"]
    fn.argtypes, fn.restype = [], ctypes.c_void_p
    return fn()


class _NativeHandle:
    """An object holding memory llama.cpp allocated: freed by ``close()`` (which must be safe to
    call twice), at the end of a ``with`` block, and when collected."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # a half-built object (its __init__ raised), or the bindings gone at exit
            pass


class Model(_NativeHandle):
    """A loaded GGUF model (target or drafter)."""

    def __init__(self, path: str | os.PathLike, n_gpu_layers: int = 0, use_mmap: bool = True,
                 devices: list | None = None, tensor_split: tuple[float, ...] = (),
                 cpu_tensors: str | None = None) -> None:
        """``devices``: the runtime.rpc.Device list the offloaded layers go to, in order (None:
        llama.cpp's default list; this machine's GPUs only once an RPC server is registered);
        ``tensor_split``: llama.cpp's proportions of those layers per device; ``cpu_tensors``: a
        regex of tensor names kept in this machine's memory wherever their layer goes."""
        _init_backend()
        self.path = Path(path)
        self.n_gpu_layers = n_gpu_layers
        check_gguf_file(self.path)
        checked_header(self.path, before_load=True)  # ContractError for a value llama.cpp would assert on
        self._contexts: weakref.WeakSet[Context] = weakref.WeakSet()
        params = ll.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.use_mmap = use_mmap
        from . import rpc

        if devices is None and rpc.any_registered():
            devices = rpc.local_devices()  # a registered server's devices are not this model's
        self.devices = devices
        self.uses_rpc = any(d.endpoint for d in devices or ())
        keep = []
        if devices is not None:
            keep.append(rpc.device_array(devices))
            params.devices = ctypes.cast(keep[-1], ctypes.c_void_p)
        if tensor_split:
            n_max = ll.llama_max_devices()
            n_dev = len(devices or ())
            if len(tensor_split) > max(n_dev, 1):
                raise LlamaError(f"--tensor-split: {len(tensor_split)} proportions for {n_dev} device(s) "
                                 f"({', '.join(map(str, devices or ())) or 'none'})")
            keep.append((ctypes.c_float * n_max)(*tensor_split))
            params.tensor_split = keep[-1]
        if cpu_tensors:
            keep.append((_BuftOverride * 2)(_BuftOverride(cpu_tensors.encode(), _cpu_buft()), _BuftOverride(None, None)))
            params.tensor_buft_overrides = ctypes.cast(keep[-1], ctypes.c_void_p)
        failures0 = rpc.failures() if self.uses_rpc else 0
        self._ptr = ll.llama_model_load_from_file(str(self.path).encode(), params)
        if self.uses_rpc:
            self._endpoints = rpc.hold({d.endpoint for d in devices if d.endpoint})
        if self.uses_rpc and rpc.failures() != failures0:
            if self._ptr:
                ll.llama_model_free(self._ptr)
                self._ptr = None
            raise rpc.RpcError(f"{self.path}: loading it over RPC failed: {rpc.last_error()}")
        if not self._ptr:
            raise LlamaError(f"{self.path}: llama.cpp refused to load it (run with --verbose for its log)")
        self._vocab = ll.llama_model_get_vocab(self._ptr)
        self.n_embd = ll.llama_model_n_embd(self._ptr)
        self.n_layer = ll.llama_model_n_layer(self._ptr)
        self.n_vocab = ll.llama_vocab_n_tokens(self._vocab)
        self.arch = self.meta(K.GENERAL_ARCHITECTURE) or "?"

    @property
    def closed(self) -> bool:
        return not self._ptr

    @property
    def ptr(self) -> ctypes.c_void_p:
        if not self._ptr:
            raise ClosedError(f"{self.path}: model already closed")
        return self._ptr

    @property
    def vocab(self) -> ctypes.c_void_p:
        """The vocabulary lives inside the model: it goes when the model is closed."""
        if not self._ptr:
            raise ClosedError(f"{self.path}: model already closed")
        return self._vocab

    def check_token(self, token) -> int:
        """``token`` as an int when it is an id of this vocabulary, else ValueError naming it and the range.
        (llama.cpp indexes its token table unchecked, or throws through the C API: either kills the process.)"""
        if isinstance(token, (bool, np.bool_)) or not isinstance(token, (int, np.integer)):
            raise ValueError(f"token id {token!r}: expected an integer in 0..{self.n_vocab - 1}")
        t = int(token)
        if not 0 <= t < self.n_vocab:
            raise ValueError(f"token id out of range: {t} is not in 0..{self.n_vocab - 1} (the vocabulary of "
                             f"{self.path.name})")
        return t

    def check_tokens(self, tokens) -> list[int]:
        return [self.check_token(t) for t in tokens]

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = ll.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        return buf.value.decode("utf-8", errors="replace")

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate ("\ud800" from JSON, or undecodable argv)
            raise ValueError(f"text: expected Unicode text, found a lone surrogate U+{ord(text[e.start]):04X} at "
                             f"character {e.start}") from None
        cap = len(data) + 16
        arr = (ll.llama_token * cap)()
        n = ll.llama_tokenize(self.vocab, data, len(data), arr, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            arr = (ll.llama_token * cap)()
            n = ll.llama_tokenize(self.vocab, data, len(data), arr, cap, add_special, parse_special)
        return list(arr[:n])

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        token = self.check_token(token)
        vocab = self.vocab
        buf = ctypes.create_string_buffer(64)
        n = ll.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = ll.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens) -> bytes:
        """The bytes of a token sequence (every id checked before any is converted)."""
        return b"".join(self.token_bytes(t) for t in self.check_tokens(tokens))

    def token_text(self, token: int) -> str:
        return ll.llama_vocab_get_text(self.vocab, self.check_token(token)).decode("utf-8", errors="replace")

    def special_text(self, which: str) -> str:
        """Text of the bos/eos token ('' when the vocabulary has none)."""
        tok = {"bos": ll.llama_vocab_bos, "eos": ll.llama_vocab_eos}[which](self.vocab)
        return self.token_text(tok) if tok >= 0 else ""

    def is_eog(self, token: int) -> bool:
        return bool(ll.llama_vocab_is_eog(self.vocab, self.check_token(token)))

    def chat_template(self) -> str | None:
        t = ll.llama_model_chat_template(self.ptr, None)
        return t.decode("utf-8") if t else None

    def close(self) -> None:
        if self._ptr:
            for ctx in list(getattr(self, "_contexts", ())):  # a context must not outlive its model
                ctx.close()
            ll.llama_model_free(self._ptr)
            self._ptr = None
            if getattr(self, "_endpoints", None):
                from . import rpc

                rpc.release(self._endpoints)
                self._endpoints = None


# ---------------------------------------------------------------------------- context

_SMALL = 32  # batches up to this many rows are filled item by item (see Context._fill_small)
SWA_PAD = 256  # llama.cpp pads a sliding-window KV cache to a multiple of this many cells


def microbatch_for_window(window: int, n_batch: int, floor: int = 64) -> int:
    """The largest microbatch (<= n_batch, >= floor) whose sliding-window KV cache is no bigger
    than the smallest one a microbatch of ``floor`` rows allows.

    llama.cpp sizes a sliding-window cache to hold the window plus one microbatch, padded to
    SWA_PAD cells, and a one-row step attends to every cell of it (masked cells cost as much as
    visible ones without flash attention). With the default microbatch of 512 and a window of
    128, a step attends to 768 cells where 256 would hold all it can see: the bundled target's
    plain step ran 1.5x faster at 128 (docs/results/host-path/README.md), prefill too."""
    if window <= 0:
        return n_batch
    cells = -(-(window + floor) // SWA_PAD) * SWA_PAD
    return max(min(floor, n_batch), min(n_batch, cells - window))



@dataclass
class ContextParams:
    n_ctx: int = 4096
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int = 0  # 0: the free cores (runtime/cores.py)
    kv_type: str = "f16"  # "f32" for bit-exact comparisons with a reference
    swa_full: bool = False
    # sequences (runtime/batch.py): each has its own KV stream of n_ctx / n_seq cells, so its
    # cells are laid out as they would be were it alone (a shared stream interleaves them, and
    # attention sums in cell order)
    n_seq: int = 1
    flash_attn: bool = False
    # llama.cpp's op offload runs large batches of a CPU-resident model on the GPU. None: only
    # for a model with GPU layers, so a model placed on the CPU computes on the CPU (the same
    # kernels for a prompt as for a step, as in a CPU-only build).
    op_offload: bool | None = None


class Context(_NativeHandle):
    """A llama_context with checked decoding, logits, capture and KV-cache editing."""

    def __init__(self, model: Model, params: ContextParams | None = None, other: "Context | None" = None) -> None:
        self.model = model
        self.params = p = params or ContextParams()
        if p.n_ubatch > p.n_batch:
            raise LlamaError(f"n_ubatch ({p.n_ubatch}) must not exceed n_batch ({p.n_batch})")
        if p.kv_type not in _KV_TYPES:
            raise LlamaError(f"kv cache type: expected one of {sorted(_KV_TYPES)}, found {p.kv_type!r}")
        cp = ll.llama_context_default_params()
        cp.n_ctx = p.n_ctx
        cp.n_batch = p.n_batch
        cp.n_ubatch = p.n_ubatch
        if not 1 <= p.n_seq <= MAX_SEQ:
            raise LlamaError(f"sequences: expected 1..{MAX_SEQ}, found {p.n_seq}")
        cp.n_seq_max = p.n_seq
        cp.kv_unified = p.n_seq == 1
        self.n_threads = threads_for_run(p.n_threads)
        cp.n_threads = self.n_threads
        cp.n_threads_batch = self.n_threads
        cp.type_k = _KV_TYPES[p.kv_type]
        cp.type_v = _KV_TYPES[p.kv_type]
        cp.swa_full = p.swa_full
        cp.flash_attn_type = 1 if p.flash_attn else 0
        cp.op_offload = model.n_gpu_layers > 0 if p.op_offload is None else p.op_offload
        cp.no_perf = True
        if other is not None:
            cp.ctx_other = other.ptr
        self._other = other  # keep the borrowed context alive as long as this one
        self._dependents: weakref.WeakSet[Context] = weakref.WeakSet()  # contexts borrowing from this one
        self._ptr = ll.llama_init_from_model(model.ptr, cp)
        if not self._ptr:
            raise LlamaError(f"{model.path}: llama.cpp could not create a context (run with --verbose for its log)")
        model._contexts.add(self)
        if other is not None:
            other._dependents.add(self)
        # a borrower decodes in turn with the context it borrows from: the same workers serve both
        lender = getattr(other, "pool", None)
        self.pool = lender if lender is not None and lender.n_threads == self.n_threads else ThreadPool(self.n_threads)
        self.pool.attach(bindings.lib(), self._ptr)
        self.n_ctx = ll.llama_n_ctx(self._ptr)
        self.n_seq = p.n_seq
        self.n_ctx_seq = ll.llama_n_ctx_seq(self._ptr)  # each sequence's cells
        self.n_batch = ll.llama_n_batch(self._ptr)
        self._n_vocab = model.n_vocab
        self._batches: dict[int, _Batch] = {}
        self._capture_slots: set[int] = set()
        self.last_n_tokens = 0
        self._logits_addr, self._capture_addr = bindings.address_fns()
        # numpy views of llama.cpp's output buffers, by (address, rows): a view costs a few
        # microseconds to make, and the buffers move only when llama.cpp regrows them
        self._views: dict[tuple[int, int, int], np.ndarray] = {}
        # over RPC a lost server must fail the decode, not leave zeros in the outputs (patch 0022)
        self._rpc = model.uses_rpc or (other is not None and other.model.uses_rpc)
        if self._rpc:
            from . import rpc

            self._rpc_failures = rpc.failures()

    @property
    def closed(self) -> bool:
        return not self._ptr

    @property
    def ptr(self) -> ctypes.c_void_p:
        if not self._ptr:
            raise ClosedError(f"{self.model.path}: context already closed")
        return self._ptr

    # -- batches

    def _batch(self, embd_width: int) -> "_Batch":
        b = self._batches.get(embd_width)
        if b is None:
            b = self._batches[embd_width] = _Batch(self.n_batch, embd_width)
        return b

    def _check_rows(self, n: int, positions: np.ndarray) -> None:
        if n == 0:
            raise LlamaError("empty batch")
        if n > self.n_batch:
            raise LlamaError(f"batch of {n} rows exceeds n_batch {self.n_batch}")
        if len(positions) != n:
            raise LlamaError(f"{len(positions)} positions for {n} rows")
        if int(positions.min()) < 0:
            raise LlamaError(f"position {int(positions.min())}: expected >= 0")
        if int(positions.max()) >= self.n_ctx:
            raise LlamaError(f"position {int(positions.max())} is past the context size {self.n_ctx}; raise -c")

    def _check_tokens(self, tok: np.ndarray) -> None:
        if tok.min() < 0 or tok.max() >= self._n_vocab:
            bad = int(tok[(tok < 0) | (tok >= self._n_vocab)][0])
            self._bad_token(bad)

    def _bad_token(self, bad: int) -> None:
        raise LlamaError(f"token id out of range: {bad} is not in 0..{self._n_vocab - 1} (the vocabulary "
                         f"of {self.model.path.name})")

    def decode(self, tokens, positions, logits: str | np.ndarray = "last") -> None:
        """Decode tokens at positions. ``logits``: "last", "all", "none" or a boolean row mask."""
        try:
            tok = np.asarray(tokens, dtype=np.int64)
        except (OverflowError, TypeError, ValueError):
            raise LlamaError(f"token ids: expected integers in 0..{self.model.n_vocab - 1}") from None
        pos = np.asarray(positions, dtype=np.int32)
        n = len(tok)
        self._check_rows(n, pos)
        self._check_tokens(tok)
        b = self._batch(0)
        b.token[:n] = tok
        b.pos[:n] = pos
        b.logits[:n] = _logit_rows(logits, n)
        self._run(b, n)

    def step(self, token: int, pos: int) -> None:
        """Decode one token at pos with its logits: a plain decoding step, the engine's hot path
        (no array is made; the checks are the ones decode makes)."""
        if not 0 <= token < self._n_vocab:
            self._bad_token(token)
        if not 0 <= pos < self.n_ctx:
            raise LlamaError(f"position {pos} is past the context size {self.n_ctx}; raise -c")
        b = self._batch(0)
        b.token[0] = token
        b.pos[0] = pos
        b.logits[0] = 1
        self._run(b, 1)

    def decode_block(self, tokens: list[int], pos0: int, first_output: int = 0) -> None:
        """Decode tokens at positions pos0, pos0 + 1, ... with logits on rows first_output..
        (a verify pass: all rows; a draft block: all but the bonus)."""
        n = len(tokens)
        if not 0 < n <= self.n_batch:
            raise LlamaError(f"batch of {n} rows outside 1..{self.n_batch}")
        if pos0 < 0 or pos0 + n > self.n_ctx:
            raise LlamaError(f"position {pos0 + n - 1} is past the context size {self.n_ctx}; raise -c")
        b = self._batch(0)
        if n <= _SMALL:
            self._fill_small(b, tokens, pos0, first_output)
        else:
            tok = np.asarray(tokens, dtype=np.int64)
            self._check_tokens(tok)
            b.token[:n] = tok
            b.pos[:n] = b.iota[:n]
            b.pos[:n] += pos0
            b.logits[:first_output] = 0
            b.logits[first_output:n] = 1
        self._run(b, n)

    def _fill_small(self, b: "_Batch", tokens, pos0: int, first_output: int) -> None:
        # item by item through ctypes: for a verify block or a draft, 5x cheaper than the
        # numpy calls (1.7 against 9.4 us for 5 rows)
        tok, pos, out, nv = b.batch.token, b.batch.pos, b.batch.logits, self._n_vocab
        for i, t in enumerate(tokens):
            if not 0 <= t < nv:
                self._bad_token(int(t))
            tok[i] = t
            pos[i] = pos0 + i
            out[i] = i >= first_output

    def decode_seqs(self, parts: list[tuple[int, list[int], int, int]]) -> list[int]:
        """One decode over rows of several sequences: ``parts`` are (sequence, tokens, pos0,
        first_output), each decoded at positions pos0, pos0 + 1, ... with logits on its rows
        first_output.. . Rows go in the order given (llama.cpp groups a microbatch by ascending
        sequence ids, so give them in that order); returns each part's first batch row."""
        n = sum(len(t) for _, t, _, _ in parts)
        if not 0 < n <= self.n_batch:
            raise LlamaError(f"batch of {n} rows outside 1..{self.n_batch}")
        b = self._batch(0)
        firsts = []
        i0 = 0
        for seq, tokens, pos0, first_output in parts:
            k = len(tokens)
            self._check_seq(seq)
            if k == 0:
                raise LlamaError(f"sequence {seq}: no rows")
            if pos0 < 0 or pos0 + k > self.n_ctx_seq:
                raise LlamaError(f"position {pos0 + k - 1} is past the context size {self.n_ctx_seq}; raise -c")
            firsts.append(i0)
            if k <= _SMALL:
                tok, pos, out, nv = b.batch.token, b.batch.pos, b.batch.logits, self._n_vocab
                for i, t in enumerate(tokens):
                    if not 0 <= t < nv:
                        self._bad_token(int(t))
                    tok[i0 + i] = t
                    pos[i0 + i] = pos0 + i
                    out[i0 + i] = i >= first_output
            else:
                tok = np.asarray(tokens, dtype=np.int64)
                self._check_tokens(tok)
                b.token[i0:i0 + k] = tok
                b.pos[i0:i0 + k] = b.iota[:k]
                b.pos[i0:i0 + k] += pos0
                b.logits[i0:i0 + k] = 0
                b.logits[i0 + first_output:i0 + k] = 1
            b.assign_seq(i0, k, seq)
            i0 += k
        self._run(b, n, seqs=True)
        return firsts

    def decode_embd(self, embd: np.ndarray, positions) -> None:
        """Decode rows of input embeddings (for a DFlash drafter: fused target features)."""
        e = np.asarray(embd, dtype=np.float32)
        pos = np.asarray(positions, dtype=np.int32)
        if e.ndim != 2:
            raise LlamaError(f"embeddings: expected [rows, width], found shape {e.shape}")
        n, width = e.shape
        self._check_rows(n, pos)
        b = self._batch(width)
        b.embd[:n] = e
        b.pos[:n] = pos
        b.logits[:n] = 0
        self._run(b, n)

    def embd_rows(self, width: int, n: int) -> np.ndarray:
        """The first n rows [n, width] of this context's embedding batch, to fill in place
        before ``decode_embd_rows`` (no copy between the filler and llama.cpp)."""
        if not 0 < n <= self.n_batch:
            raise LlamaError(f"batch of {n} rows outside 1..{self.n_batch}")
        return self._batch(width).embd[:n]

    def decode_embd_rows(self, width: int, n: int, pos0: int) -> None:
        """Decode the first n rows of the embedding batch (filled through ``embd_rows``) at
        positions pos0, pos0 + 1, ..."""
        if not 0 < n <= self.n_batch:
            raise LlamaError(f"batch of {n} rows outside 1..{self.n_batch}")
        if pos0 < 0 or pos0 + n > self.n_ctx:
            raise LlamaError(f"position {pos0 + n - 1} is past the context size {self.n_ctx}; raise -c")
        b = self._batch(width)
        if n <= _SMALL:
            pos, out = b.batch.pos, b.batch.logits
            for i in range(n):
                pos[i] = pos0 + i
                out[i] = 0
        else:
            b.pos[:n] = b.iota[:n]
            b.pos[:n] += pos0
            b.logits[:n] = 0
        self._run(b, n)

    def _run(self, b: "_Batch", n: int, seqs: bool = False) -> None:
        if b.n_other and not seqs:  # rows of the last decode_seqs: sequence 0 again
            b.assign_seq(0, b.n_other, 0)
            b.n_other = 0
        b.batch.n_tokens = n
        with self.pool.lock:
            rc = ll.llama_decode(self.ptr, b.batch)
        if self._rpc:
            self._check_rpc(rc)
        if rc != 0:
            raise LlamaError(f"llama_decode failed with code {rc} ({n} rows)")
        self.last_n_tokens = n

    def _check_rpc(self, rc: int) -> None:
        """After a decode over RPC: wait for its outputs, then raise RpcError if a server was
        lost meanwhile (ggml-rpc completes a dead connection's commands with zeros)."""
        from . import rpc

        if rc == 0:
            ll.llama_synchronize(self._ptr)
        if rpc.failures() != self._rpc_failures:
            self.last_n_tokens = 0
            raise rpc.RpcError(rpc.last_error() or f"an RPC server was lost (llama_decode returned {rc})")

    # -- outputs

    def _view(self, addr: int, rows: int, width: int) -> np.ndarray:
        key = (addr, rows, width)
        v = self._views.get(key)
        if v is None:
            if len(self._views) > 256:  # buffers that moved leave stale keys behind
                self._views.clear()
            v = self._views[key] = np.ctypeslib.as_array(
                (ctypes.c_float * (rows * width)).from_address(addr)).reshape(rows, width)
        return v

    def logits_row(self, i: int) -> np.ndarray:
        """Logits of batch row i of the last decode (a copy)."""
        return self.logits_view(i).copy()

    def logits_view(self, i: int) -> np.ndarray:
        """Logits of batch row i of the last decode, without a copy: valid until the next decode."""
        addr = self._logits_addr(self.ptr, i)
        if not addr:
            raise LlamaError(f"no logits for row {i} of the last batch")
        return self._view(addr, 1, self._n_vocab)[0]

    def logits_block(self, n: int, first: int = 0) -> np.ndarray:
        """Logits [n, n_vocab] of batch rows first..first+n-1 of the last decode, which had
        logits on each of them (``decode_block``), without a copy: valid until the next decode."""
        ptr = self.ptr
        addr = self._logits_addr(ptr, first)
        if not addr:
            raise LlamaError(f"no logits for row {first} of the last batch")
        if n > 1 and self._logits_addr(ptr, first + n - 1) != addr + (n - 1) * self._n_vocab * 4:
            # rows not laid out in batch order: one row at a time
            return np.stack([self.logits_view(i) for i in range(first, first + n)])
        return self._view(addr, n, self._n_vocab)

    def logits_rows(self, rows) -> np.ndarray:
        return np.stack([self.logits_row(int(i)) for i in rows])

    # -- hidden-state capture (patched)

    @property
    def n_capture_slots(self) -> int:
        return int(bindings.lib().laguna_ext_n_capture_slots(self.ptr))

    def set_capture(self, slot: int, enable: bool = True) -> None:
        if bindings.lib().laguna_ext_set_capture(self.ptr, slot, enable) != 0:
            raise LlamaError(f"capture slot {slot} out of range 0..{self.n_capture_slots - 1}")
        (self._capture_slots.add if enable else self._capture_slots.discard)(slot)

    def capture(self, slot: int) -> np.ndarray:
        """Rows [last_n_tokens, n_embd] captured at slot by the last decode (a copy)."""
        out = np.empty((self.last_n_tokens, self.model.n_embd), dtype=np.float32)
        self.capture_into(slot, out)
        return out

    def capture_into(self, slot: int, out: np.ndarray) -> None:
        """Copy the first len(out) captured rows of slot into a C-contiguous float32 array
        [rows, n_embd]; no temporary (this runs once per plain step in --n-max auto)."""
        if out.dtype != np.float32 or not out.flags.c_contiguous or out.shape[-1] != self.model.n_embd \
                or out.size > self.last_n_tokens * self.model.n_embd:
            raise LlamaError(f"capture_into: expected a C-contiguous float32 [<= {self.last_n_tokens}, "
                             f"{self.model.n_embd}] array, found {out.dtype} {out.shape}")
        out.reshape(-1, self.model.n_embd)[:] = self.capture_view(slot, out.size // self.model.n_embd)

    def capture_view(self, slot: int, n: int | None = None) -> np.ndarray:
        """Rows [n, n_embd] (default: all) captured at slot by the last decode, without a copy:
        valid until the next decode."""
        if slot not in self._capture_slots:
            raise LlamaError(f"capture slot {slot} is not enabled")
        n = self.last_n_tokens if n is None else n
        if not 0 <= n <= self.last_n_tokens:
            raise LlamaError(f"capture: {n} rows asked, the last decode had {self.last_n_tokens}")
        addr = self._capture_addr(self.ptr, slot)
        if not addr:
            raise LlamaError(f"capture slot {slot} holds no data yet")
        return self._view(addr, self.last_n_tokens, self.model.n_embd)[:n]

    # -- memory

    def _check_seq(self, seq: int) -> int:
        if not 0 <= seq < self.n_seq:
            raise LlamaError(f"sequence {seq} outside 0..{self.n_seq - 1}")
        return seq

    def seq_rm(self, p0: int, p1: int = -1, seq: int = 0) -> None:
        mem = ll.llama_get_memory(self.ptr)
        if not ll.llama_memory_seq_rm(mem, self._check_seq(seq), p0, p1):
            raise LlamaError(f"could not remove positions [{p0}, {p1}) from the KV cache")

    def pos_max(self, seq: int = 0) -> int:
        return int(ll.llama_memory_seq_pos_max(ll.llama_get_memory(self.ptr), self._check_seq(seq)))

    def pos_min(self, seq: int = 0) -> int:
        """Lowest position the cache holds (-1: none). With sliding-window layers it is that
        cache's: llama.cpp keeps every position in [pos_min, pos_max] present."""
        return int(ll.llama_memory_seq_pos_min(ll.llama_get_memory(self.ptr), self._check_seq(seq)))

    def save_window(self, seq: int = 0) -> ctypes.Array | None:
        """A copy of the cells the sliding-window layers hold of one sequence (the full-attention
        layers' are left out: those keep every position, and seq_rm trims them to any prefix);
        None when llama.cpp could not write them."""
        flags = ll.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        seq = self._check_seq(seq)
        size = ll.llama_state_seq_get_size_ext(self.ptr, seq, flags)
        if not size:
            return None
        buf = (ctypes.c_uint8 * size)()
        if ll.llama_state_seq_get_data_ext(self.ptr, buf, size, seq, flags) != size:
            return None
        return buf

    def restore_window(self, data: ctypes.Array, seq: int = 0) -> bool:
        """Replace one sequence's sliding-window cells with a ``save_window`` copy; whether
        llama.cpp took it (if not, those cells are gone and the sequence must be cleared)."""
        flags = ll.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        return ll.llama_state_seq_set_data_ext(self.ptr, data, len(data), self._check_seq(seq), flags) == len(data)

    def clear(self) -> None:
        ll.llama_memory_clear(ll.llama_get_memory(self.ptr), True)

    def clear_seq(self, seq: int) -> None:
        """Forget every position of one sequence (the others keep theirs)."""
        self.seq_rm(-1, -1, seq)

    def set_causal(self, causal: bool) -> None:
        ll.llama_set_causal_attn(self.ptr, causal)

    def close(self) -> None:
        for ctx in list(getattr(self, "_dependents", ())):  # a borrower reads this context's model
            ctx.close()
        if hasattr(self, "_views"):
            self._views.clear()
        for b in getattr(self, "_batches", {}).values():
            b.free()
        if hasattr(self, "_batches"):
            self._batches.clear()
        if getattr(self, "_ptr", None):
            ll.llama_free(self._ptr)
            self._ptr = None
            if getattr(self, "pool", None) is not None:
                self.pool.detach()


class SeqView:
    """One sequence of a multi-sequence context, seen as the whole context: what the round
    loop, the prompt cache and a drafter read and edit of a target (runtime/rounds.py). Its
    rows of the last decode start at batch row ``row0`` (set by the one who decoded them), so
    logits and captured rows are indexed from there; a capture switch is recorded as this
    sequence's wish, and the decoder captures while any sequence wishes it."""

    def __init__(self, ctx: Context, seq: int) -> None:
        self.ctx, self.seq = ctx, ctx._check_seq(seq)
        self.model = ctx.model
        self.params = ctx.params
        self.n_ctx = ctx.n_ctx_seq
        self.n_batch = ctx.n_batch
        self.n_threads = ctx.n_threads
        self.row0 = 0
        self.last_n_tokens = 0
        self.capture_wish: set[int] = set()

    # what a context borrowing from this one (a drafter's, through ctx_other) reads
    @property
    def ptr(self) -> ctypes.c_void_p:
        return self.ctx.ptr

    @property
    def _dependents(self):
        return self.ctx._dependents

    @property
    def pool(self) -> ThreadPool:
        return self.ctx.pool

    @property
    def closed(self) -> bool:
        return self.ctx.closed

    def seq_rm(self, p0: int, p1: int = -1) -> None:
        self.ctx.seq_rm(p0, p1, self.seq)

    def pos_max(self) -> int:
        return self.ctx.pos_max(self.seq)

    def pos_min(self) -> int:
        return self.ctx.pos_min(self.seq)

    def clear(self) -> None:
        self.ctx.clear_seq(self.seq)

    def save_window(self) -> ctypes.Array | None:
        return self.ctx.save_window(self.seq)

    def restore_window(self, data: ctypes.Array) -> bool:
        return self.ctx.restore_window(data, self.seq)

    def logits_view(self, i: int) -> np.ndarray:
        return self.ctx.logits_view(self.row0 + i)

    def logits_block(self, n: int, first: int = 0) -> np.ndarray:
        return self.ctx.logits_block(n, self.row0 + first)

    @property
    def n_capture_slots(self) -> int:
        return self.ctx.n_capture_slots

    def set_capture(self, slot: int, enable: bool = True) -> None:
        if not 0 <= slot < self.ctx.n_capture_slots:
            raise LlamaError(f"capture slot {slot} out of range 0..{self.ctx.n_capture_slots - 1}")
        (self.capture_wish.add if enable else self.capture_wish.discard)(slot)

    def capture_view(self, slot: int, n: int | None = None) -> np.ndarray:
        n = self.last_n_tokens if n is None else n
        if not 0 <= n <= self.last_n_tokens:
            raise LlamaError(f"capture: {n} rows asked, the last decode had {self.last_n_tokens}")
        return self.ctx.capture_view(slot, self.row0 + n)[self.row0:]

    def capture_into(self, slot: int, out: np.ndarray) -> None:
        h = self.model.n_embd
        out.reshape(-1, h)[:] = self.capture_view(slot, out.size // h)

    def capture(self, slot: int) -> np.ndarray:
        return self.capture_view(slot).copy()


class _Batch:
    """A llama_batch made once per context and row width, with numpy views on its arrays.
    Every row belongs to sequence 0 unless ``assign_seq`` said otherwise; a decode writes only
    tokens (or embeddings), positions and output flags of the rows it uses."""

    def __init__(self, n_batch: int, embd_width: int) -> None:
        self.batch = b = ll.llama_batch_init(n_batch, embd_width, 1)
        self.pos = np.ctypeslib.as_array(b.pos, shape=(n_batch,))
        self.logits = np.ctypeslib.as_array(b.logits, shape=(n_batch,))
        np.ctypeslib.as_array(b.n_seq_id, shape=(n_batch,))[:] = 1
        for i in range(n_batch):
            b.seq_id[i][0] = 0
        # the sequence of each row as written in the batch (seq_id is an array of pointers, so
        # a row's id is rewritten only when it changes)
        self.seq = np.zeros(n_batch, dtype=np.int32)
        self.n_other = 0  # rows [0, n_other) may hold ids other than 0
        self.token = np.ctypeslib.as_array(b.token, shape=(n_batch,)) if not embd_width else None
        self.embd = np.ctypeslib.as_array(b.embd, shape=(n_batch, embd_width)) if embd_width else None
        self.iota = np.arange(n_batch, dtype=np.int32)

    def assign_seq(self, i0: int, n: int, seq: int) -> None:
        ids = self.batch.seq_id
        for i in np.flatnonzero(self.seq[i0:i0 + n] != seq):
            ids[i0 + i][0] = seq
        self.seq[i0:i0 + n] = seq
        if seq:
            self.n_other = max(self.n_other, i0 + n)

    def free(self) -> None:
        self.pos = self.logits = self.token = self.embd = None
        ll.llama_batch_free(self.batch)


def _logit_rows(logits: str | np.ndarray, n: int) -> np.ndarray:
    rows = np.zeros(n, dtype=np.int8)
    if isinstance(logits, str):
        if logits == "last":
            rows[-1] = 1
        elif logits == "all":
            rows[:] = 1
        elif logits != "none":
            raise ValueError(f"logits: expected 'last', 'all', 'none' or a mask, found {logits!r}")
    else:
        rows[:] = np.asarray(logits, dtype=bool)
    return rows
