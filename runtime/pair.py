"""Read a drafter's and a target's contract from their GGUF headers, and check the pair.

All of this runs in Python, on metadata alone, before llama.cpp sees either file: a bad file
or a mismatched pair becomes a one-line :class:`convert.errors.ContractError` (exit code 2)
instead of a GGML_ASSERT that would kill the process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..convert import gguf_keys as K
from ..convert.errors import ContractError
from ..convert.gguf_header import Header
from ..convert.gguf_rules import checked_header, read_header_cached
from ..convert.pairing import TOKENS, TargetFacts, header_tokens, pairing_problems

DRAFT_ARCH = K.ARCH


@dataclass(frozen=True)
class TargetSpec:
    path: Path
    arch: str
    n_layer: int
    n_embd: int
    n_vocab: int
    sliding_window: int
    facts: TargetFacts  # what a drafter must agree with (convert/pairing.py)


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
    tokens = header_tokens(header)
    if not tokens:
        raise ContractError(path, TOKENS, "a vocabulary", "none")
    n_layer, n_embd = header.get(f"{arch}.block_count"), header.get(f"{arch}.embedding_length")
    name = header.get(K.GENERAL_NAME) or path.stem
    return TargetSpec(
        path=path, arch=arch, n_layer=n_layer, n_embd=n_embd, n_vocab=len(tokens),
        sliding_window=header.get(f"{arch}.attention.sliding_window") or 0,
        facts=TargetFacts(str(name), n_layer, n_embd, tokens),
    )


def read_drafter(path: str | Path) -> DrafterSpec:
    """The drafter's contract (SPEC §5a); every value llama.cpp would assert on is checked first."""
    path = Path(path)
    header = read_header_checked_arch(path, DRAFT_ARCH)
    get = header.get
    target_name = get(K.TARGET_NAME)
    return DrafterSpec(
        path=path, n_layer=get(K.BLOCK_COUNT), n_embd=get(K.EMBEDDING_LENGTH),
        n_head=get(K.HEAD_COUNT), n_head_kv=get(K.HEAD_COUNT_KV),
        head_dim=get(K.KEY_LENGTH), block_size=get(K.BLOCK_SIZE),
        mask_token_id=get(K.MASK_TOKEN_ID), target_layer_ids=tuple(get(K.TARGET_LAYER_IDS)),
        # no window key: full attention (0), as ik_llama.cpp reads it
        sliding_window=get(K.SLIDING_WINDOW) or 0,
        target_name=str(target_name) if target_name is not None else None,
    )


def read_header_checked_arch(path: Path, arch: str) -> Header:
    """The header of ``path`` when it is of architecture ``arch``, range-checked."""
    header = read_header_cached(path)
    if header.arch != arch:
        raise ContractError(path, "general.architecture", arch, header.arch)
    return checked_header(path)


def check_pair(drafter: DrafterSpec, target: TargetSpec) -> None:
    """Raise the first ContractError (naming the drafter file) when the two cannot work together."""
    problems = pairing_problems(drafter.path, read_header_cached(drafter.path), target.facts)
    if problems:
        raise problems[0]


def fuse_features(rows_by_slot: list[np.ndarray]) -> np.ndarray:
    """Concatenate captured rows [T, H] of each target layer (in target_layer_ids order) to [T, n*H]."""
    return np.concatenate(rows_by_slot, axis=1)
