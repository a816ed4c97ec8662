"""From the tensors a checkpoint ships to the tensors the GGUF holds.

Two steps, both pure functions of the config and the tensor *index* (no weights are read):

1. :func:`sanitize` binds the canonical key set of SPEC §2 (the rules are
   :func:`convert.checkpoint.sanitize_keys`, shared with the training model) to the stored
   tensors, stacking split ``q_proj/k_proj/v_proj`` rows into one ``qkv_proj``.
2. :func:`gguf_plan` maps each canonical tensor to its GGUF name(s) (SPEC §5a, names from
   :mod:`convert.gguf.keys`), splitting ``qkv_proj`` back into ``attn_q``/``attn_k``/``attn_v``
   by row range.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import numpy as np

from .gguf import keys as K
from .checkpoint import DrafterConfig, expected_tensors, sanitize_keys
from .errors import ContractError, UserError
from .safetensors_io import TensorRef, read_header

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


# --------------------------------------------------------------------------- reading the index


def read_tensor_index(drafter_dir: Path) -> dict[str, TensorRef]:
    """Every tensor of the checkpoint by its key as stored: ``model.safetensors`` or a sharded index."""
    single, index = drafter_dir / SINGLE_FILE, drafter_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UserError(f"{index}: not a safetensors index with a weight_map ({e})") from None
        if not isinstance(weight_map, dict):
            raise ContractError(index, "weight_map", "an object {tensor: shard file}", type(weight_map).__name__)
        refs: dict[str, TensorRef] = {}
        for shard in sorted(set(weight_map.values())):
            path = drafter_dir / str(shard)
            if not path.is_file():
                raise ContractError(index, "weight_map", f"shard {shard} to exist", "no such file")
            refs.update(read_header(path))
        listed, found = set(weight_map), set(refs)
        if listed != found:
            key = sorted(listed ^ found)[0]
            where = "listed in the index but not in its shard" if key in listed else "in a shard but not in the index"
            raise ContractError(index, key, "the same tensors in the index and in the shards", where)
        return refs
    if single.is_file():
        return read_header(single)
    raise UserError(f"{drafter_dir}: expected {SINGLE_FILE} or {INDEX_FILE}, found neither")


# --------------------------------------------------------------------------- sanitising


@dataclass(frozen=True)
class RowStack:
    """A canonical tensor: one stored tensor, or several stacked along rows (split q/k/v)."""

    parts: tuple[TensorRef, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        first = self.parts[0].shape
        return (sum(p.n_rows for p in self.parts), *first[1:])

    @property
    def where(self) -> str:
        return ", ".join(p.name for p in self.parts)

    def read_rows(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``start:stop`` of the stacked tensor as float32 (reads only the parts it touches)."""
        stop = self.shape[0] if stop is None else stop
        pieces, base = [], 0
        for p in self.parts:
            lo, hi = max(start, base), min(stop, base + p.n_rows)
            if lo < hi:
                pieces.append(p.read_rows(lo - base, hi - base))
            base += p.n_rows
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=0)


def sanitize(refs: Mapping[str, TensorRef], cfg: DrafterConfig, source: Path) -> dict[str, RowStack]:
    """The canonical tensors of SPEC §2 (in :func:`expected_tensors` order), or a ContractError.

    The rules are :func:`convert.checkpoint.sanitize_keys`; ``source`` (the drafter directory)
    is named in errors that concern no single file.
    """
    stored = sanitize_keys({k: r.shape for k, r in refs.items()}, cfg, {k: r.file for k, r in refs.items()}, source)
    return {name: RowStack(tuple(refs[k] for k in keys)) for name, keys in stored.items()}


def load_checkpoint(drafter_dir: Path, cfg: DrafterConfig) -> dict[str, RowStack]:
    """Index + sanitise a drafter directory: the canonical tensors, ready to convert."""
    return sanitize(read_tensor_index(drafter_dir), cfg, drafter_dir)


# --------------------------------------------------------------------------- the GGUF layout


class Kind(str, Enum):
    NORM = "norm"  # 1-D, always F32
    MATRIX = "matrix"  # 2-D, in the chosen output type


#: HF (canonical) name -> GGUF name for the tensors outside the blocks; ``{i}`` is the aux index.
GLOBAL_NAMES: tuple[tuple[str, str], ...] = (
    ("fc.weight", K.FC),
    ("hidden_norm.weight", K.HIDDEN_NORM),
    ("aux_hidden_norms.{i}.weight", K.AUX_HIDDEN_NORM),
    ("norm.weight", K.OUTPUT_NORM),
)

#: Per block: HF suffix after ``layers.{n}.`` -> GGUF suffix after ``blk.{n}.``.
#: ``qkv_proj`` is the one HF tensor that becomes three GGUF tensors (q, k, v rows);
#: ``g_proj`` is absent when gating is disabled.
BLOCK_NAMES: tuple[tuple[str, str], ...] = (
    ("input_layernorm.weight", K.ATTN_NORM),
    ("self_attn.qkv_proj.weight#q", K.ATTN_Q),
    ("self_attn.qkv_proj.weight#k", K.ATTN_K),
    ("self_attn.qkv_proj.weight#v", K.ATTN_V),
    ("self_attn.q_norm.weight", K.ATTN_Q_NORM),
    ("self_attn.k_norm.weight", K.ATTN_K_NORM),
    ("self_attn.g_proj.weight", K.ATTN_GATE),
    ("self_attn.o_proj.weight", K.ATTN_OUTPUT),
    ("post_attention_layernorm.weight", K.POST_ATTENTION_NORM),
    ("mlp.gate_proj.weight", K.FFN_GATE),
    ("mlp.up_proj.weight", K.FFN_UP),
    ("mlp.down_proj.weight", K.FFN_DOWN),
)


@dataclass(frozen=True)
class LayoutEntry:
    """One GGUF tensor: its name, the canonical HF tensor and row range it comes from, its numpy shape.

    ``shape`` is in numpy/safetensors order (rows, cols); the GGUF ``ne`` is its reverse.
    """

    name: str
    hf_name: str
    rows: tuple[int, int]
    shape: tuple[int, ...]

    @property
    def kind(self) -> Kind:
        return Kind.NORM if len(self.shape) == 1 else Kind.MATRIX


def gguf_layout(cfg: DrafterConfig) -> list[LayoutEntry]:
    """Every GGUF tensor of the drafter in file order, from the config alone."""
    shapes = expected_tensors(cfg)
    q, kv = cfg.q_rows, cfg.kv_rows
    qkv_rows = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}

    def entry(gguf: str, hf: str) -> LayoutEntry:
        hf, _, part = hf.partition("#")
        shape = shapes[hf]
        rows = qkv_rows[part] if part else (0, shape[0])
        return LayoutEntry(gguf, hf, rows, (rows[1] - rows[0], *shape[1:]))

    out: list[LayoutEntry] = []
    for hf, gguf in GLOBAL_NAMES:
        if "{i}" in hf:
            out += [entry(gguf.format(i=i), hf.format(i=i)) for i in range(len(cfg.target_layer_ids))]
        else:
            out.append(entry(gguf, hf))
    for n in range(cfg.num_hidden_layers):
        out += [entry(K.block_tensor(n, gguf), f"layers.{n}.{hf}") for hf, gguf in BLOCK_NAMES
                if f"layers.{n}.{hf.partition('#')[0]}" in shapes]
    return out


@dataclass(frozen=True)
class PlannedTensor:
    """A layout entry bound to the checkpoint tensor it is read from."""

    entry: LayoutEntry
    source: RowStack

    def read(self) -> np.ndarray:
        return self.source.read_rows(*self.entry.rows)


def gguf_plan(cfg: DrafterConfig, tensors: Mapping[str, RowStack]) -> list[PlannedTensor]:
    """Bind every GGUF tensor of :func:`gguf_layout` to its (sanitised) source."""
    return [PlannedTensor(e, tensors[e.hf_name]) for e in gguf_layout(cfg)]
