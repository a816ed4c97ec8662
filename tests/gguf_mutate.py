"""Write copies of a GGUF file with one metadata value replaced (any type) or cut short.

Fields are located with gguf-py's reader once per source file; a mutated copy is the source's
bytes with that one key/value record re-encoded, the tensor-info section re-aligned and the
tensor data appended unchanged (tensor offsets are relative to the data section, so they stay
valid). Used by the fuzz test and the range-check tests.

    src = Source.of(path)
    src.write_value(out, key, GGUFValueType.FLOAT32, -1.0)
    src.write_truncated(out, src.data_offset + 100)
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gguf import GGUFReader, GGUFValueType

SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q", GGUFValueType.FLOAT32: "<f",
    GGUFValueType.FLOAT64: "<d", GGUFValueType.BOOL: "<?",
}
INT_RANGES = {
    GGUFValueType.UINT8: (0, 2**8 - 1), GGUFValueType.INT8: (-(2**7), 2**7 - 1),
    GGUFValueType.UINT16: (0, 2**16 - 1), GGUFValueType.INT16: (-(2**15), 2**15 - 1),
    GGUFValueType.UINT32: (0, 2**32 - 1), GGUFValueType.INT32: (-(2**31), 2**31 - 1),
    GGUFValueType.UINT64: (0, 2**64 - 1), GGUFValueType.INT64: (-(2**63), 2**63 - 1),
}
FLOATS = (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64)

#: The values every numeric key is tried with (issue 18): label -> value.
FUZZ_VALUES: dict[str, float | int] = {
    "0": 0, "-1": -1, "nan": math.nan, "+inf": math.inf, "-inf": -math.inf, "2^31": 2**31, "2^63": 2**63,
}

def encode_string(s: bytes | str) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b

def encode_value(vtype: GGUFValueType, value, sub_type: GGUFValueType | None = None) -> bytes:
    """A value's bytes after its type tag (arrays: element type, count, elements)."""
    if vtype == GGUFValueType.STRING:
        return encode_string(value)
    if vtype == GGUFValueType.ARRAY:
        assert sub_type is not None
        body = b"".join(encode_value(sub_type, v) for v in value)
        return struct.pack("<IQ", int(sub_type), len(value)) + body
    return struct.pack(SCALAR_FORMATS[vtype], value)

def encode_kv(key: str, vtype: GGUFValueType, value, sub_type: GGUFValueType | None = None) -> bytes:
    return encode_string(key) + struct.pack("<I", int(vtype)) + encode_value(vtype, value, sub_type)

def holding_type(original: GGUFValueType, value) -> GGUFValueType:
    """``original`` when it can store ``value``; else the GGUF type a writer would pick for it."""
    if isinstance(value, float) and not value.is_integer():
        return original if original in FLOATS else GGUFValueType.FLOAT32
    if isinstance(value, float) or original in FLOATS:
        return original if original in FLOATS else GGUFValueType.FLOAT32
    lo, hi = INT_RANGES.get(original, (1, 0))
    if lo <= value <= hi:
        return original
    return GGUFValueType.INT64 if -(2**63) <= value < 2**63 else GGUFValueType.UINT64

def cast(vtype: GGUFValueType, value):
    return float(value) if vtype in FLOATS else int(value)

@dataclass(frozen=True)
class Field:
    key: str
    start: int  # first byte of the key/value record
    end: int  # one past its last byte
    type: GGUFValueType
    sub_type: GGUFValueType | None
    value: object  # a scalar, or a list for arrays (strings as bytes)

@dataclass
class Source:
    path: Path
    data: bytes
    fields: dict[str, Field]
    ti_end: int  # end of the tensor-info section
    data_offset: int  # start of the tensor data (aligned)
    alignment: int

    @classmethod
    def of(cls, path: Path) -> "Source":
        r = GGUFReader(path, "r")
        fields = {}
        for key, f in r.fields.items():
            if key.startswith("GGUF."):
                continue
            end = f.offset + sum(int(p.nbytes) for p in f.parts)
            main = GGUFValueType(f.types[0])
            sub = GGUFValueType(f.types[1]) if main == GGUFValueType.ARRAY else None
            if main == GGUFValueType.ARRAY:
                value = [bytes(f.parts[i]) if sub == GGUFValueType.STRING else f.parts[i][0].item() for i in f.data]
            elif main == GGUFValueType.STRING:
                value = bytes(f.parts[f.data[0]])
            else:
                value = f.parts[f.data[0]][0].item()
            fields[key] = Field(key, int(f.offset), end, main, sub, value)
        last = r.tensors[-1].field
        ti_end = int(last.offset) + sum(int(p.nbytes) for p in last.parts)
        alignment = int(fields["general.alignment"].value) if "general.alignment" in fields else 32
        data = Path(path).read_bytes()
        return cls(Path(path), data, fields, ti_end, int(r.data_offset), alignment)

    def numeric_keys(self) -> list[str]:
        numeric = set(SCALAR_FORMATS) - {GGUFValueType.BOOL}
        return [k for k, f in self.fields.items()
                if f.type in numeric or (f.type == GGUFValueType.ARRAY and f.sub_type in numeric)]

    def fuzz_cases(self) -> Iterator[tuple[str, str]]:
        """(key, value label) for every numeric key and every value of FUZZ_VALUES."""
        for key in self.numeric_keys():
            for label in FUZZ_VALUES:
                yield key, label

    def write_fuzzed(self, out: Path, key: str, label: str) -> str:
        """Write the copy where ``key`` (its first element, for an array) holds FUZZ_VALUES[label]
        in a type that can hold it; returns a description of what was written."""
        f = self.fields[key]
        value = FUZZ_VALUES[label]
        if f.type == GGUFValueType.ARRAY:
            sub = holding_type(f.sub_type, value)
            items = [cast(sub, value)] + [cast(sub, v) for v in f.value[1:]]
            self.write_value(out, key, GGUFValueType.ARRAY, items, sub)
            return f"{key}[0] = {label} ({sub.name} array)"
        vtype = holding_type(f.type, value)
        self.write_value(out, key, vtype, cast(vtype, value))
        return f"{key} = {label} ({vtype.name})"

    def write_value(self, out: Path, key: str, vtype: GGUFValueType, value, sub_type=None) -> None:
        f = self.fields[key]
        head = self.data[:f.start] + encode_kv(key, vtype, value, sub_type) + self.data[f.end:self.ti_end]
        pad = -len(head) % self.alignment
        Path(out).write_bytes(head + b"\0" * pad + self.data[self.data_offset:])

    def write_record(self, out: Path, key: str, encoded: bytes, *, replace: bool = True) -> None:
        """The copy with ``key``'s value replaced by (or, when ``replace`` is false or the key is
        missing, a new key holding) ``encoded``: a type tag and the value's bytes, as written by
        :func:`encode_kv` after the key; built in bytes, so values of many megabytes are cheap."""
        record = encode_string(key) + encoded
        f = self.fields.get(key) if replace else None
        if f is not None:
            head = self.data[:f.start] + record + self.data[f.end:self.ti_end]
        else:
            n_kv = struct.unpack_from("<Q", self.data, 16)[0]
            last = max(x.end for x in self.fields.values())
            head = (self.data[:16] + struct.pack("<Q", n_kv + 1) + self.data[24:last] + record
                    + self.data[last:self.ti_end])
        pad = -len(head) % self.alignment
        Path(out).write_bytes(head + b"\0" * pad + self.data[self.data_offset:])

    def write_without(self, out: Path, key: str) -> None:
        """The copy with ``key`` removed (the header's key count lowered by one)."""
        f = self.fields[key]
        n_kv = struct.unpack_from("<Q", self.data, 16)[0]
        head = (self.data[:16] + struct.pack("<Q", n_kv - 1) + self.data[24:f.start]
                + self.data[f.end:self.ti_end])
        pad = -len(head) % self.alignment
        Path(out).write_bytes(head + b"\0" * pad + self.data[self.data_offset:])

    def truncation_offsets(self) -> dict[str, int]:
        """Where to cut: inside the header, the metadata, the tensor infos and the tensor data."""
        first, *_, last = sorted(self.fields.values(), key=lambda f: f.start)
        tokens = self.fields.get("tokenizer.ggml.tokens")
        cuts = {
            "empty": 0, "magic": 2, "version": 6, "counts": 20, "header end": 24,
            "first key": first.start + 5, "last value": last.end - 1, "tensor infos": (last.end + self.ti_end) // 2,
            "data start": self.data_offset, "first tensor": self.data_offset + 7,
            "mid data": (self.data_offset + len(self.data)) // 2, "last byte": len(self.data) - 1,
        }
        if tokens is not None:
            cuts["token list"] = (tokens.start + tokens.end) // 2
        return cuts

    def write_truncated(self, out: Path, offset: int) -> None:
        Path(out).write_bytes(self.data[:offset])
