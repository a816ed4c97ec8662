"""The conversion itself: check everything, then stream the drafter into the SPEC §5a GGUF layout.

    target = read_target(Path("Laguna-XS-2.1-Q4_K_M.gguf"))
    job = prepare(Path("Laguna-XS-2.1-DFlash"), target, OutType.Q8_0)   # every check happens here
    summary = job.write(Path("drafter-q8_0.gguf"))                       # one tensor in memory at a time

:func:`prepare` reads no weights: config, tensor index, pairing and encodability are all
checked from headers, so a bad input fails before any output file exists.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_VERSION, GGMLQuantizationType, GGUFValueType

from . import gguf_keys as K
from .checkpoint import DrafterConfig, check_pair, load_config
from .errors import UserError
from .mapping import Kind, PlannedTensor, gguf_plan, load_checkpoint
from .quantize import OutType, check_encodable, encode
from .target import TargetInfo
from .writer import KV, TensorSpec, write_gguf

ARCH = K.ARCH
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

U32, F32, BOOL, STR, ARR, I32 = (GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.BOOL,
                                 GGUFValueType.STRING, GGUFValueType.ARRAY, GGUFValueType.INT32)


def looks_like_repo_id(text: str | None) -> bool:
    """``org/name`` as on the Hugging Face Hub (not an absolute or nested local path)."""
    return bool(text) and bool(_REPO_ID.match(text or "")) and not Path(text or "").exists()


def drafter_metadata(
    cfg: DrafterConfig,
    target: TargetInfo,
    outtype: OutType,
    *,
    name: str,
    source_repo: str | None = None,
) -> dict[str, KV]:
    """Every metadata key of the output file, in file order (SPEC §5a, tokenizer copied from the target).

    A full-attention drafter has no ``attention.sliding_window`` key (ik reads its absence as no
    window) and a pattern of falses; the gating mode is recorded only where ik has no default.
    """
    kv: dict[str, KV] = {
        K.GENERAL_ARCHITECTURE: KV(ARCH, STR),
        K.GENERAL_TYPE: KV("model", STR),
        K.GENERAL_NAME: KV(name, STR),
        K.GENERAL_BASENAME: KV(re.sub(r"\s+", "-", name.strip()), STR),
        K.GENERAL_FILE_TYPE: KV(outtype.file_type, U32),
        K.GENERAL_QUANTIZATION_VERSION: KV(GGML_QUANT_VERSION, U32),
    }
    if source_repo:
        kv[K.GENERAL_SOURCE_REPO] = KV(source_repo, STR)
    sliding = cfg.sliding_window is not None
    kv |= {
        K.VOCAB_SIZE: KV(cfg.vocab_size, U32),
        K.CONTEXT_LENGTH: KV(cfg.max_position_embeddings, U32),
        K.EMBEDDING_LENGTH: KV(cfg.hidden_size, U32),
        K.FEED_FORWARD_LENGTH: KV(cfg.intermediate_size, U32),
        K.BLOCK_COUNT: KV(cfg.num_hidden_layers, U32),
        K.HEAD_COUNT: KV(cfg.num_attention_heads, U32),
        K.HEAD_COUNT_KV: KV(cfg.num_key_value_heads, U32),
        K.KEY_LENGTH: KV(cfg.head_dim, U32),
        K.VALUE_LENGTH: KV(cfg.head_dim, U32),
        K.RMS_EPS: KV(cfg.rms_norm_eps, F32),
        K.CAUSAL: KV(True, BOOL),
    }
    if sliding:
        kv[K.SLIDING_WINDOW] = KV(cfg.sliding_window, U32)
    kv |= {
        K.SLIDING_WINDOW_PATTERN: KV([sliding] * cfg.num_hidden_layers, ARR, BOOL),
        K.ROPE_FREQ_BASE: KV(cfg.rope_theta, F32),
        K.ROPE_DIMENSION_COUNT: KV(cfg.rope_dimension_count, U32),
        K.DFLASH_LAGUNA: KV(True, BOOL),
        K.BLOCK_SIZE: KV(cfg.block_size, U32),
        K.MASK_TOKEN_ID: KV(cfg.mask_token_id, U32),
        K.TARGET_LAYER_IDS: KV(list(cfg.target_layer_ids), ARR, I32),
        K.N_TARGET_FEATURES: KV(len(cfg.target_layer_ids) * target.hidden_size, U32),
        K.GATING: KV(cfg.gating, STR),
        K.TARGET_NAME: KV(target.name, STR),
        K.TARGET_N_LAYER: KV(target.n_layer, U32),
    }
    kv |= target.tokenizer
    return kv


@dataclass
class Summary:
    """What a conversion wrote."""

    out: Path
    n_tensors: int
    n_params: int
    by_type: dict[str, tuple[int, int]]  # GGML type name -> (tensors, bytes)
    file_size: int
    seconds: float


@dataclass
class Conversion:
    """A checked conversion, ready to write: the plan, the output tensor specs and the metadata."""

    drafter_dir: Path
    cfg: DrafterConfig
    target: TargetInfo
    outtype: OutType
    plan: list[PlannedTensor]
    specs: list[TensorSpec]
    metadata: dict[str, KV] = field(repr=False)

    @property
    def total_bytes(self) -> int:
        return sum(s.nbytes for s in self.specs)

    @property
    def n_params(self) -> int:
        return sum(int(np.prod(s.shape)) for s in self.specs)

    def _encoded(self) -> Iterator[np.ndarray]:
        for p, spec in zip(self.plan, self.specs, strict=True):
            label = f"{p.source.parts[0].file}: {p.source.where}"
            x = p.read()
            yield encode(x, spec.qtype, label)
            del x

    def write(self, out: Path, on_tensor: Callable[[TensorSpec], None] | None = None) -> Summary:
        t0 = time.perf_counter()
        size = write_gguf(out, ARCH, self.metadata, self.specs, self._encoded(), on_tensor)
        by_type: dict[str, tuple[int, int]] = {}
        for s in self.specs:
            n, b = by_type.get(s.qtype.name, (0, 0))
            by_type[s.qtype.name] = (n + 1, b + s.nbytes)
        return Summary(out, len(self.specs), self.n_params, by_type, size, time.perf_counter() - t0)


def default_name(drafter_dir: Path, cfg: DrafterConfig) -> str:
    if looks_like_repo_id(cfg.name_or_path):
        return (cfg.name_or_path or "").split("/")[-1]
    return drafter_dir.resolve().name


def prepare(
    drafter_dir: Path,
    target: TargetInfo,
    outtype: OutType = OutType.Q8_0,
    *,
    name: str | None = None,
    source_repo: str | None = None,
) -> Conversion:
    """Check the drafter against SPEC §2 and the target, and plan the output; reads no weights."""
    drafter_dir = Path(drafter_dir)
    if not drafter_dir.is_dir():
        raise UserError(f"{drafter_dir}: not a directory (expected the drafter's HF directory)")
    if source_repo is not None and not _REPO_ID.match(source_repo):
        raise UserError(f"--source-repo: expected ORG/NAME, found {source_repo!r}")
    cfg = load_config(drafter_dir)
    check_pair(cfg, target)
    tensors = load_checkpoint(drafter_dir, cfg)
    plan = gguf_plan(cfg, tensors)
    specs = []
    for p in plan:
        qtype = GGMLQuantizationType.F32 if p.entry.kind is Kind.NORM else outtype.ggml_type
        check_encodable(p.source.where, p.entry.shape, qtype, str(p.source.parts[0].file))
        specs.append(TensorSpec(p.entry.name, p.entry.shape, qtype))
    if source_repo is None and looks_like_repo_id(cfg.name_or_path):
        source_repo = cfg.name_or_path
    meta = drafter_metadata(cfg, target, outtype, name=name or default_name(drafter_dir, cfg),
                            source_repo=source_repo)
    return Conversion(drafter_dir, cfg, target, outtype, plan, specs, meta)


def convert(
    drafter_dir: Path,
    target: TargetInfo,
    out: Path,
    outtype: OutType = OutType.Q8_0,
    *,
    name: str | None = None,
    source_repo: str | None = None,
    on_tensor: Callable[[TensorSpec], None] | None = None,
) -> Summary:
    """:func:`prepare` then write; the output appears (atomically) only when complete."""
    check_output_path(Path(out), target)
    return prepare(drafter_dir, target, outtype, name=name, source_repo=source_repo).write(Path(out), on_tensor)


def check_output_path(out: Path, target: TargetInfo) -> None:
    if not out.parent.is_dir():
        raise UserError(f"{out}: the output directory {out.parent} does not exist")
    if out.is_dir():
        raise UserError(f"{out}: is a directory (expected the output .gguf file name)")
    if out.exists() and out.resolve() == target.source.resolve():
        raise UserError(f"{out}: is the target file; choose another output name")
