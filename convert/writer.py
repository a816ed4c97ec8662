"""A streaming GGUF writer: header and every tensor info first, then the tensors one at a time.

Built on gguf-py's ``GGUFWriter``, driven in its streaming mode (``add_tensor_info`` for every
tensor, then ``write_tensor_data`` per tensor), so no more than one tensor is ever held. The
file is written under a temporary name next to the output and renamed only when complete;
on any failure (or Ctrl-C, or SIGTERM under :func:`sigterm_raises`) the partial file is removed.

Every metadata value is checked against its GGUF type before any file is created, and an
``OSError`` while writing (a full disk, a read-only or unwritable directory) becomes one
:class:`~convert.errors.UserError` naming the output, so a user never sees a traceback for them.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from .errors import ContractError, UserError
from .quantize import encoded_nbytes
from .gguf import keys as K


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


# --------------------------------------------------------------------------- metadata values

_INT_RANGES = {
    GGUFValueType.UINT8: (0, 2**8 - 1), GGUFValueType.INT8: (-(2**7), 2**7 - 1),
    GGUFValueType.UINT16: (0, 2**16 - 1), GGUFValueType.INT16: (-(2**15), 2**15 - 1),
    GGUFValueType.UINT32: (0, 2**32 - 1), GGUFValueType.INT32: (-(2**31), 2**31 - 1),
    GGUFValueType.UINT64: (0, 2**64 - 1), GGUFValueType.INT64: (-(2**63), 2**63 - 1),
}
_F32_MAX = float(np.finfo(np.float32).max)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _scalar_problem(value: Any, vtype: GGUFValueType) -> str | None:
    """What is wrong with one value for ``vtype`` (None when gguf-py can encode it)."""
    if vtype in _INT_RANGES:
        lo, hi = _INT_RANGES[vtype]
        if not isinstance(value, (int, np.integer)) or not lo <= int(value) <= hi:
            return f"an integer in {lo}..{hi} ({vtype.name})"
    elif vtype in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
            return f"a number ({vtype.name})"
        # struct.pack("<f") refuses finite values beyond float32's range (non-finite ones pack as is).
        if vtype == GGUFValueType.FLOAT32 and math.isfinite(float(value)) and abs(float(value)) > _F32_MAX:
            return f"a number within +-{_F32_MAX:g} (FLOAT32)"
    elif vtype == GGUFValueType.BOOL:
        if not isinstance(value, (bool, np.bool_)) and value not in (0, 1):
            return "true or false (BOOL)"
    elif vtype == GGUFValueType.STRING:
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:  # lone surrogates, e.g. a non-UTF-8 command-line argument
                return "a UTF-8 string"
        elif not isinstance(value, bytes):
            return "a string"
    else:
        return f"a scalar type GGUF can store, not {vtype.name}"
    return None


def check_metadata(out: Path, kvs: Mapping[str, KV]) -> None:
    """Raise ContractError for the first value gguf-py would fail to encode (before any file exists)."""
    for key, kv in kvs.items():
        if kv.type == GGUFValueType.ARRAY:
            values = kv.value
            if kv.sub_type is None or kv.sub_type == GGUFValueType.ARRAY:
                raise ContractError(out, f"metadata {key}", "an array of scalars with a known element type",
                                    "a nested or untyped array")
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
                raise ContractError(out, f"metadata {key}", "a non-empty array", _short(values))
            for i, v in enumerate(values):
                if (problem := _scalar_problem(v, kv.sub_type)) is not None:
                    raise ContractError(out, f"metadata {key}[{i}]", problem, _short(v))
        elif (problem := _scalar_problem(kv.value, kv.type)) is not None:
            raise ContractError(out, f"metadata {key}", problem, _short(kv.value))


# --------------------------------------------------------------------------- signals and OS errors


class Terminated(BaseException):
    """SIGTERM, raised like KeyboardInterrupt so that every cleanup runs (see :func:`sigterm_raises`)."""


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` instead of killing the process outright.

    Without it, SIGTERM ends Python without unwinding, and the partial file stays. A no-op
    outside the main thread (where signal handlers cannot be set).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM until the block ends, so a second Ctrl-C cannot interrupt the cleanup."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def os_reason(e: OSError) -> str:
    """``No space left on device (ENOSPC)``: the OS's words and the errno name."""
    name = errno.errorcode.get(e.errno or 0)
    text = e.strerror or str(e)
    return f"{text} ({name})" if name else text


def _create_exclusive(tmp: Path, out: Path) -> None:
    # O_EXCL: never write through a file (or a planted symlink) that already has the temporary name.
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        raise UserError(f"-o {out}: the temporary file {tmp} already exists (left by another run?); "
                        "remove it and retry") from None
    except OSError as e:
        raise UserError(f"-o {out}: cannot create a file in {tmp.parent}: {os_reason(e)}") from None
    os.close(fd)


def _close_quietly(w: GGUFWriter) -> None:
    # Closing flushes; on a full disk that flush fails again, and the partial file must still go.
    with contextlib.suppress(OSError):
        w.close()
    w.fout = None


def _with_errno(e: OSError, w: GGUFWriter) -> OSError:
    """``e``, or the OS's own error when ``e`` has none.

    NumPy's ``tofile`` reports a short write as "N requested and M written", without the errno
    (a full disk, a quota); one more byte written straight to the descriptor gets it from the OS.
    The file is about to be removed, so the byte does no harm.
    """
    if e.errno is not None or not w.fout:
        return e
    try:
        os.write(w.fout[0].fileno(), b"\0")
    except OSError as probe:
        return probe
    except ValueError:  # the file is already closed (a failed flush at close closes it)
        pass
    return e


@contextlib.contextmanager
def _writing(out: Path, what: str, w: GGUFWriter) -> Iterator[None]:
    try:
        yield
    except OSError as e:
        reason = os_reason(_with_errno(e, w))
        raise UserError(f"-o {out}: writing {what} failed: {reason}; the partial file was removed") from None


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
    :func:`convert.quantize.encode`); it is consumed lazily, one tensor at a time. Errors that
    ``data`` raises (a bad tensor, an unreadable source) pass through unchanged; an OSError of
    the writing itself becomes a UserError naming ``out``. Either way the partial file is removed.
    """
    check_metadata(out, kvs)
    tmp = partial_path(out)
    _create_exclusive(tmp, out)
    w = GGUFWriter(tmp, arch)
    try:
        with _writing(out, "the header", w):
            for key, kv in kvs.items():
                if key == K.GENERAL_ARCHITECTURE:
                    continue
                w.add_key_value(key, kv.value, kv.type, kv.sub_type)
            for t in tensors:
                w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.qtype)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_ti_data_to_file()
        source = iter(data)
        for t in tensors:
            arr = next(source, None)
            if arr is None:
                raise ValueError(f"{t.name}: no data (fewer arrays than tensors)")
            if arr.nbytes != t.nbytes:
                raise ValueError(f"{t.name}: planned {t.nbytes} bytes of {t.qtype.name}, got {arr.nbytes}")
            with _writing(out, f"tensor {t.name}", w):
                w.write_tensor_data(arr)
            if on_tensor is not None:
                on_tensor(t)
        if next(source, None) is not None:
            raise ValueError(f"more arrays than the {len(tensors)} planned tensors")
        with _writing(out, "the end of the file", w):
            w.close()
            os.replace(tmp, out)
    except BaseException:
        with _signals_deferred():
            _close_quietly(w)
            tmp.unlink(missing_ok=True)
        raise
    return out.stat().st_size
