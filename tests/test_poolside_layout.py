"""Poolside's own drafter GGUFs (SPEC §5b) in: rewritten into our layout with the very tensors and metadata
the HF checkpoint converts to, and laguna-run drafts with them exactly as with the HF conversion."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from convert_fixtures import read_gguf, run_cli
from gguf import GGMLQuantizationType
from poolside_fixture import write_poolside_gguf

from laguna_dflash.convert.gguf import keys as K
from laguna_dflash.convert import converter, mapping
from laguna_dflash.convert.poolside_rewrite import prepare
from laguna_dflash.runtime.drafter_cache import native_drafter_path
from laguna_dflash.convert.quantize import OutType
from laguna_dflash.convert.target import read_target
from laguna_dflash.runtime import assets
from laguna_dflash.runtime.cli import main

HF, TARGET = assets.TINY_DRAFTER_HF, assets.TINY_TARGET
PROMPT = assets.read_prompts(assets.CODE_PROMPTS)[0]


@pytest.fixture(scope="module")
def target():
    return read_target(TARGET)


@pytest.fixture(scope="module")
def files(tmp_path_factory, target) -> dict[str, Path]:
    """Poolside-layout files (BF16 as published, and Q8_0) and the HF checkpoint converted by us."""
    d = tmp_path_factory.mktemp("poolside")
    out = {f"poolside-{t}": write_poolside_gguf(HF, TARGET, d / f"poolside-{t}.gguf", t) for t in ("bf16", "q8_0")}
    for t in ("bf16", "q8_0"):
        converter.convert(HF, target, d / f"hf-{t}.gguf", OutType(t))
        out[f"hf-{t}"] = d / f"hf-{t}.gguf"
    return out


def assert_same_file(a: Path, b: Path) -> None:
    x, y = read_gguf(a), read_gguf(b)
    assert x.tensor_order == y.tensor_order
    for name in x.tensor_order:
        (ne_x, type_x, data_x), (ne_y, type_y, data_y) = x.tensors[name], y.tensors[name]
        assert (ne_x, type_x) == (ne_y, type_y), name
        assert data_x.tobytes() == data_y.tobytes(), name
    assert x.kv_types == y.kv_types
    assert x.kv == y.kv


@pytest.mark.parametrize("source,outtype", [("bf16", "bf16"), ("q8_0", "q8_0"), ("bf16", "q8_0")],
                         ids=["bf16-kept", "q8_0-kept", "bf16-to-q8_0"])
def test_hf_and_poolside_convert_to_the_same_file(files, tmp_path, source, outtype):
    out = tmp_path / "rewritten.gguf"
    res = run_cli("convert", files[f"poolside-{source}"], "--target", TARGET, "-o", out, "--outtype", outtype, "-q")
    assert res.code == 0, res.stderr
    assert_same_file(files[f"hf-{outtype}"], out)


def test_target_layers_shift_back_and_aux_norm_splits(files, target, tmp_path):
    job = prepare(files["poolside-bf16"], target)
    assert job.pf.stored_layers == (2, 10, 18, 24)
    job.write(tmp_path / "out.gguf")
    out = read_gguf(tmp_path / "out.gguf")
    assert list(out.kv[K.TARGET_LAYER_IDS]) == [1, 9, 17, 23]
    aux = read_gguf(files["poolside-bf16"]).tensors["enc.aux_norm.weight"][2]
    assert len({aux[i].tobytes() for i in range(4)}) == 4  # four different rows, so a mix-up shows
    for i in range(4):
        assert out.tensors[f"dflash_aux_hidden_norm.{i}.weight"][2].tobytes() == aux[i].tobytes()


def test_rewrite_follows_the_names_mapping_py_gives(files, target, monkeypatch):
    """The pre-FFN norm is being renamed in mapping.py; the rewrite must take whatever it says."""
    renamed = tuple((hf, "post_attention_norm.weight" if gguf == "ffn_norm.weight" else gguf)
                    for hf, gguf in mapping.BLOCK_NAMES)
    monkeypatch.setattr(mapping, "BLOCK_NAMES", renamed)
    names = [s.name for s in prepare(files["poolside-bf16"], target).specs]
    assert "blk.1.post_attention_norm.weight" in names and "blk.1.ffn_norm.weight" not in names


def run_json(capsys, drafter: Path) -> dict:
    code = main(["-m", str(TARGET), "-md", str(drafter), "-p", PROMPT, "-n", "40", "--n-max", "4", "--json"])
    assert code == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_laguna_run_drafts_with_a_poolside_file_as_with_the_hf_conversion(files, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LAGUNA_DFLASH_CACHE", str(tmp_path / "cache"))
    want = run_json(capsys, files["hf-bf16"])
    got = run_json(capsys, files["poolside-bf16"])
    assert got["tokens"] == want["tokens"] and got["text"] == want["text"]
    for key in ("rounds", "drafted", "accepted", "acceptance_by_position"):
        assert got["stats"][key] == want["stats"][key], key
    assert want["stats"]["accepted"] > 0

    cached = sorted((tmp_path / "cache" / "drafters").glob("*.gguf"))
    assert len(cached) == 1
    assert cached[0].name.startswith(hashlib.sha256(files["poolside-bf16"].read_bytes()).hexdigest() + "-")
    assert_same_file(files["hf-bf16"], cached[0])  # no requantization on the way: BF16 stays BF16
    stamp = cached[0].stat().st_mtime_ns
    assert native_drafter_path(files["poolside-bf16"], TARGET) == cached[0]
    assert cached[0].stat().st_mtime_ns == stamp  # converted once
    assert len(list((tmp_path / "cache" / "drafters").iterdir())) == 1


def test_our_layout_is_loaded_as_it_is(files, tmp_path, monkeypatch):
    monkeypatch.setenv("LAGUNA_DFLASH_CACHE", str(tmp_path / "cache"))
    assert native_drafter_path(files["hf-q8_0"], TARGET) == files["hf-q8_0"]
    assert not (tmp_path / "cache").exists()


def test_inspect_names_the_layout(files):
    res = run_cli("inspect", files["poolside-bf16"], "--target", TARGET)
    assert res.code == 0, res.stderr
    for text in ["dflash (decoder laguna)", "[2, 10, 18, 24]", "[1, 9, 17, 23]", "Poolside's dflash layout (mainline llama.cpp's architecture)",
                 "28 (17 BF16, 11 F32)", "pairs with target"]:
        assert text in res.stdout, text


def _set(key, value):
    def tweak(kv, tensors):
        old = kv[key]
        kv[key] = (value, *old[1:])
    return tweak


def _drop(*names):
    def tweak(kv, tensors):
        for n in names:
            (kv if n in kv else tensors).pop(n)
    return tweak


def _aux_rows(n):
    def tweak(kv, tensors):
        data, qtype = tensors["enc.aux_norm.weight"]
        tensors["enc.aux_norm.weight"] = (np.resize(data, (n, data.shape[1])), qtype)
    return tweak


BAD = {
    "aux-norm-shape": (_aux_rows(3), "enc.aux_norm.weight: expected ne [128, 4] (n_embd x 4 captured layers), "
                                     "found ne [128, 3]"),
    "missing-gate": (_drop("blk.1.attn_gate.weight"), "blk.1.attn_gate.weight: expected a tensor of ne [128, 8], "
                                                      "found nothing"),
    "layer-zero": (_set("dflash.target_layers", [0, 10, 18, 24]),
                   "dflash.target_layers[0]: expected a layer in 1..24 (HF id + 1; 0 would be the token embeddings"),
    "layer-past-target": (_set("dflash.target_layers", [2, 10, 18, 25]),
                          "dflash.target_layers[3]: expected a layer in 1..24 (HF id + 1), found 25"),
    "layers-not-increasing": (_set("dflash.target_layers", [2, 18, 10, 24]),
                              "dflash.target_layers: expected strictly increasing layers, found [2, 18, 10, 24]"),
    "generic-dflash": (_drop("dflash.decoder_arch", "enc.aux_norm.weight"),
                       'dflash.decoder_arch: expected "laguna" (a Laguna DFlash drafter), found nothing'),
    "not-causal": (_set("dflash.attention.causal", False), "dflash.attention.causal: expected true, found false"),
    "no-mask-token": (_drop("tokenizer.ggml.mask_token_id"), "tokenizer.ggml.mask_token_id: expected an integer"),
    "hidden-size": (_set("dflash.embedding_length", 96), "dflash.embedding_length: expected 128"),
}


@pytest.fixture(scope="module", params=sorted(BAD))
def bad_file(request, tmp_path_factory) -> tuple[Path, str]:
    tweak, fragment = BAD[request.param]
    path = tmp_path_factory.mktemp("bad") / f"{request.param}.gguf"
    return write_poolside_gguf(HF, TARGET, path, "bf16", tweak=tweak), fragment


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ")
    return lines[0]


def test_bad_file_convert_exits_2_with_one_line(bad_file, tmp_path):
    path, fragment = bad_file
    out = tmp_path / "out.gguf"
    res = run_cli("convert", path, "--target", TARGET, "-o", out, "-q")
    assert res.code == 2
    assert f"{path}: {fragment}" in one_error_line(res.stderr)
    assert list(tmp_path.iterdir()) == []


def test_bad_file_inspect_exits_2_with_one_line(bad_file):
    path, fragment = bad_file
    res = run_cli("inspect", path, "--target", TARGET)
    assert res.code == 2
    assert f"{path}: {fragment}" in one_error_line(res.stderr)


def test_bad_file_laguna_run_exits_2_with_one_line(bad_file, tmp_path, monkeypatch, capsys):
    path, fragment = bad_file
    monkeypatch.setenv("LAGUNA_DFLASH_CACHE", str(tmp_path / "cache"))
    assert main(["-m", str(TARGET), "-md", str(path), "-p", "x", "-n", "4"]) == 2
    assert f"{path}: {fragment}" in one_error_line(capsys.readouterr().err)
    assert not list((tmp_path / "cache").rglob("*.gguf*"))


def test_norms_of_a_bf16_file_become_f32_exactly(tmp_path, target, files):
    def bf16_norms(kv, tensors):
        for name, (data, qtype) in list(tensors.items()):
            if data.ndim == 1:
                bits = data.astype(np.float32).view(np.uint32) >> 16
                tensors[name] = (bits.astype(np.uint16), GGMLQuantizationType.BF16)

    path = write_poolside_gguf(HF, TARGET, tmp_path / "bf16-norms.gguf", "bf16", tweak=bf16_norms)
    out = tmp_path / "out.gguf"
    prepare(path, target, OutType.BF16).write(out)
    assert_same_file(files["hf-bf16"], out)
