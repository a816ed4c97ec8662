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

from convert.errors import ContractError, UserError

DRAFT_ARCH = "dflash-draft"


def _reader(path: Path):
    import gguf

    if not path.exists():
        raise UserError(f"{path}: no such file")
    try:
        return gguf.GGUFReader(str(path), "r")
    except Exception as e:  # gguf raises ValueError/struct errors on non-GGUF input
        raise UserError(f"{path}: not a readable GGUF file ({e.__class__.__name__}: {e})") from None


def _scalar(reader, key: str, path: Path, required: bool = True):
    f = reader.fields.get(key)
    if f is None:
        if required:
            raise ContractError(path, key, "present", "missing")
        return None
    return f.contents()


def _tokens_digest(reader) -> tuple[int, str]:
    f = reader.fields.get("tokenizer.ggml.tokens")
    if f is None:
        return 0, ""
    h = hashlib.sha256()
    for idx in f.data:
        h.update(bytes(f.parts[idx]))
        h.update(b"\0")
    return len(f.data), h.hexdigest()


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
    path = Path(path)
    r = _reader(path)
    arch = str(_scalar(r, "general.architecture", path))
    n_vocab, digest = _tokens_digest(r)
    if n_vocab == 0:
        raise ContractError(path, "tokenizer.ggml.tokens", "a vocabulary", "none")
    return TargetSpec(
        path=path,
        arch=arch,
        n_layer=int(_scalar(r, f"{arch}.block_count", path)),
        n_embd=int(_scalar(r, f"{arch}.embedding_length", path)),
        n_vocab=n_vocab,
        tokens_sha256=digest,
        sliding_window=int(_scalar(r, f"{arch}.attention.sliding_window", path, required=False) or 0),
    )


def read_drafter(path: str | Path) -> DrafterSpec:
    """The drafter's contract (SPEC §5a), every field checked for what llama.cpp would assert on."""
    path = Path(path)
    r = _reader(path)
    arch = _scalar(r, "general.architecture", path)
    if arch != DRAFT_ARCH:
        raise ContractError(path, "general.architecture", DRAFT_ARCH, arch)
    p = DRAFT_ARCH
    if _scalar(r, f"{p}.dflash.laguna", path, required=False) is not True:
        raise ContractError(path, f"{p}.dflash.laguna", True, _scalar(r, f"{p}.dflash.laguna", path, False))
    if _scalar(r, f"{p}.attention.causal", path, required=False) is not True:
        raise ContractError(path, f"{p}.attention.causal", True, _scalar(r, f"{p}.attention.causal", path, False))
    n_layer = int(_scalar(r, f"{p}.block_count", path))
    if not 1 <= n_layer <= 512:
        raise ContractError(path, f"{p}.block_count", "1..512", n_layer)
    n_embd = int(_scalar(r, f"{p}.embedding_length", path))
    n_head = _scalar(r, f"{p}.attention.head_count", path)
    n_head_kv = _scalar(r, f"{p}.attention.head_count_kv", path)
    if isinstance(n_head, list) or isinstance(n_head_kv, list):
        raise ContractError(path, f"{p}.attention.head_count", "one value for all layers", "a per-layer array")
    head_dim = int(_scalar(r, f"{p}.attention.key_length", path))
    block = int(_scalar(r, f"{p}.dflash.block_size", path))
    if not 2 <= block <= 512:
        raise ContractError(path, f"{p}.dflash.block_size", "2..512", block)
    # no window key: full attention (0), as ik_llama.cpp reads it
    window_key = _scalar(r, f"{p}.attention.sliding_window", path, required=False)
    window = 0 if window_key is None else int(window_key)
    if window_key is not None and not 2 <= window <= 1 << 20:
        raise ContractError(path, f"{p}.attention.sliding_window", "2..2^20", window)
    pattern = _scalar(r, f"{p}.attention.sliding_window_pattern", path, required=False)
    if pattern is not None and (len(pattern) != n_layer or any(bool(x) != bool(window) for x in pattern)):
        raise ContractError(path, f"{p}.attention.sliding_window_pattern",
                            f"{n_layer} x {'true' if window else 'false (no attention.sliding_window)'}", pattern)
    ids = _scalar(r, f"{p}.dflash.target_layer_ids", path)
    ids = tuple(int(i) for i in (ids if isinstance(ids, list) else [ids]))
    if not ids or any(i < 0 for i in ids) or any(b <= a for a, b in zip(ids, ids[1:])):
        raise ContractError(path, f"{p}.dflash.target_layer_ids", "non-empty, non-negative, strictly increasing", list(ids))
    n_feat = _scalar(r, f"{p}.dflash.n_target_features", path, required=False)
    if n_feat is not None and int(n_feat) != len(ids) * n_embd:
        raise ContractError(path, f"{p}.dflash.n_target_features", len(ids) * n_embd, n_feat)
    n_vocab, digest = _tokens_digest(r)
    if n_vocab == 0:
        raise ContractError(path, "tokenizer.ggml.tokens", "the target's vocabulary", "none")
    mask = int(_scalar(r, f"{p}.dflash.mask_token_id", path))
    if not 0 <= mask < n_vocab:
        raise ContractError(path, f"{p}.dflash.mask_token_id", f"0..{n_vocab - 1}", mask)
    target_name = _scalar(r, f"{p}.dflash.target_name", path, required=False)
    return DrafterSpec(
        path=path, n_layer=n_layer, n_embd=n_embd, n_head=int(n_head), n_head_kv=int(n_head_kv),
        head_dim=head_dim, block_size=block, mask_token_id=mask, target_layer_ids=ids,
        sliding_window=window, n_vocab=n_vocab, tokens_sha256=digest,
        target_name=str(target_name) if target_name is not None else None,
    )


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
