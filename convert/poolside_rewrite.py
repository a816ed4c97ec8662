"""A Poolside drafter GGUF rewritten into our layout (``dflash-draft``): the tensors and the
metadata planned from convert/mapping.py, matrices copied byte for byte when their type stays."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, Keys
from gguf.quants import dequantize

from .checkpoint import DrafterConfig
from .converter import ARCH, PlannedOutput, Summary, check_output_path, drafter_metadata
from .mapping import Kind, LayoutEntry, gguf_layout
from .poolside import PoolsideFile, Source, poolside_source, read_poolside
from .quantize import OutType, check_encodable, encode
from .target import TargetInfo
from .writer import KV, TensorSpec, write_gguf

_FLOAT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)


@dataclass(frozen=True)
class _CopiedSpec(TensorSpec):
    """A tensor spec for any GGML type, so tensors of types we never encode can be copied as they are."""

    @property
    def nbytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.qtype]
        return int(np.prod(self.shape)) // block * size


def _raw_bytes(t: Any, row: int | None = None) -> np.ndarray:
    data = np.asarray(t.data)
    if row is not None:
        data = data[row]
    return np.ascontiguousarray(data).view(np.uint8).reshape(-1)


def _as_float32(t: Any, row: int | None = None) -> np.ndarray:
    qtype = GGMLQuantizationType(t.tensor_type)
    data = np.asarray(t.data)
    if row is not None:
        data = data[row]
    if qtype == GGMLQuantizationType.F32:
        return np.asarray(data, dtype=np.float32)
    if qtype == GGMLQuantizationType.F16:
        return data.astype(np.float32)
    return dequantize(data, qtype).astype(np.float32, copy=False)


@dataclass
class PoolsideConversion(PlannedOutput):
    """A checked rewrite of a Poolside file into our layout: our tensor specs, their sources, our metadata."""

    pf: PoolsideFile
    target: TargetInfo
    outtype: OutType | None  # None: every matrix keeps its type and bytes
    entries: list[tuple[LayoutEntry, Source]]
    specs: list[TensorSpec]
    metadata: dict[str, KV] = field(repr=False)

    @property
    def cfg(self) -> DrafterConfig:
        return self.pf.cfg

    @property
    def inputs(self) -> tuple[Path, ...]:
        """The files this rewrite reads; the output may be none of them."""
        return (self.pf.path, self.target.source)

    def _data(self) -> Iterator[np.ndarray]:
        for (_, src), spec in zip(self.entries, self.specs, strict=True):
            t = self.pf.tensors[src.name]
            if GGMLQuantizationType(t.tensor_type) == spec.qtype:
                yield _raw_bytes(t, src.row)
            else:
                yield encode(_as_float32(t, src.row), spec.qtype, f"{self.pf.path}: {src.name}")

    def write(self, out: Path, on_tensor: Callable[[TensorSpec], None] | None = None) -> Summary:
        out = Path(out)
        check_output_path(out, self.inputs)
        t0 = time.perf_counter()
        size = write_gguf(out, ARCH, self.metadata, self.specs, self._data(), on_tensor)
        return Summary.of(out, self.specs, size, time.perf_counter() - t0)


def prepare(path: Path | str, target: TargetInfo, outtype: OutType | None = None, *,
            name: str | None = None, source_repo: str | None = None) -> PoolsideConversion:
    """Check a Poolside file against the contract and ``target``, and plan our layout; reads no weights.

    Norm vectors become F32 (exact from F16/BF16); matrices keep their type and bytes unless
    ``outtype`` asks for another type, in which case they are decoded and encoded again.
    """
    pf = read_poolside(path, target)
    entries, specs = [], []
    for e in gguf_layout(pf.cfg):
        src = poolside_source(e, pf.cfg)
        t = pf.tensors[src.name]
        if e.kind is Kind.NORM:
            qtype = GGMLQuantizationType.F32
        else:
            qtype = outtype.ggml_type if outtype is not None else GGMLQuantizationType(t.tensor_type)
        if qtype in _FLOAT_TYPES or qtype == GGMLQuantizationType.Q8_0:
            check_encodable(src.name, e.shape, qtype, str(pf.path))
        entries.append((e, src))
        specs.append(_CopiedSpec(e.name, e.shape, qtype))
    meta = drafter_metadata(pf.cfg, target, outtype or OutType.Q8_0, name=name or pf.name,
                            source_repo=source_repo or pf.source_repo)
    if outtype is None:
        file_type = pf.values.get(Keys.General.FILE_TYPE)
        if isinstance(file_type, int):
            meta[Keys.General.FILE_TYPE] = KV(file_type, GGUFValueType.UINT32)
        else:  # a type we cannot name for certain: better no file type than a wrong one
            meta.pop(Keys.General.FILE_TYPE, None)
    return PoolsideConversion(pf, target, outtype, entries, specs, meta)
