"""Read a drafter's and a target's contract from their GGUF headers, and check the pair.

All of this runs in Python, on metadata alone, before llama.cpp sees either file: a bad file
or a mismatched pair becomes a one-line :class:`convert.errors.ContractError` (exit code 2)
instead of a GGML_ASSERT that would kill the process.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFValueType

from convert import gguf_keys
from convert.errors import ContractError
from convert.gguf_header import Header
from convert.gguf_rules import checked_header, read_header_cached

DRAFT_ARCH = gguf_keys.ARCH


def _tokens_digest(header: Header) -> tuple[int, str]:
    f = header.fields.get("tokenizer.ggml.tokens")
    if f is None or not f.is_array or f.sub_type != GGUFValueType.STRING:
        return 0, ""
    h = hashlib.sha256()
    for token in f.value:
        h.update(token)
        h.update(b"\0")
    return len(f.value), h.hexdigest()


@dataclass(frozen=True)
class TargetSpec:
    path: Path
    arch: str
    n_layer: int
    n_embd: int
    n_vocab: int
    tokens_sha256: str
    sliding_window: int


@dataclass(frozen=True)
class DrafterSpec:
    path: Path
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    sliding_window: int  # 0: full attention (every context row stays visible)
    n_vocab: int
    tokens_sha256: str
    target_name: str | None

    @property
    def capture_slots(self) -> list[int]:
        """HF id t is the stream after layer t, i.e. llama.cpp capture slot t + 1."""
        return [t + 1 for t in self.target_layer_ids]

    @property
    def max_draft(self) -> int:
        return self.block_size - 1


def read_target(path: str | Path) -> TargetSpec:
    """The target's contract; every header value llama.cpp reads is range-checked (convert/gguf_rules.py)."""
    path = Path(path)
    header = checked_header(path)
    arch = header.arch
    if arch == DRAFT_ARCH:
        raise ContractError(path, "general.architecture", "the target model (e.g. laguna)", f"{arch!r}, a drafter")
    n_vocab, digest = _tokens_digest(header)
    if n_vocab == 0:
        raise ContractError(path, "tokenizer.ggml.tokens", "a vocabulary", "none")
    return TargetSpec(
        path=path,
        arch=arch,
        n_layer=header.get(f"{arch}.block_count"),
        n_embd=header.get(f"{arch}.embedding_length"),
        n_vocab=n_vocab,
        tokens_sha256=digest,
        sliding_window=header.get(f"{arch}.attention.sliding_window") or 0,
    )


def read_drafter(path: str | Path) -> DrafterSpec:
    """The drafter's contract (SPEC §5a); every value llama.cpp would assert on is checked first."""
    path = Path(path)
    header = read_header_checked_arch(path, DRAFT_ARCH)
    p = DRAFT_ARCH
    n_vocab, digest = _tokens_digest(header)
    get = header.get
    target_name = get(f"{p}.dflash.target_name")
    return DrafterSpec(
        path=path, n_layer=get(f"{p}.block_count"), n_embd=get(f"{p}.embedding_length"),
        n_head=get(f"{p}.attention.head_count"), n_head_kv=get(f"{p}.attention.head_count_kv"),
        head_dim=get(f"{p}.attention.key_length"), block_size=get(f"{p}.dflash.block_size"),
        mask_token_id=get(f"{p}.dflash.mask_token_id"), target_layer_ids=tuple(get(f"{p}.dflash.target_layer_ids")),
        # no window key: full attention (0), as ik_llama.cpp reads it
        sliding_window=get(f"{p}.attention.sliding_window") or 0, n_vocab=n_vocab, tokens_sha256=digest,
        target_name=str(target_name) if target_name is not None else None,
    )


def read_header_checked_arch(path: Path, arch: str) -> Header:
    """The header of ``path`` when it is of architecture ``arch``, range-checked."""
    header = read_header_cached(path)
    if header.arch != arch:
        raise ContractError(path, "general.architecture", arch, header.arch)
    return checked_header(path)


def check_pair(drafter: DrafterSpec, target: TargetSpec) -> None:
    """Raise ContractError (naming the drafter file) when the two cannot work together."""
    if drafter.n_embd != target.n_embd:
        raise ContractError(drafter.path, f"{DRAFT_ARCH}.embedding_length",
                            f"{target.n_embd} (the target's hidden size)", drafter.n_embd)
    if max(drafter.target_layer_ids) >= target.n_layer:
        raise ContractError(drafter.path, f"{DRAFT_ARCH}.dflash.target_layer_ids",
                            f"ids < {target.n_layer} (the target's layer count)", list(drafter.target_layer_ids))
    if drafter.n_vocab != target.n_vocab:
        raise ContractError(drafter.path, "tokenizer.ggml.tokens",
                            f"{target.n_vocab} tokens (the target's)", f"{drafter.n_vocab} tokens")
    if drafter.tokens_sha256 != target.tokens_sha256:
        raise ContractError(drafter.path, "tokenizer.ggml.tokens", "the target's exact token list",
                            "a different token list")


def fuse_features(rows_by_slot: list[np.ndarray]) -> np.ndarray:
    """Concatenate captured rows [T, H] of each target layer (in target_layer_ids order) to [T, n*H]."""
    return np.concatenate(rows_by_slot, axis=1)
