"""Read a GGUF file's header — metadata and tensor infos — as untrusted input, quickly.

Every length, count and type tag is checked against the bytes that are really there, so a
truncated or corrupt file becomes one :class:`~convert.errors.UserError` ("FILE: not a readable
GGUF file (why)") naming what was being read and where, never an exception from deep inside a parser (or, later, a read past
the end of a memory map inside llama.cpp). Tensor data is not read, only checked to lie inside
the file. Reading a 150k-token vocabulary takes milliseconds (gguf-py's reader builds numpy
views per string and takes seconds).

    header = read_header(Path("model.gguf"))
    header.arch, header.get("laguna.block_count"), header.fields["tokenizer.ggml.tokens"].value[:3]
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from .errors import UserError
from . import keys as K

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4
#: Bounds on counts, so a corrupt count cannot make us loop for hours (llama.cpp's are looser).
MAX_KV = 1 << 20
MAX_TENSORS = 1 << 24
#: The most tokens a vocabulary may have (the largest published ones have 262k): the tokenizer's
#: per-token arrays are read into Python objects, dozens of bytes per element, so their length
#: is bounded by this and then by the vocabulary's own length.
MAX_VOCAB = 1 << 20
#: tokenizer arrays with one element per token (merges: at most one per token too, in BPE)
PER_TOKEN_ARRAYS = (K.TOKENS, K.TOKEN_SCORES, K.TOKEN_TYPES,
                    K.MERGES)
#: Any other array longer than this is not decoded up front but read from the file when used
#: (:class:`LazyArray`): the per-layer arrays rules check are far shorter.
EAGER_ARRAY_MAX = 1 << 16

_SCALARS = {
    GGUFValueType.UINT8: struct.Struct("<B"), GGUFValueType.INT8: struct.Struct("<b"),
    GGUFValueType.UINT16: struct.Struct("<H"), GGUFValueType.INT16: struct.Struct("<h"),
    GGUFValueType.UINT32: struct.Struct("<I"), GGUFValueType.INT32: struct.Struct("<i"),
    GGUFValueType.UINT64: struct.Struct("<Q"), GGUFValueType.INT64: struct.Struct("<q"),
    GGUFValueType.FLOAT32: struct.Struct("<f"), GGUFValueType.FLOAT64: struct.Struct("<d"),
    GGUFValueType.BOOL: struct.Struct("<B"),
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class Value:
    """One metadata value with its GGUF type; arrays are lists (strings as raw bytes), or a
    :class:`LazyArray` when long and not a tokenizer's per-token array."""

    type: GGUFValueType
    value: object
    sub_type: GGUFValueType | None = None

    @property
    def is_array(self) -> bool:
        return self.type == GGUFValueType.ARRAY

    def type_name(self) -> str:
        return f"{self.sub_type.name} array" if self.is_array and self.sub_type else self.type.name


class LazyArray(Sequence):
    """A long metadata array that nothing reads up front: its length is known, its elements are
    read from the file on use, one at a time (iteration streams, never holds them all)."""

    def __init__(self, path: Path, key: str, sub_type: GGUFValueType, count: int, start: int) -> None:
        self.path, self.key, self.sub_type, self.count, self.start = path, key, sub_type, count, start

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            c = _Cursor(self.path, buf, len(buf))
            c.pos = self.start
            for i in range(self.count):
                yield c.value(self.sub_type, f"{self.key}[{i}]").value

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.count))]
        if index < 0:
            index += self.count
        if not 0 <= index < self.count:
            raise IndexError(index)
        if self.sub_type != GGUFValueType.STRING:  # fixed width: read just that element
            st = _SCALARS[self.sub_type]
            with open(self.path, "rb") as f:
                f.seek(self.start + index * st.size)
                v = st.unpack(f.read(st.size))[0]
            return bool(v) if self.sub_type == GGUFValueType.BOOL else v
        for i, item in enumerate(self):
            if i == index:
                return item

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == self.count and all(a == b for a, b in zip(self, other))

    __hash__ = None

    def __repr__(self) -> str:
        return f"<{self.count} {self.sub_type.name} elements, read on use>"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (the reverse of GGUF's ne)
    qtype: GGMLQuantizationType
    offset: int  # absolute, in the file
    nbytes: int


@dataclass(frozen=True)
class Header:
    path: Path
    version: int
    fields: dict[str, Value]
    tensors: list[TensorInfo]
    data_offset: int
    file_size: int

    @property
    def arch(self) -> str | None:
        v = self.fields.get(K.GENERAL_ARCHITECTURE)
        return v.value.decode("utf-8", errors="replace") if v and v.type == GGUFValueType.STRING else None

    def get(self, key: str) -> object:
        """The decoded value (strings as str), or None when the key is absent."""
        v = self.fields.get(key)
        if v is None:
            return None
        if v.type == GGUFValueType.STRING:
            return v.value.decode("utf-8", errors="replace")
        return v.value


def unreadable(path: Path, why: str) -> UserError:
    return UserError(f"{path}: not a readable GGUF file ({why})")


class _Cursor:
    def __init__(self, path: Path, buf, size: int) -> None:
        self.path, self.buf, self.size, self.pos = path, buf, size, 0

    def need(self, n: int, what: str) -> int:
        start = self.pos
        if n < 0 or start + n > self.size:
            raise unreadable(self.path, f"truncated: {what} needs bytes {start}..{start + n}, the file has {self.size}")
        self.pos += n
        return start

    def unpack(self, st: struct.Struct, what: str):
        return st.unpack_from(self.buf, self.need(st.size, what))[0]

    def string(self, what: str) -> bytes:
        n = self.unpack(_U64, f"the length of {what}")
        start = self.need(n, what)
        return bytes(self.buf[start:start + n])

    def value_type(self, what: str) -> GGUFValueType:
        code = self.unpack(_U32, f"the type of {what}")
        try:
            return GGUFValueType(code)
        except ValueError:
            raise unreadable(self.path, f"{what}: unknown value type {code}") from None

    def scalar(self, vtype: GGUFValueType, what: str):
        v = self.unpack(_SCALARS[vtype], what)
        return bool(v) if vtype == GGUFValueType.BOOL else v

    def _strings(self, n: int, what: str, keep: bool = True) -> list[bytes]:
        """The next ``n`` strings (``keep=False``: only stepped over, bounds still checked)."""
        # the hot loop of a vocabulary: no per-item message formatting, one bounds check each
        buf, size, pos, items = self.buf, self.size, self.pos, []
        length = _U64.unpack_from
        for i in range(n):
            ln = length(buf, pos)[0] if pos + 8 <= size else -1
            if ln < 0 or pos + 8 + ln > size:
                self.pos = pos
                self.need(8 + max(ln, 0), f"{what}[{i}]")
            if keep:
                items.append(bytes(buf[pos + 8:pos + 8 + ln]))
            pos += 8 + ln
        self.pos = pos
        return items

    def value(self, vtype: GGUFValueType, what: str) -> Value:
        if vtype == GGUFValueType.STRING:
            return Value(vtype, self.string(what))
        if vtype != GGUFValueType.ARRAY:
            return Value(vtype, self.scalar(vtype, what))
        sub = self.value_type(f"the elements of {what}")
        n = self.unpack(_U64, f"the length of {what}")
        if sub == GGUFValueType.ARRAY:
            raise unreadable(self.path, f"{what}: an array of arrays")
        if what in PER_TOKEN_ARRAYS and n > MAX_VOCAB:
            raise unreadable(self.path, f"{what}: {n} elements, expected at most {MAX_VOCAB} (one per token)")
        lazy = n > EAGER_ARRAY_MAX and what not in PER_TOKEN_ARRAYS
        if sub == GGUFValueType.STRING:
            if n * 8 > self.size - self.pos:  # each string has at least its 8-byte length
                self.need(n * 8, f"{n} strings of {what}")
            if lazy:
                start = self.pos
                self._strings(n, what, keep=False)
                return Value(vtype, LazyArray(self.path, what, sub, n, start), sub)
            return Value(vtype, self._strings(n, what), sub)
        if lazy:
            start = self.need(n * _SCALARS[sub].size, f"{n} elements of {what}")
            return Value(vtype, LazyArray(self.path, what, sub, n, start), sub)
        st = _SCALARS[sub]
        start = self.need(n * st.size, f"{n} elements of {what}")
        items = [v[0] for v in struct.iter_unpack(st.format, self.buf[start:start + n * st.size])]
        if sub == GGUFValueType.BOOL:
            items = [bool(v) for v in items]
        return Value(vtype, items, sub)


def read_header(path: Path | str) -> Header:
    """The header of a GGUF file; UserError for anything that is not a complete, readable one."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                raise unreadable(path, f"{size} bytes, shorter than a GGUF header")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(path, buf, size)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise unreadable(path, "a directory") from None
    except (OSError, ValueError) as e:  # unreadable, or not mappable (a FIFO, a device)
        raise unreadable(path, str(e)) from None


def _check_per_token_arrays(path: Path, fields: dict[str, Value]) -> None:
    tokens = fields.get(PER_TOKEN_ARRAYS[0])
    if tokens is None or not tokens.is_array:
        return
    n_vocab = len(tokens.value)
    for key in PER_TOKEN_ARRAYS[1:]:
        v = fields.get(key)
        if v is not None and v.is_array and len(v.value) > n_vocab:
            raise unreadable(path, f"{key}: {len(v.value)} elements, expected at most {n_vocab} "
                                   f"(one per token of {PER_TOKEN_ARRAYS[0]})")


def _parse(path: Path, buf, size: int) -> Header:
    c = _Cursor(path, buf, size)
    magic = bytes(buf[0:4])
    c.pos = 4
    if magic != GGUF_MAGIC:
        raise unreadable(path, f"magic {magic!r}, expected {GGUF_MAGIC!r}")
    version = c.unpack(_U32, "the version")
    if version not in SUPPORTED_VERSIONS:
        raise unreadable(path, f"GGUF version {version}, expected one of {list(SUPPORTED_VERSIONS)}")
    n_tensors = c.unpack(_U64, "the tensor count")
    n_kv = c.unpack(_U64, "the metadata count")
    if n_kv > MAX_KV or n_tensors > MAX_TENSORS:
        raise unreadable(path, f"corrupt header: {n_kv} metadata keys, {n_tensors} tensors")
    fields: dict[str, Value] = {}
    for i in range(n_kv):
        raw = c.string(f"metadata key #{i}")
        try:
            key = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise unreadable(path, f"metadata key #{i} is not UTF-8 ({raw[:40]!r})") from None
        if key in fields:
            raise unreadable(path, f"metadata key {key} appears twice")
        fields[key] = c.value(c.value_type(key), key)
    _check_per_token_arrays(path, fields)
    alignment = DEFAULT_ALIGNMENT
    if K.GENERAL_ALIGNMENT in fields:
        a = fields[K.GENERAL_ALIGNMENT]
        if a.type != GGUFValueType.UINT32 or a.value == 0 or a.value & (a.value - 1):
            raise unreadable(path, f"general.alignment: expected a power of two (UINT32), found {a.value!r}")
        alignment = a.value
    infos = []
    for i in range(n_tensors):
        name = c.string(f"the name of tensor #{i}").decode("utf-8", errors="replace")
        n_dims = c.unpack(_U32, f"the dimension count of tensor {name}")
        if not 1 <= n_dims <= GGML_MAX_DIMS:
            raise unreadable(path, f"tensor {name}: {n_dims} dimensions, expected 1..{GGML_MAX_DIMS}")
        ne = [c.unpack(_U64, f"the shape of tensor {name}") for _ in range(n_dims)]
        code = c.unpack(_U32, f"the type of tensor {name}")
        offset = c.unpack(_U64, f"the data offset of tensor {name}")
        infos.append((name, ne, code, offset))
    data_offset = -(-c.pos // alignment) * alignment
    tensors = []
    for name, ne, code, offset in infos:
        try:
            qtype = GGMLQuantizationType(code)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise unreadable(path, f"tensor {name}: unknown tensor type {code}") from None
        n = 1
        for d in ne:
            n *= d
        if any(d < 1 for d in ne) or n > 1 << 62 or ne[0] % block:
            raise unreadable(path, f"tensor {name}: shape {ne} cannot hold {qtype.name} blocks of {block}")
        if offset % alignment:
            raise unreadable(path, f"tensor {name}: data offset {offset} is not a multiple of {alignment}")
        nbytes = n // block * type_size
        start = data_offset + offset
        if start + nbytes > size:
            raise unreadable(path, f"truncated: tensor {name} needs bytes {start}..{start + nbytes}, the file has {size}")
        tensors.append(TensorInfo(name, tuple(reversed(ne)), qtype, start, nbytes))
    return Header(path, version, fields, tensors, data_offset, size)
