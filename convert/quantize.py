"""Output encodings of the converter: F32, F16, BF16 and Q8_0, vectorised with NumPy.

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
"""

from __future__ import annotations

import math
from enum import Enum

import numpy as np
from gguf import GGMLQuantizationType, LlamaFileType

from .errors import ContractError

QK8_0 = 32  # values per Q8_0 block
Q8_0_BLOCK_BYTES = 2 + QK8_0
_CHUNK_VALUES = 1 << 20  # values quantised per step
#: Largest |x| whose Q8_0 block scale (max|x| / 127) still fits a float16.
Q8_0_MAX_ABS = float(np.finfo(np.float16).max) * 127
F16_MAX = float(np.finfo(np.float16).max)  # 65504
#: Smallest float32 magnitude that rounds (to nearest even) to a bfloat16 infinity.
BF16_OVERFLOW = float(np.array(0x7F7F8000, dtype=np.uint32).view(np.float32))


class OutType(str, Enum):
    """The ``--outtype`` choices: the type of every 2-D matrix (norms always stay F32)."""

    Q8_0 = "q8_0"
    BF16 = "bf16"
    F16 = "f16"
    F32 = "f32"

    @property
    def ggml_type(self) -> GGMLQuantizationType:
        return _GGML[self]

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


def encode(x: np.ndarray, qtype: GGMLQuantizationType, name: str = "tensor") -> np.ndarray:
    """``x`` (float32) in the bytes/elements GGUF stores for ``qtype``; same leading shape.

    Returns float32 / float16 arrays for F32 / F16, a uint16 array of bit patterns for BF16,
    and a uint8 array of shape ``(..., cols // 32 * 34)`` for Q8_0. Raises ContractError
    (naming ``name``) for NaN/Inf or a value ``qtype`` cannot hold.
    """
    x = np.asarray(x, dtype=np.float32)
    check_values(x, qtype, name)
    if qtype == GGMLQuantizationType.F32:
        return x
    if qtype == GGMLQuantizationType.F16:
        return x.astype(np.float16)
    if qtype == GGMLQuantizationType.BF16:
        return to_bf16_bits(x)
    if qtype == GGMLQuantizationType.Q8_0:
        return quantize_q8_0(x)
    raise ValueError(f"unsupported output type {qtype.name}")


def check_values(x: np.ndarray, qtype: GGMLQuantizationType, name: str = "tensor") -> None:
    """Refuse NaN/Inf (any type) and magnitudes ``qtype`` would turn into Inf or garbage.

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
