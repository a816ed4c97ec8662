"""laguna-gguf inspect: the drafter's contract at a glance, its layout, and whether it pairs with a target."""

from __future__ import annotations

from pathlib import Path

import pytest
from convert_fixtures import PRESETS, run_cli, target_for
from gguf import GGUFValueType, GGUFWriter

from laguna_dflash.convert.converter import ARCH, prepare
from laguna_dflash.convert.quantize import encode
from helpers.synthetic import write_drafter
from laguna_dflash.convert.target import read_target
from laguna_dflash.convert.writer import write_gguf

XS = PRESETS["xs"]


@pytest.fixture()
def drafter_gguf(tmp_path: Path) -> tuple[Path, Path]:
    d = write_drafter(tmp_path / "d", **XS, name_or_path="poolside/Tiny-DFlash")
    target = target_for(XS, tmp_path / "target.gguf")
    out = tmp_path / "drafter.gguf"
    assert run_cli("convert", d, "--target", target, "-o", out, "-q").code == 0
    return out, target


def test_contract_at_a_glance(drafter_gguf: tuple[Path, Path]) -> None:
    out, _ = drafter_gguf
    res = run_cli("inspect", out)
    assert res.code == 0, res.stderr
    for text in ["dflash-draft", "Tiny-DFlash", "poolside/Tiny-DFlash", "[1, 3]", "4 / 2 / 16",
                 "Tiny Laguna Target (4 layers)", "256 tokens", "7 (MOSTLY_Q8_0)", "29 (12 F32, 17 Q8_0)",
                 "layout: complete dflash-draft"]:
        assert text in res.stdout, text
    assert res.stderr == ""


def test_pairs_with_its_target(drafter_gguf: tuple[Path, Path]) -> None:
    out, target = drafter_gguf
    res = run_cli("inspect", out, "--target", target)
    assert res.code == 0, res.stderr
    assert "pairs with target Tiny Laguna Target (4 layers, hidden 64, vocab 256)" in res.stdout


@pytest.mark.parametrize("over,fragment", [
    (dict(n_layer=6), "dflash-draft.dflash.target_n_layer: expected 6 (layers of target Tiny Laguna Target), found 4"),
    (dict(n_layer=3), "dflash-draft.dflash.target_layer_ids: expected ids below 3"),
    (dict(hidden=96), "dflash-draft.embedding_length: expected 96 (hidden size of target Tiny Laguna Target), found 64"),
    (dict(vocab_size=300), "tokenizer.ggml.tokens: expected 300 tokens (vocabulary of target Tiny Laguna Target), "
                           "found 256 tokens"),
], ids=["layer-count", "layer-ids", "hidden", "vocab-size"])
def test_does_not_pair(drafter_gguf: tuple[Path, Path], tmp_path: Path, over: dict, fragment: str) -> None:
    out, _ = drafter_gguf
    other = target_for(XS, tmp_path / "other.gguf", **over)
    res = run_cli("inspect", out, "--target", other)
    assert res.code == 2
    assert f"error: does not pair with {other}: {out}: " in res.stderr
    assert fragment in res.stderr, res.stderr


def test_same_size_but_different_tokens(drafter_gguf: tuple[Path, Path], tmp_path: Path) -> None:
    out, target = drafter_gguf
    t = read_target(target)
    w = GGUFWriter(tmp_path / "renamed.gguf", "laguna")
    w.add_uint32("laguna.block_count", 4)
    w.add_uint32("laguna.embedding_length", 64)
    tokens = [tok.decode() for tok in t.tokens()]
    tokens[100] = "something else"
    w.add_key_value("tokenizer.ggml.tokens", tokens, GGUFValueType.ARRAY, GGUFValueType.STRING)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    res = run_cli("inspect", out, "--target", tmp_path / "renamed.gguf")
    assert res.code == 2
    assert "tokenizer.ggml.tokens[100]: expected b'something else'" in res.stderr


def test_not_a_drafter(drafter_gguf: tuple[Path, Path]) -> None:
    _, target = drafter_gguf
    res = run_cli("inspect", target)
    assert res.code == 2
    assert f'error: {target}: general.architecture: expected "dflash-draft" (a Laguna DFlash drafter), found laguna' \
        in res.stderr
    res = run_cli("inspect", target.parent / "missing.gguf")
    assert res.code == 2 and "missing.gguf: not found" in res.stderr


def test_incomplete_layout(tmp_path: Path) -> None:
    d = write_drafter(tmp_path / "d", **XS)
    job = prepare(d, read_target(target_for(XS, tmp_path / "t.gguf")))
    keep = [i for i, s in enumerate(job.specs) if s.name != "blk.1.attn_gate.weight"]
    out = tmp_path / "broken.gguf"
    write_gguf(out, ARCH, job.metadata, [job.specs[i] for i in keep],
               (encode(job.plan[i].read(), job.specs[i].qtype) for i in keep))
    res = run_cli("inspect", out)
    assert res.code == 2
    assert f"error: {out}: blk.1.attn_gate.weight: expected a tensor of shape [4, 64], found nothing" in res.stderr
