"""A streaming GGUF writer: header and every tensor info first, then the tensors one at a time.

Built on gguf-py's ``GGUFWriter``, driven in its streaming mode (``add_tensor_info`` for every
tensor, then ``write_tensor_data`` per tensor), so no more than one tensor is ever held. The
file is written under a temporary name next to the output and renamed only when complete;
on any failure (or Ctrl-C) the partial file is removed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from .quantize import encoded_nbytes


@dataclass(frozen=True)
class KV:
    """One metadata value with its exact GGUF type (``sub_type`` for arrays).

    Strings may be ``str`` or raw UTF-8 ``bytes`` (copied tokenizer strings stay byte-exact).
    """

    value: Any
    type: GGUFValueType
    sub_type: GGUFValueType | None = None


@dataclass(frozen=True)
class TensorSpec:
    """A tensor to write: GGUF name, numpy-order shape (GGUF ``ne`` is its reverse), GGML type."""

    name: str
    shape: tuple[int, ...]
    qtype: GGMLQuantizationType

    @property
    def nbytes(self) -> int:
        return encoded_nbytes(self.shape, self.qtype)


def partial_path(out: Path) -> Path:
    """The temporary name a file is written under before the final rename."""
    return out.with_name(f"{out.name}.partial-{os.getpid()}")


def write_gguf(
    out: Path,
    arch: str,
    kvs: Mapping[str, KV],
    tensors: Sequence[TensorSpec],
    data: Iterable[np.ndarray],
    on_tensor: Callable[[TensorSpec], None] | None = None,
) -> int:
    """Write ``out`` and return its size in bytes.

    ``data`` yields, in ``tensors`` order, each tensor's encoded array (see
    :func:`convert.quantize.encode`); it is consumed lazily, one tensor at a time.
    """
    tmp = partial_path(out)
    w = GGUFWriter(tmp, arch)
    try:
        for key, kv in kvs.items():
            if key == "general.architecture":
                continue
            w.add_key_value(key, kv.value, kv.type, kv.sub_type)
        for t in tensors:
            w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for t, arr in zip(tensors, data, strict=True):
            if arr.nbytes != t.nbytes:
                raise ValueError(f"{t.name}: planned {t.nbytes} bytes of {t.qtype.name}, got {arr.nbytes}")
            w.write_tensor_data(arr)
            if on_tensor is not None:
                on_tensor(t)
        w.close()
        os.replace(tmp, out)
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise
    return out.stat().st_size
