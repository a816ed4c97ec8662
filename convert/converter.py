"""The conversion itself: check everything, then stream the drafter into the SPEC §5a GGUF layout.

    target = read_target(Path("Laguna-XS-2.1-Q4_K_M.gguf"))
    job = prepare(Path("Laguna-XS-2.1-DFlash"), target, OutType.Q8_0)   # every check happens here
    summary = job.write(Path("drafter-q8_0.gguf"))                       # one tensor in memory at a time

:func:`prepare` reads no weights: config, tensor index, pairing and encodability are all
checked from headers, so a bad input fails before any output file exists.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_VERSION, GGMLQuantizationType, GGUFReader, GGUFValueType

from .gguf import keys as K
from .checkpoint import DrafterConfig, check_pair, load_config
from .errors import UserError
from .mapping import INDEX_FILE, SINGLE_FILE, Kind, PlannedTensor, RowStack, gguf_plan, load_checkpoint
from .quantize import OutType, check_encodable, check_quantizable, encode, llama_quantize
from .safetensors_io import file_kind, index_shard_files
from .target import TargetInfo
from .writer import KV, TensorSpec, check_metadata, write_gguf

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

    @classmethod
    def of(cls, out: Path, specs: list[TensorSpec], file_size: int, seconds: float) -> "Summary":
        """What writing ``specs`` to ``out`` gave: counts and bytes by GGML type."""
        by_type: dict[str, tuple[int, int]] = {}
        for s in specs:
            n, b = by_type.get(s.qtype.name, (0, 0))
            by_type[s.qtype.name] = (n + 1, b + s.nbytes)
        return cls(out, len(specs), count_params(specs), by_type, file_size, seconds)


def count_params(specs: Iterable[TensorSpec]) -> int:
    return sum(int(np.prod(s.shape)) for s in specs)


class PlannedOutput:
    """The size of a checked conversion's output, from its tensor ``specs``, before anything is written."""

    specs: list[TensorSpec]

    @property
    def total_bytes(self) -> int:
        return sum(s.nbytes for s in self.specs)

    @property
    def n_params(self) -> int:
        return count_params(self.specs)


@dataclass
class Conversion(PlannedOutput):
    """A checked conversion, ready to write: the plan, the output tensor specs and the metadata."""

    drafter_dir: Path
    cfg: DrafterConfig
    target: TargetInfo
    outtype: OutType
    plan: list[PlannedTensor]
    specs: list[TensorSpec]
    metadata: dict[str, KV] = field(repr=False)
    #: Every file this conversion reads (drafter and target); the output may be none of them.
    inputs: tuple[Path, ...] = ()

    def _encoded(self) -> Iterator[np.ndarray]:
        for p, spec in zip(self.plan, self.specs, strict=True):
            label = f"{p.source.parts[0].file}: {p.source.where}"
            x = p.read()
            yield encode(x, spec.qtype, label, self.outtype)
            del x

    def check_output(self, out: Path) -> None:
        """Everything :meth:`write` refuses before creating a file: the output path and the metadata values."""
        check_output_path(out, self.inputs, target=self.target.source)
        check_metadata(out, self.metadata)

    def write(self, out: Path, on_tensor: Callable[[TensorSpec], None] | None = None) -> Summary:
        """Write ``out``; a 4-6-bit outtype goes through an intermediate file and llama.cpp's quantiser."""
        if self.outtype.by_llama:
            self.check_output(Path(out))
            return write_quantized(Path(out), self.outtype, lambda tmp: self._write_encoded(tmp, on_tensor))
        return self._write_encoded(Path(out), on_tensor)

    def _write_encoded(self, out: Path, on_tensor: Callable[[TensorSpec], None] | None) -> Summary:
        t0 = time.perf_counter()
        self.check_output(out)
        size = write_gguf(out, ARCH, self.metadata, self.specs, self._encoded(), on_tensor)
        return Summary.of(out, self.specs, size, time.perf_counter() - t0)


# --------------------------------------------------------------------------- 4-6-bit outtypes


def intermediate_path(out: Path) -> Path:
    """The lossless file a 4-6-bit output is quantised from, next to the output."""
    return out.with_name(f"{out.name}.intermediate-{os.getpid()}")


def write_quantized(out: Path, outtype: OutType, write_intermediate: Callable[[Path], object]) -> Summary:
    """``write_intermediate(tmp)`` (a lossless GGUF in our layout), then llama.cpp's quantiser into ``out``.

    The intermediate lies next to ``out`` and is removed whatever happens; ``out`` appears only
    when complete. The summary's types are those llama.cpp chose, read back from ``out``.
    """
    t0 = time.perf_counter()
    tmp = intermediate_path(out)
    if tmp.exists() or tmp.is_symlink():
        raise UserError(f"-o {out}: the temporary file {tmp} already exists (left by another run?); "
                        "remove it and retry")
    try:
        write_intermediate(tmp)
        llama_quantize(tmp, out, outtype)
    finally:
        tmp.unlink(missing_ok=True)
    return summarize_gguf(out, time.perf_counter() - t0)


def summarize_gguf(path: Path, seconds: float) -> Summary:
    """A :class:`Summary` of a written GGUF, read from its header."""
    reader = GGUFReader(path)
    by_type: dict[str, tuple[int, int]] = {}
    n_params = 0
    for t in reader.tensors:
        name = GGMLQuantizationType(t.tensor_type).name
        n, b = by_type.get(name, (0, 0))
        by_type[name] = (n + 1, b + int(t.n_bytes))
        n_params += int(t.n_elements)
    return Summary(path, len(reader.tensors), n_params, by_type, path.stat().st_size, seconds)


def write_job(job: Any, out: Path, on_tensor: Callable[[TensorSpec], None] | None = None) -> Summary:
    """``job.write(out)`` for any prepared conversion. A job whose ``write`` only encodes (a
    Poolside-layout rewrite) gets llama.cpp's quantiser run after it when its outtype asks for one."""
    outtype = getattr(job, "outtype", None)
    if isinstance(job, Conversion) or outtype is None or not outtype.by_llama:
        return job.write(out, on_tensor)
    return write_quantized(Path(out), outtype, lambda tmp: job.write(tmp, on_tensor))


def lossless_type(source: RowStack) -> GGMLQuantizationType:
    """The intermediate type that holds a checkpoint tensor exactly: its own dtype, F32 when mixed."""
    dtypes = {p.dtype for p in source.parts}
    only = dtypes.pop() if len(dtypes) == 1 else None
    return {"BF16": GGMLQuantizationType.BF16, "F16": GGMLQuantizationType.F16}.get(only or "",
                                                                                  GGMLQuantizationType.F32)


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
    inputs = checkpoint_files(drafter_dir) + target_files(target)  # confines the index's shards first
    tensors = load_checkpoint(drafter_dir, cfg)
    plan = gguf_plan(cfg, tensors)
    specs = []
    for p in plan:
        if p.entry.kind is Kind.NORM:
            qtype = GGMLQuantizationType.F32
        elif outtype.by_llama:  # the intermediate file llama.cpp quantises: the checkpoint's values exactly
            qtype = lossless_type(p.source)
            check_quantizable(p.source.where, p.entry.shape, outtype, str(p.source.parts[0].file))
        else:
            qtype = outtype.ggml_type
        check_encodable(p.source.where, p.entry.shape, qtype, str(p.source.parts[0].file))
        specs.append(TensorSpec(p.entry.name, p.entry.shape, qtype))
    if source_repo is None and looks_like_repo_id(cfg.name_or_path):
        source_repo = cfg.name_or_path
    meta = drafter_metadata(cfg, target, outtype, name=name or default_name(drafter_dir, cfg),
                            source_repo=source_repo)
    return Conversion(drafter_dir, cfg, target, outtype, plan, specs, meta, tuple(inputs))


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
    check_output_path(Path(out), target=target.source)
    return prepare(drafter_dir, target, outtype, name=name, source_repo=source_repo).write(Path(out), on_tensor)


# --------------------------------------------------------------------------- the output path


def checkpoint_files(drafter_dir: Path) -> list[Path]:
    """The drafter files a conversion reads, shards included (confined to ``drafter_dir``)."""
    files = [drafter_dir / "config.json", drafter_dir / SINGLE_FILE]
    index = drafter_dir / INDEX_FILE
    if index.is_file():
        files += [index, *index_shard_files(index, drafter_dir)]
    return files


def target_files(target: TargetInfo) -> list[Path]:
    """The target's GGUF, or every file of its HF directory except GGUFs (config, tokenizer, weights)."""
    src = Path(target.source)
    if src.is_dir():
        return sorted(p for p in src.iterdir() if p.suffix != ".gguf" and p.is_file())
    return [src]


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or os.path.samefile(a, b)
    except OSError:  # b does not exist (or cannot be looked at): a cannot be it
        return False


def check_output_path(out: Path, inputs: Iterable[Path] = (), *, target: Path | None = None) -> None:
    """Refuse an output that would replace an input or a non-regular file, or cannot be created.

    Symlinks and hard links count as the file they reach. Nothing is created here.
    """
    out = Path(out)
    if out.exists() and not out.is_file():
        raise UserError(f"-o {out}: is {file_kind(out.stat().st_mode)}; expected the name of a regular "
                        "file to write the .gguf to")
    parent = out.parent
    if not parent.exists():
        raise UserError(f"-o {out}: the output directory {parent} does not exist")
    if not parent.is_dir():
        raise UserError(f"-o {out}: {parent} is not a directory")
    if not out.exists():
        return
    if target is not None and Path(target).is_file() and _same_file(out, Path(target)):
        raise UserError(f"-o {out}: is the target file{_alias(out, Path(target))}; choose another output name")
    for p in inputs:
        if _same_file(out, Path(p)):
            raise UserError(f"-o {out}: is an input of this conversion{_alias(out, Path(p))}; "
                            "choose another output name")


def _alias(out: Path, p: Path) -> str:
    return "" if out == p else f" ({p}, through a link or another name)"
