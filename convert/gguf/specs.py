"""The one GGUF-side type of a target and of a drafter, read from their headers, and the pair check.

All of this runs in Python, on metadata alone, before llama.cpp sees either file: a bad file
or a mismatched pair becomes a one-line :class:`convert.errors.ContractError` (exit code 2)
instead of a GGML_ASSERT that would kill the process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from collections.abc import Sequence

from .errors import ContractError
from . import keys as K
from .header import Header
from .pairing import header_tokens, pairing_problems
from .rules import checked_header, read_header_cached

DRAFT_ARCH = K.ARCH


@dataclass(frozen=True)
class TargetSpec:
    """A target as a drafter must agree with it (convert/gguf/pairing.py) and the runtime sizes it.
    ``sliding_window``: 0 for full attention, and where the source does not say (an HF directory
    read by the converter)."""

    path: Path
    arch: str
    name: str
    n_layer: int
    n_embd: int
    n_vocab: int
    sliding_window: int
    tokens: Sequence[bytes]


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
    """The target's contract; every header value llama.cpp reads is range-checked (convert/gguf/rules.py)."""
    path = Path(path)
    header = checked_header(path)
    arch = header.arch
    if arch == DRAFT_ARCH:
        raise ContractError(path, K.GENERAL_ARCHITECTURE, "the target model (e.g. laguna)", f"{arch!r}, a drafter")
    tokens = header_tokens(header)
    if not tokens:
        raise ContractError(path, K.TOKENS, "a vocabulary", "none")
    n_layer, n_embd = header.get(K.for_arch(arch, K.BLOCK_COUNT)), header.get(K.for_arch(arch, K.EMBEDDING_LENGTH))
    name = header.get(K.GENERAL_NAME) or path.stem
    return TargetSpec(
        path=path, arch=arch, name=str(name), n_layer=n_layer, n_embd=n_embd, n_vocab=len(tokens),
        sliding_window=header.get(f"{arch}.attention.sliding_window") or 0, tokens=tokens,
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
        raise ContractError(path, K.GENERAL_ARCHITECTURE, arch, header.arch)
    return checked_header(path)


def check_pair(drafter: DrafterSpec, target: TargetSpec) -> None:
    """Raise the first ContractError (naming the drafter file) when the two cannot work together."""
    problems = pairing_problems(drafter.path, read_header_cached(drafter.path), target)
    if problems:
        raise problems[0]

