"""Shared fixtures: the tiny Laguna target (built once per generator version and cached)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

def fixture_cache() -> Path:
    root = Path(os.environ.get("LAGUNA_DFLASH_CACHE", Path.home() / ".cache" / "laguna-dflash"))
    return root / "fixtures"


@pytest.fixture(scope="session")
def tiny_target() -> dict[str, Path]:
    """HF dir, F32 GGUF and transformers reference outputs of the tiny Laguna target."""
    from helpers import tiny_target as gen

    out = fixture_cache() / f"tiny-target-{gen.generator_fingerprint()}"
    if not (out / "fingerprint").exists():
        gen.build_all(out)
    return {"hf": out / "hf", "gguf": out / "tiny-laguna-f32.gguf", "reference": out / "reference.npz"}


@pytest.fixture(scope="module")
def models():
    """The bundled pair loaded once per test module: the target Model, the converted drafter's
    path and its Model (the server tests build slots and reference engines over them)."""
    from server_harness import bundled_models

    with bundled_models("code") as loaded:
        yield loaded


@pytest.fixture(scope="module")
def agent_pair():
    """The bundled agent pair, loaded as ``models`` loads the code pair."""
    from server_harness import bundled_models

    with bundled_models("agent") as loaded:
        yield loaded
