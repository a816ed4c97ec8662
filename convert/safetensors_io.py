"""Lazy, streaming access to safetensors files (and a streaming writer for synthetic checkpoints).

We parse the format ourselves instead of using ``safetensors.numpy`` because NumPy has no
bfloat16 (the library refuses BF16 tensors) and because we want to read *row ranges* of a
tensor with plain file reads: nothing is memory-mapped, so the resident memory of a
conversion stays near the size of the tensor being converted, not the size of the file.

Format: an 8-byte little-endian header length ``N``, ``N`` bytes of JSON
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, then the
data block; offsets are relative to the start of the data block.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np

from .errors import ContractError, UserError

#: Source dtypes we can read, with their item size in bytes.
READABLE_DTYPES: dict[str, int] = {"BF16": 2, "F16": 2, "F32": 4}

_MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorRef:
    """One tensor inside a safetensors file: where its bytes are, not the bytes themselves."""

    file: Path
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the first element in ``file``
    nbytes: int

    @property
    def n_rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_elems(self) -> int:
        return math.prod(self.shape[1:])

    def read_rows(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``start:stop`` (along the first axis) as float32, read straight from the file."""
        stop = self.n_rows if stop is None else stop
        if not 0 <= start <= stop <= self.n_rows:
            raise ValueError(f"{self.name}: row range {start}:{stop} outside 0:{self.n_rows}")
        itemsize = READABLE_DTYPES[self.dtype]
        count = (stop - start) * self.row_elems
        raw = _pread_array(self.file, self.offset + start * self.row_elems * itemsize, count, itemsize)
        out = _decode(raw, self.dtype)
        return out.reshape((stop - start, *self.shape[1:]) if self.shape else ())


def _pread_array(path: Path, offset: int, count: int, itemsize: int) -> np.ndarray:
    dtype = np.uint16 if itemsize == 2 else np.uint32
    buf = np.empty(count, dtype=dtype)
    view = memoryview(buf).cast("B")
    try:
        with open(path, "rb", buffering=0) as f:
            f.seek(offset)
            got = 0
            while got < len(view):
                n = f.readinto(view[got:])
                if not n:
                    raise UserError(f"{path}: truncated file: expected {len(view)} bytes at offset {offset}, "
                                    f"found {got}")
                got += n
    except OSError as e:  # e.g. the file went away or the disk failed mid-conversion
        raise UserError(f"{path}: cannot read tensor data at offset {offset}: {e.strerror or e}") from None
    return buf


def _decode(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "F32":
        return raw.view(np.float32)
    if dtype == "F16":
        return raw.view(np.float16).astype(np.float32)
    # BF16: the upper half of an IEEE float32; widen in place-ish (one uint32 buffer).
    wide = raw.astype(np.uint32)
    wide <<= 16
    return wide.view(np.float32)


def read_header(path: Path) -> dict[str, TensorRef]:
    """Every tensor of one safetensors file, by name (file order)."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # opening a FIFO would block; a device has no header
            raise UserError(f"{path}: expected a regular safetensors file, found {file_kind(st.st_mode)}")
        size = st.st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise ContractError(path, "header", "a safetensors file (8-byte header length)", f"{len(head)} bytes")
            (n,) = struct.unpack("<Q", head)
            if n > min(_MAX_HEADER, size - 8):
                raise ContractError(path, "header", "a safetensors file", f"a header length of {n} bytes")
            header = json.loads(f.read(n))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a readable safetensors file ({e.__class__.__name__}: {e})") from None
    if not isinstance(header, dict):
        raise ContractError(path, "header", "a JSON object", type(header).__name__)
    base = 8 + n
    refs: dict[str, TensorRef] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = str(info["dtype"])
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ContractError(path, name, "dtype, shape and data_offsets", info) from None
        if dtype not in READABLE_DTYPES:
            raise ContractError(path, f"{name}.dtype", " or ".join(READABLE_DTYPES), dtype)
        want = math.prod(shape) * READABLE_DTYPES[dtype]
        if end - begin != want or begin < 0 or base + end > size:
            raise ContractError(path, f"{name}.data_offsets", f"{want} bytes inside the file", f"[{begin}, {end}]")
        refs[name] = TensorRef(path, name, dtype, shape, base + begin, end - begin)
    return refs


def file_kind(mode: int) -> str:
    """``a directory``, ``a FIFO``, ``a character device``...: what a non-regular file is, in words."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return kind
    return "a special file"


def index_shard_files(index: Path, root: Path) -> list[Path]:
    """The shard files a ``model.safetensors.index.json`` names, each confined to ``root``.

    Anything read from a downloaded index is untrusted: an entry may not be absolute, contain
    ``..``, or resolve (through symlinks) outside ``root``, so an index cannot make the converter
    read, and copy into its output, a file elsewhere on the machine. One layout is allowed
    outside ``root``: the Hugging Face cache, whose ``snapshots/<revision>/`` files are symlinks
    into the repository's ``blobs/``. An index that is not valid JSON with a ``weight_map`` object
    gives ``[]``; the tensor index reports that.
    """
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if not isinstance(weight_map, dict):
        return []
    real_root = root.resolve()
    allowed = [real_root]
    if real_root.parent.name == "snapshots":
        allowed.append(real_root.parent.parent / "blobs")
    shards: dict[str, Path] = {}
    for tensor, shard in weight_map.items():
        if isinstance(shard, str) and shard in shards:
            continue
        where = f"weight_map[{json.dumps(tensor)}]"
        if not isinstance(shard, str) or not shard or "\0" in shard:
            raise ContractError(index, where, "a shard file name", json.dumps(shard))
        rel = PurePosixPath(shard)
        if rel.is_absolute() or ".." in rel.parts:
            raise ContractError(index, where, f"a shard file inside {root} (no absolute path, no '..')",
                                json.dumps(shard))
        real = (root / rel).resolve()
        if not any(real.is_relative_to(a) for a in allowed):
            raise ContractError(index, where, f"a shard file inside {root}",
                                f"{json.dumps(shard)}, which leads to {real}")
        shards[shard] = root / rel
    return list(shards.values())


# --------------------------------------------------------------------------- writing


@dataclass(frozen=True)
class PlannedTensor:
    """A tensor to write: its name, safetensors dtype and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * READABLE_DTYPES[self.dtype]


def write_streaming(
    path: Path,
    plan: Iterable[PlannedTensor],
    data: Iterable[np.ndarray],
    *,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write a safetensors file whose tensors come one at a time from ``data``.

    ``plan`` fixes names, dtypes and shapes (so the header is written first); ``data`` yields
    the arrays in plan order: float32 / float16 arrays, or uint16 arrays holding BF16 bits.
    Only one tensor is in memory at a time.
    """
    plan = list(plan)
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    pos = 0
    for t in plan:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [pos, pos + t.nbytes]}
        pos += t.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path.with_name(path.name + f".partial-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            for t, arr in zip(plan, data, strict=True):
                arr = np.ascontiguousarray(arr)
                if tuple(arr.shape) != t.shape or arr.nbytes != t.nbytes:
                    raise ValueError(f"{t.name}: planned {t.dtype}{list(t.shape)}, got {arr.dtype}{list(arr.shape)}")
                arr.tofile(f)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
