"""Files, in one place: the cache folder the project keeps what it makes once in, a file's sha256
(caches are keyed by it, model cards print it) and a size in binary units."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

#: where the cache lives when not ``~/.cache/laguna-dflash``
CACHE_ENV = "LAGUNA_DFLASH_CACHE"
#: read this much at a time: large enough to hash at disk speed, small enough to stay out of memory
CHUNK = 8 << 20


def cache_root() -> Path:
    """The cache folder: ``$LAGUNA_DFLASH_CACHE``, else ``~/.cache/laguna-dflash``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "laguna-dflash").expanduser()


def sha256_file(path: Path, on_chunk: Callable[[int], None] | None = None) -> str:
    """The hex sha256 of a file's bytes, read in chunks (``on_chunk``: told each chunk's size)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            if on_chunk is not None:
                on_chunk(len(chunk))
    return digest.hexdigest()


def human_size(n_bytes: int) -> str:
    """1536 -> '1.5 KiB'; sizes below 1 KiB stay in bytes."""
    if n_bytes < 1024:
        return f"{n_bytes} B"
    value = float(n_bytes)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024.0
        if value < 1024.0 or unit == "TiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")
