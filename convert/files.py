"""What the commands say about a file, in one place: its sha256 (caches are keyed by it, model
cards print it) and a size in binary units."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

#: read this much at a time: large enough to hash at disk speed, small enough to stay out of memory
CHUNK = 8 << 20


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
