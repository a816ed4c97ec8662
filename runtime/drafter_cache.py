"""The drafter laguna-run loads: a file in our layout as it is, a Poolside-layout one through its
rewrite, made once and cached under ``<cache>/drafters/``, keyed by the file's bytes, the code
that writes the rewrite and the target it was made for."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from ..convert import poolside
from ..convert.files import cache_root, sha256_file
from ..convert.poolside import is_poolside_layout
from ..convert.poolside_rewrite import prepare
from ..convert.target import TargetInfo, read_target

#: the convert/ modules whose code decides what a rewrite holds
REWRITE_CODE = ("poolside", "poolside_rewrite", "mapping", "converter", "checkpoint", "quantize", "writer",
                "gguf/keys")


def layout_version() -> str:
    """A digest of the code that decides what a rewrite holds: a change to any of it means a new rewrite."""
    here = Path(poolside.__file__).resolve().parent
    h = hashlib.sha256()
    for module in REWRITE_CODE:
        h.update((here / f"{module}.py").read_bytes())
    return "l" + h.hexdigest()[:12]


def target_fingerprint(target: TargetInfo) -> str:
    """What the rewrite copies from the target: its name, its layer count and its tokenizer."""
    h = hashlib.sha256(f"{target.name}\0{target.n_layer}\0{target.hidden_size}\0".encode())
    for key, kv in target.tokenizer.items():
        h.update(key.encode() + b"\0" + repr(kv.value).encode() + b"\0")
    return "t" + h.hexdigest()[:12]


def cached_path(path: Path, target: TargetInfo) -> Path:
    """``drafters/<sha256 of the file>-<layout version>-<target fingerprint>.gguf`` under the cache.

    The target is part of the key because the rewrite carries the target's tokenizer and name
    (SPEC §5a), so one Poolside file paired with two targets gives two rewrites.
    """
    return cache_root() / "drafters" / f"{sha256_file(path)}-{layout_version()}-{target_fingerprint(target)}.gguf"


def native_drafter_path(path: Path | str, target: Path | str | TargetInfo) -> Path:
    """The drafter file to load: ``path`` itself for our layout, else its cached rewrite (made once).

    A Poolside file that breaks the contract raises the same one-line ContractError as our
    converter; nothing is left in the cache then.
    """
    path = Path(path)
    if not is_poolside_layout(path):
        return path
    tgt = target if isinstance(target, TargetInfo) else read_target(Path(target))
    out = cached_path(path, tgt)
    if out.is_file():
        return out
    job = prepare(path, tgt)
    out.parent.mkdir(parents=True, exist_ok=True)
    job.write(out)
    print(f"{path}: Poolside's GGUF layout, rewritten once into {out}", file=sys.stderr)
    return out
