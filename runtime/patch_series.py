"""Which patched llama-cpp-python this runtime belongs to: the sdist it is built from, the patch
series applied to it, and the series' name, which the wheel's version carries.

The runtime relies on what its own series computes (which pass sizes a kernel computes each row
of as alone, runtime/batch.py), so it refuses a wheel whose version names another series
(runtime/bindings.py); ``laguna-run setup`` (runtime/setup/wheel.py) builds the wheel it wants.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from ..convert.errors import UserError

SDIST_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

#: the patch series: ``patches/`` of the source tree, installed as ``laguna_dflash/patches`` beside
#: ``laguna_dflash/runtime`` (pyproject.toml maps both), so the same level up finds it
PATCH_DIR = Path(__file__).resolve().parents[1] / "patches"


class PatchSeriesError(UserError):
    """The install's patch listing is missing or does not match the patch files beside it."""


def series() -> list[Path]:
    """Patches in the order ``patches/series`` lists them (one file name a line, '#' comments)."""
    listing = PATCH_DIR / "series"
    if not listing.exists():
        raise PatchSeriesError(f"{listing}: missing; it lists the patches in the order they apply")
    names = [ln.split("#", 1)[0].strip() for ln in listing.read_text().splitlines()]
    patches = [PATCH_DIR / n for n in names if n]
    for p in patches:
        if not p.exists():
            raise PatchSeriesError(f"{listing}: names {p.name}, which does not exist")
    unlisted = sorted({p.name for p in PATCH_DIR.glob("*.patch")} - {p.name for p in patches})
    if unlisted:
        raise PatchSeriesError(f"{listing}: does not list {', '.join(unlisted)}")
    return patches


def series_key(patches: list[Path]) -> str:
    """The patch series' name: the sdist's hash and every patch's name and content in order."""
    h = hashlib.sha256()
    h.update(SDIST_SHA256.encode())
    for p in patches:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:10]


def this_series() -> str:
    """The name of the series this install carries (its listing read, every patch hashed)."""
    return series_key(series())


def series_of(version: str | None) -> str | None:
    """The patch series a llama-cpp-python version names (``0.3.36+laguna.<series>.<flags>``);
    None for one not built by setup (a stock wheel, or ours from before versions named it)."""
    m = re.fullmatch(rf"{re.escape(SDIST_VERSION)}\+laguna\.([0-9a-f]{{10}})\.[0-9a-f]{{6}}", version or "")
    return m.group(1) if m else None
