"""Our converted tiny drafter in ik_llama.cpp (issue 19 item 3): it loads in ik's llama-spec-bench
with ``--spec-type dflash:n_max=4``, greedy, and ik's acceptance is laguna-run's.

The runs need an ik build (``scripts/bench/build_peer.sh``; ``IK_LLAMA_BIN`` names another bin
directory) and are skipped without one: CI has none. The renaming helper is checked everywhere.
laguna-run ends each generation with ik's budget rule here (``ik_tail_depth``), so that the last
rounds of the two compare.

They use code prompt 1 at 64 tokens, where the two engines' plain greedy outputs agree: on
prompts 0 and 2 they part at a near-tie (top-2 logits 0.003 and 0.006 apart in laguna-run,
ik takes the runner-up), and from there the speculative runs follow different texts too.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from helpers.ik_interop import (IkFailed, compare, ik_bin_dir, ik_named_copy, legacy_norm_tensors,
                                          renamed_copy, run_ik, run_ours)
from laguna_dflash.runtime import assets

N_MAX, N_PREDICT, THREADS = 4, 64, 2
PROMPT = 1  # of runtime/data/prompts/code.txt
ACCEPTANCE_TOLERANCE = 0.10  # relative, on the accepted drafts of the generation

needs_ik = pytest.mark.skipif(ik_bin_dir() is None, reason="no ik_llama.cpp build (scripts/bench/build_peer.sh)")


@pytest.fixture(scope="module")
def drafter():
    return assets.converted_tiny_drafter()


@pytest.fixture(scope="module")
def prompts():
    return assets.read_prompts(assets.CODE_PROMPTS)[PROMPT:PROMPT + 1]


@pytest.fixture(scope="module")
def ours(drafter, prompts):
    return run_ours(assets.TINY_TARGET, drafter, N_MAX, prompts, N_PREDICT, THREADS)


@pytest.fixture(scope="module")
def ik_on_named_copy(drafter, prompts, tmp_path_factory):
    ik_file = ik_named_copy(drafter, tmp_path_factory.mktemp("ik") / "ik-names.gguf")
    return run_ik(ik_bin_dir(), assets.TINY_TARGET, ik_file, N_MAX, prompts, N_PREDICT, THREADS)


def assert_runs_like_ours(ours, theirs):
    """ik drafts with our file, keeps our output, and accepts about as many drafts as laguna-run."""
    (row,) = compare(ours, theirs)
    assert row["equal"]["prompt tokens"] and row["ours"]["drafted"] > 0 and row["ik"]["drafted"] > 0
    assert row["equal"]["text"], "ik's greedy speculative text differs from laguna-run's"
    o, t = row["ours"]["accepted"], row["ik"]["accepted"]
    assert abs(t - o) <= ACCEPTANCE_TOLERANCE * o, f"accepted drafts: ik {t}, laguna-run {o}"


def test_ik_named_copy_restores_ik_names_of_an_old_file(drafter, tmp_path):
    """A file converted before the converter wrote ik's names (blk.N.ffn_norm) gets them back,
    every other byte of the file as the converter writes it now."""
    import re

    new = legacy_norm_tensors(drafter) == []
    old = renamed_copy(drafter, tmp_path / "old.gguf",
                       lambda n: re.sub(r"^(blk\.\d+)\.post_attention_norm\.", r"\1.ffn_norm.", n)) if new else drafter
    legacy = legacy_norm_tensors(old)
    assert legacy, "the old layout has blk.N.ffn_norm tensors"
    copy = ik_named_copy(old, tmp_path / "ik-names.gguf")
    assert legacy_norm_tensors(copy) == []
    src, dst = gguf.GGUFReader(str(old), "r"), gguf.GGUFReader(str(copy), "r")
    renamed = {a.name: b.name for a, b in zip(src.tensors, dst.tensors, strict=True) if a.name != b.name}
    assert renamed == {n: n.replace(".ffn_norm.", ".post_attention_norm.") for n in legacy}
    for a, b in zip(src.tensors, dst.tensors):
        assert a.tensor_type == b.tensor_type and list(a.shape) == list(b.shape) and np.array_equal(a.data, b.data)
    for key, f in src.fields.items():
        if not key.startswith("GGUF."):
            g = dst.fields[key]
            assert f.types == g.types and all(np.array_equal(f.parts[i], g.parts[j]) for i, j in zip(f.data, g.data))
    if new:  # the round trip gives the converter's file back, byte for byte
        assert copy.read_bytes() == drafter.read_bytes()
    assert ik_named_copy(copy, tmp_path / "again.gguf") == copy  # nothing left to rename
    if new:  # without an output path the copy lies next to the file it renames
        beside = tmp_path / "old-ik-names.gguf"
        assert ik_named_copy(old) == beside and legacy_norm_tensors(beside) == []


@needs_ik
def test_converter_output_runs_in_ik(drafter, prompts, ours):
    try:
        theirs = run_ik(ik_bin_dir(), assets.TINY_TARGET, drafter, N_MAX, prompts, N_PREDICT, THREADS)
    except IkFailed as e:
        # the converter's pre-FFN norm name (issue 19 item 2): expected until it writes ik's name
        if legacy_norm_tensors(drafter) and any("post_attention_norm" in line for line in e.lines):
            said = next(line for line in e.lines if "post_attention_norm" in line)
            pytest.xfail(f"the converter still writes blk.N.ffn_norm; ik: {said}")
        raise
    assert_runs_like_ours(ours, theirs)


@needs_ik
def test_ik_named_copy_runs_in_ik(ours, ik_on_named_copy):
    assert_runs_like_ours(ours, ik_on_named_copy)


@needs_ik
@pytest.mark.xfail(strict=True, reason=(
    "ik's drafts differ from laguna-run's and the numpy reference's in the round after one that "
    "rejected every draft (round 2 here: ik proposes ...,31 where both others propose ...,29 with a "
    "4.7 logit margin): ik accepts 48 of 52 drafts in 13 rounds, laguna-run (ending the generation "
    "as ik does) 48 of 53 in 14"))
def test_ik_acceptance_equals_ours_round_for_round(ours, ik_on_named_copy):
    (row,) = compare(ours, ik_on_named_copy)
    counts = ("rounds", "drafted", "accepted", "accepted by position")
    assert {k: row["ours"][k] for k in counts} == {k: row["ik"][k] for k in counts}
