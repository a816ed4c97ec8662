"""Output encodings of the converter: F32, F16, BF16 and Q8_0, vectorised with NumPy, and the
4-6-bit types (Q6_K, Q5_K_M, Q4_K_M, Q4_0), which llama.cpp's own quantiser makes.

Q8_0 follows ggml's reference quantiser (``quantize_row_q8_0_ref``) bit for bit, so its bytes
equal those of gguf-py's ``gguf.quants.quantize(x, GGMLQuantizationType.Q8_0)``:

* blocks of 32 consecutive values along a row;
* ``d = max|x| / 127`` in float32, stored as float16;
* ``q = round(x * (1/d))`` (float32, halves away from zero; ``1/d`` taken as 0 when ``d == 0``),
  stored as int8 right after ``d`` — 34 bytes per block.

Rows are processed in chunks, so the temporaries stay a few MiB whatever the tensor size.

Every encoding first refuses NaN/Inf and values the type cannot hold (:func:`check_values`),
with two reductions over the tensor already in memory: no extra pass over the file and no
temporary the size of the tensor.

The 4-6-bit types are not encoded here: the converter writes a lossless intermediate GGUF
(each matrix in its checkpoint dtype) and :func:`llama_quantize` hands it to
``llama_model_quantize`` of the patched wheel, which knows the ``dflash-draft`` architecture and
picks each tensor's type by its own rules (K-quants need rows of 256 values; shorter rows fall
back to a 32-block type). It runs in a child process: an abort inside llama.cpp then ends that
child, not the converter, and its log is shown only when it fails.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from enum import Enum
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, LlamaFileType

from .errors import ContractError, UserError

QK8_0 = 32  # values per Q8_0 block
Q8_0_BLOCK_BYTES = 2 + QK8_0
_CHUNK_VALUES = 1 << 20  # values quantised per step
#: Largest |x| whose Q8_0 block scale (max|x| / 127) still fits a float16.
Q8_0_MAX_ABS = float(np.finfo(np.float16).max) * 127
F16_MAX = float(np.finfo(np.float16).max)  # 65504
#: Smallest float32 magnitude that rounds (to nearest even) to a bfloat16 infinity.
BF16_OVERFLOW = float(np.array(0x7F7F8000, dtype=np.uint32).view(np.float32))
#: Largest |x| that every type llama.cpp may give a matrix of a 4-6-bit file can hold: Q4_0's block
#: scale, max|x| / 8, is a float16 (the K-quants' scales, Q5_0/Q5_1 and Q8_0 hold more).
LOWBIT_MAX_ABS = F16_MAX * 8
#: Block size the 4-6-bit files need at least: llama.cpp's fallback for a K-quant on a row that is
#: not a multiple of 256 is a 32-value block type (a row that is not a multiple of 32 would become F16).
LOWBIT_MIN_BLOCK = 32


class OutType(str, Enum):
    """The ``--outtype`` choices: the type of every 2-D matrix (norms always stay F32)."""

    Q8_0 = "q8_0"
    BF16 = "bf16"
    F16 = "f16"
    F32 = "f32"
    Q6_K = "q6_k"
    Q5_K_M = "q5_k_m"
    Q4_K_M = "q4_k_m"
    Q4_0 = "q4_0"

    @classmethod
    def parse(cls, text: str) -> OutType:
        """``--outtype`` as typed (any case), or a one-line UserError listing the choices."""
        try:
            return cls(str(text).strip().lower())
        except ValueError:
            choices = ", ".join(t.value for t in cls)
            raise UserError(f"--outtype: expected one of {choices}, found {text!r}") from None

    @property
    def by_llama(self) -> bool:
        """Made by llama.cpp's quantiser from a lossless intermediate file (:func:`llama_quantize`)."""
        return self in _LLAMA_BASE

    @property
    def ggml_type(self) -> GGMLQuantizationType:
        """The type this module encodes the matrices in: the output type itself, or, for a
        :attr:`by_llama` type, F32 (lossless from any source) for the intermediate file."""
        return _GGML.get(self, GGMLQuantizationType.F32)

    @property
    def base_type(self) -> GGMLQuantizationType:
        """The type most matrices of the output get (llama.cpp's _M mixes give some Q6_K, and rows
        too short for a K-quant get a 32-block type: docs/results/lowbit/README.md)."""
        return _LLAMA_BASE.get(self) or _GGML[self]

    @property
    def file_type(self) -> int:
        """``general.file_type`` (llama.cpp's ``LLAMA_FTYPE``)."""
        return int(_FTYPE[self])


_GGML = {
    OutType.Q8_0: GGMLQuantizationType.Q8_0,
    OutType.BF16: GGMLQuantizationType.BF16,
    OutType.F16: GGMLQuantizationType.F16,
    OutType.F32: GGMLQuantizationType.F32,
}
_FTYPE = {
    OutType.Q8_0: LlamaFileType.MOSTLY_Q8_0,  # 7
    OutType.BF16: LlamaFileType.MOSTLY_BF16,  # 32
    OutType.F16: LlamaFileType.MOSTLY_F16,  # 1
    OutType.F32: LlamaFileType.ALL_F32,  # 0
    OutType.Q6_K: LlamaFileType.MOSTLY_Q6_K,  # 18
    OutType.Q5_K_M: LlamaFileType.MOSTLY_Q5_K_M,  # 17
    OutType.Q4_K_M: LlamaFileType.MOSTLY_Q4_K_M,  # 15
    OutType.Q4_0: LlamaFileType.MOSTLY_Q4_0,  # 2
}
#: The 4-6-bit outtypes and the type llama.cpp gives most of their matrices (llama_ftype_get_default_type).
_LLAMA_BASE = {
    OutType.Q6_K: GGMLQuantizationType.Q6_K,
    OutType.Q5_K_M: GGMLQuantizationType.Q5_K,
    OutType.Q4_K_M: GGMLQuantizationType.Q4_K,
    OutType.Q4_0: GGMLQuantizationType.Q4_0,
}


def encoded_nbytes(shape: tuple[int, ...], qtype: GGMLQuantizationType) -> int:
    """Bytes of a tensor of numpy ``shape`` once encoded as ``qtype``."""
    n = 1
    for d in shape:
        n *= d
    if qtype == GGMLQuantizationType.Q8_0:
        return n // QK8_0 * Q8_0_BLOCK_BYTES
    if qtype in (GGMLQuantizationType.F16, GGMLQuantizationType.BF16):
        return 2 * n
    if qtype == GGMLQuantizationType.F32:
        return 4 * n
    raise ValueError(f"unsupported output type {qtype.name}")


def check_encodable(name: str, shape: tuple[int, ...], qtype: GGMLQuantizationType, where: str) -> None:
    """Q8_0 needs rows made of whole 32-value blocks."""
    if qtype == GGMLQuantizationType.Q8_0 and shape[-1] % QK8_0:
        raise ContractError(where, name, f"a row length that is a multiple of {QK8_0} for Q8_0 "
                            "(use --outtype bf16, f16 or f32)", shape[-1])


def check_quantizable(name: str, shape: tuple[int, ...], outtype: OutType, where: str) -> None:
    """A 4-6-bit matrix needs rows of whole 32-value blocks, so that where llama.cpp cannot use a
    K-quant (rows not a multiple of 256) it falls back to a block type, never to F16."""
    if outtype.by_llama and shape[-1] % LOWBIT_MIN_BLOCK:
        raise ContractError(where, name, f"a row length that is a multiple of {LOWBIT_MIN_BLOCK} for "
                            f"{outtype.value} (use --outtype bf16, f16 or f32)", shape[-1])


def encode(x: np.ndarray, qtype: GGMLQuantizationType, name: str = "tensor",
           requantized_as: OutType | None = None) -> np.ndarray:
    """``x`` (float32) in the bytes/elements GGUF stores for ``qtype``; same leading shape.

    Returns float32 / float16 arrays for F32 / F16, a uint16 array of bit patterns for BF16,
    and a uint8 array of shape ``(..., cols // 32 * 34)`` for Q8_0. Raises ContractError
    (naming ``name``) for NaN/Inf or a value ``qtype`` cannot hold, or, when ``x`` goes into
    the intermediate file of a 4-6-bit type ``requantized_as``, one that type cannot hold.
    """
    x = np.asarray(x, dtype=np.float32)
    check_values(x, qtype, name, requantized_as)
    if qtype == GGMLQuantizationType.F32:
        return x
    if qtype == GGMLQuantizationType.F16:
        return x.astype(np.float16)
    if qtype == GGMLQuantizationType.BF16:
        return to_bf16_bits(x)
    if qtype == GGMLQuantizationType.Q8_0:
        return quantize_q8_0(x)
    raise ValueError(f"unsupported output type {qtype.name}")


def check_values(x: np.ndarray, qtype: GGMLQuantizationType, name: str = "tensor",
                 requantized_as: OutType | None = None) -> None:
    """Refuse NaN/Inf (any type) and magnitudes ``qtype`` (or the 4-6-bit ``requantized_as``)
    would turn into Inf or garbage.

    A drafter with such weights loads and runs, but never gets a draft accepted, so this is
    refused rather than written. min/max are plain reductions (NaN propagates through both),
    so the check allocates nothing the size of ``x``.
    """
    lo, hi = float(np.min(x, initial=0.0)), float(np.max(x, initial=0.0))
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ContractError(name, "values", "finite numbers (no NaN or Inf)", _first_non_finite(x))
    big = max(-lo, hi)
    if qtype == GGMLQuantizationType.F16 and big > F16_MAX:
        raise ContractError(name, "values", f"|x| <= {F16_MAX:g} to fit F16 (use --outtype bf16)", f"{big:g}")
    if qtype == GGMLQuantizationType.BF16 and big >= BF16_OVERFLOW:
        raise ContractError(name, "values", f"|x| < {BF16_OVERFLOW:g} to fit BF16 (use --outtype f32)", f"{big:g}")
    if qtype == GGMLQuantizationType.Q8_0 and big > Q8_0_MAX_ABS:
        raise ContractError(name, "values", f"|x| <= {Q8_0_MAX_ABS:g} for Q8_0 (use --outtype bf16)", f"{big:g}")
    if requantized_as is not None and requantized_as.by_llama and big > LOWBIT_MAX_ABS:
        # llama.cpp would refuse the block (an infinite float16 scale), but only after writing the whole file
        raise ContractError(name, "values", f"|x| <= {LOWBIT_MAX_ABS:g} for {requantized_as.value} "
                            "(its block scales are float16; use --outtype bf16)", f"{big:g}")


def _first_non_finite(x: np.ndarray) -> str:
    # Only on the failure path, so a boolean mask of the whole tensor is affordable here.
    flat = np.flatnonzero(~np.isfinite(x))
    bad = int(flat[0])
    where = [int(i) for i in np.unravel_index(bad, x.shape)] if x.ndim else []
    return f"{float(x.reshape(-1)[bad])} at {where} (non-finite values in all: {flat.size})"


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounding to nearest even; NaNs stay (quiet) NaNs."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    # Adding 0x7fff plus the lowest kept bit rounds half to even; cannot overflow for non-NaN input.
    lsb = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = (bits + (np.uint32(0x7FFF) + lsb)) >> np.uint32(16)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        rounded = np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x40), rounded)
    return rounded.astype(np.uint16)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """Q8_0 blocks of a float32 array whose last dimension is a multiple of 32.

    Raises OverflowError when a block's scale does not fit a float16 (|x| > ~8.3e6).
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape[-1] % QK8_0:
        raise ValueError(f"Q8_0 needs a last dimension that is a multiple of {QK8_0}, got {x.shape}")
    n_blocks = x.size // QK8_0
    flat = x.reshape(n_blocks, QK8_0)
    out = np.empty((n_blocks, Q8_0_BLOCK_BYTES), dtype=np.uint8)
    step = max(1, _CHUNK_VALUES // QK8_0)
    for lo in range(0, n_blocks, step):
        hi = min(n_blocks, lo + step)
        _q8_0_blocks(flat[lo:hi], out[lo:hi])
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK8_0 * Q8_0_BLOCK_BYTES)


def _q8_0_blocks(blocks: np.ndarray, out: np.ndarray) -> None:
    amax = np.max(np.abs(blocks), axis=1, keepdims=True)
    if not float(amax.max(initial=0.0)) <= Q8_0_MAX_ABS:  # also catches NaN
        raise OverflowError(f"{float(amax.max()):g}")
    d = amax / np.float32(127.0)
    inv = np.zeros_like(d)
    np.divide(np.float32(1.0), d, out=inv, where=d != 0)
    v = blocks * inv
    # round half away from zero, exactly: the integer part plus one more unit when |fraction| >= 0.5
    whole = np.trunc(v)
    v -= whole
    v *= np.float32(2.0)
    np.trunc(v, out=v)
    whole += v
    out[:, :2] = d.astype(np.float16).view(np.uint8)
    out[:, 2:] = whole.astype(np.int8).view(np.uint8)


def decode(data: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> np.ndarray:
    """The inverse of :func:`encode` (lossy for Q8_0), as float32 of numpy ``shape``; for tests and inspect."""
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    if qtype == GGMLQuantizationType.F32:
        return raw.view(np.float32).reshape(shape)
    if qtype == GGMLQuantizationType.F16:
        return raw.view(np.float16).astype(np.float32).reshape(shape)
    if qtype == GGMLQuantizationType.BF16:
        return (raw.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(shape)
    if qtype == GGMLQuantizationType.Q8_0:
        blocks = raw.reshape(-1, Q8_0_BLOCK_BYTES)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        q = blocks[:, 2:].view(np.int8).astype(np.float32)
        return (d * q).reshape(shape)
    raise ValueError(f"unsupported type {qtype.name}")


# --------------------------------------------------------------------------- 4-6-bit: llama.cpp's quantiser

#: The child process's first argument, so that running this module by hand does nothing by accident.
_CHILD_VERB = "llama-quantize"


def quantize_command(src: Path, dst: Path, file_type: int, n_threads: int) -> list[str]:
    """The child process :func:`llama_quantize` runs (a function, so tests can replace it)."""
    # this module's own import name, whatever the package is installed as
    module = __spec__.name if __spec__ is not None else __name__
    return [sys.executable, "-m", module, _CHILD_VERB, os.fspath(src), os.fspath(dst),
            str(int(file_type)), str(int(n_threads))]


def llama_quantize(src: Path, dst: Path, outtype: OutType, n_threads: int = 0) -> None:
    """Quantise the GGUF ``src`` into ``dst`` as ``outtype`` with the patched wheel's
    ``llama_model_quantize`` (``llama_model_quantize_default_params()``: no importance matrix,
    the file type's own per-tensor mix; ``n_threads`` 0 = every core).

    ``src`` must be a drafter GGUF this package wrote (its values already checked). ``dst``
    appears only when complete. Any failure, a crash of llama.cpp included, is one UserError line
    with llama.cpp's reason, and leaves no ``dst`` behind.
    """
    if not outtype.by_llama:
        raise ValueError(f"{outtype.value} is not made by llama.cpp's quantiser")
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        raise UserError(f"--outtype {outtype.value}: llama.cpp's quantiser comes with the patched llama-cpp-python, "
                        "which is not installed: run `laguna-run setup`")
    src, dst = Path(src), Path(dst)
    partial = dst.with_name(f"{dst.name}.partial-{os.getpid()}")
    if partial.exists() or partial.is_symlink():
        raise UserError(f"-o {dst}: the temporary file {partial} already exists (left by another run?); "
                        "remove it and retry")
    repo = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.run(quantize_command(src, partial, outtype.file_type, n_threads),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=env, check=False)
        if proc.returncode == 0 and partial.is_file():
            os.replace(partial, dst)
            return
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.unlink(missing_ok=True)
    reason = quantizer_failure(proc.returncode, proc.stdout.decode("utf-8", "replace"))
    raise UserError(f"-o {dst}: llama.cpp's quantiser ({outtype.value}) failed: {reason}; no output written")


def quantizer_failure(returncode: int, log: str) -> str:
    """One line of why the quantiser's child failed, from its exit status and log."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    said = [ln.split("failed to quantize:", 1)[1].strip() for ln in lines if "failed to quantize:" in ln]
    last = said[-1] if said else (lines[-1] if lines else "no output")
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        last = f"killed by {name} ({last})"
    elif not said and returncode == 0:
        last = f"it wrote no file ({last})"
    return last if len(last) <= 300 else last[:297] + "..."


def _quantize_here(src: str, dst: str, file_type: str, n_threads: str) -> int:
    import ctypes

    import llama_cpp.llama_cpp as ll

    ll.llama_backend_init()
    params = ll.llama_model_quantize_default_params()
    params.ftype = int(file_type)
    params.nthread = int(n_threads)
    return int(ll.llama_model_quantize(os.fsencode(src), os.fsencode(dst), ctypes.byref(params)))


if __name__ == "__main__" and sys.argv[1:2] == [_CHILD_VERB] and len(sys.argv) == 6:
    sys.exit(_quantize_here(*sys.argv[2:]))
