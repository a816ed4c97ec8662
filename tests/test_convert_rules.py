"""Every SPEC §2 rule, broken once: exit code 2, one line naming file/field/expected/found, no output file."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from convert_fixtures import PRESETS, leftovers, run_cli, target_for

from laguna_dflash.convert.gguf import keys as K
from helpers.synthetic import ABSENT, write_drafter

XS = PRESETS["xs"]  # hidden 64, 2 layers, 4 heads / 2 kv heads, head_dim 16, ids (1, 3) of 4, vocab 256


def dflash(**kw: Any) -> dict[str, Any]:
    return {"config_overrides": {"dflash_config": kw}}


def cfg(**kw: Any) -> dict[str, Any]:
    return {"config_overrides": kw}


# (id, write_drafter options, target overrides, [file suffix, field, expected, found] fragments of the message)
CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    # --- dflash_config.target_layer_ids
    ("ids-empty", dflash(target_layer_ids=[]), {},
     ["config.json: dflash_config.target_layer_ids: expected a non-empty list", "found []"]),
    ("ids-absent", dflash(target_layer_ids=ABSENT), {},
     ["config.json: dflash_config.target_layer_ids: expected a non-empty list", "found nothing"]),
    ("ids-decreasing", dflash(target_layer_ids=[3, 1]), {},
     ["config.json: dflash_config.target_layer_ids: expected strictly increasing ids, found [3, 1]"]),
    ("ids-repeated", dflash(target_layer_ids=[1, 1]), {},
     ["config.json: dflash_config.target_layer_ids: expected strictly increasing ids, found [1, 1]"]),
    ("ids-too-large", dflash(target_layer_ids=[1, 4]), {},
     ["config.json: dflash_config.target_layer_ids[1]: expected a layer id in 0..3 (num_target_layers 4), found 4"]),
    ("ids-negative", dflash(target_layer_ids=[-1, 3]), {},
     ["config.json: dflash_config.target_layer_ids[0]: expected a layer id in 0..3", "found -1"]),
    # --- pairing with the target
    ("target-layers", {}, dict(n_layer=6),
     ["config.json: dflash_config.num_target_layers: expected 6 (the layer count of target", "found 4"]),
    ("target-vocab", {}, dict(vocab_size=300),
     ["config.json: vocab_size: expected 300 (the vocabulary of target", "found 256"]),
    ("target-hidden", {}, dict(hidden=96),
     ["config.json: hidden_size: expected 96 (the hidden size of target", "found 64"]),
    ("draft-vocab", cfg(draft_vocab_size=128), {},
     ["config.json: draft_vocab_size: expected 256 (= vocab_size), found 128"]),
    # --- mask token
    ("mask-too-large", dflash(mask_token_id=256), {},
     ["config.json: dflash_config.mask_token_id: expected an integer in 0..255, found 256"]),
    ("mask-negative", dflash(mask_token_id=-1), {},
     ["config.json: dflash_config.mask_token_id: expected an integer in 0..255, found -1"]),
    # --- causal, gating, layer types, bias
    ("causal-false", dflash(causal=False), {}, ["config.json: dflash_config.causal: expected true, found false"]),
    ("causal-absent", dflash(causal=ABSENT), {}, ["config.json: dflash_config.causal: expected true, found nothing"]),
    ("gating-unknown", cfg(gating="per-channel"), {},
     ['config.json: gating: expected one of true, "per-head", "per-element", false, "disabled", found "per-channel"']),
    ("gating-string-true", cfg(gating="true"), {},
     ['config.json: gating: expected one of true, "per-head", "per-element", false, "disabled", found "true"']),
    ("gating-number", cfg(gating=1), {},
     ['config.json: gating: expected one of true', "found 1"]),
    # the config's gating decides g_proj's shape: a per-head g_proj under another mode is refused
    ("gating-per-element-shape", cfg(gating="per-element"), {},
     ["model.safetensors: layers.0.self_attn.g_proj.weight: expected shape [64, 64], found shape [4, 64]"]),
    ("gating-disabled-with-g-proj", cfg(gating=False), {},
     ["model.safetensors: layers.0.self_attn.g_proj.weight: expected no such tensor in a Laguna DFlash drafter",
      "(and 1 more unexpected tensors)"]),
    ("layer-types-mixed", cfg(layer_types=["sliding_attention", "full_attention"]), {},
     ['config.json: layer_types: expected one type for every layer (all "sliding_attention" or all '
      '"full_attention"; the drafter cannot mix them), found ["sliding_attention", "full_attention"]']),
    ("layer-type-unknown", cfg(layer_types=["sliding_attention", "chunked_attention"]), {},
     ['config.json: layer_types[1]: expected "sliding_attention" or "full_attention", found "chunked_attention"']),
    ("layer-types-length", cfg(layer_types=["sliding_attention"]), {},
     ['config.json: layer_types: expected a list of 2 layer types', 'found ["sliding_attention"]']),
    ("layer-types-absent", cfg(layer_types=ABSENT), {},
     ['config.json: layer_types: expected a list of 2 layer types', 'found nothing']),
    ("attention-bias", cfg(attention_bias=True), {}, ["config.json: attention_bias: expected false, found true"]),
    ("experts", cfg(num_experts=8), {}, ["config.json: num_experts: expected 0 (the drafter is dense), found 8"]),
    # --- block size and windows
    ("block-size-small", dflash(block_size=1), {},
     ["config.json: dflash_config.block_size: expected an integer in 2..512, found 1"]),
    ("block-size-large", dflash(block_size=513), {},
     ["config.json: dflash_config.block_size: expected an integer in 2..512, found 513"]),
    ("window-small", cfg(sliding_window=1), {},
     ["config.json: sliding_window: expected an integer in 2..1048576, found 1"]),
    ("window-large", cfg(sliding_window=(1 << 20) + 1), {},
     ["config.json: sliding_window: expected an integer in 2..1048576, found 1048577"]),
    ("windows-entry", cfg(sliding_windows=[512, 1]), {},
     ["config.json: sliding_windows[1]: expected an integer in 2..1048576, found 1"]),
    ("windows-differ", cfg(sliding_windows=[512, 256]), {},
     ["config.json: sliding_windows[1]: expected 512 (= sliding_window; the GGUF has one window), found 256"]),
    # --- identity and geometry
    ("model-type", cfg(model_type="qwen3"), {}, ['config.json: model_type: expected "laguna", found "qwen3"']),
    ("architectures", cfg(architectures=["LagunaForCausalLM"]), {},
     ['config.json: architectures: expected ["DFlashLagunaForCausalLM"], found ["LagunaForCausalLM"]']),
    ("kv-heads", cfg(num_key_value_heads=3), {},
     ["config.json: num_key_value_heads: expected a divisor of num_attention_heads (4), found 3"]),
    ("rope-type", cfg(rope_scaling={"rope_type": "yarn", "factor": 4.0}), {},
     ['config.json: rope_scaling.rope_type: expected "default" (plain RoPE), found "yarn"']),
    ("rope-partial-zero", cfg(partial_rotary_factor=0.0), {},
     ["config.json: partial_rotary_factor: expected a factor in (0, 1] that rotates an even number (>= 2) of the "
      "16 head dims, found 0.0"]),
    ("rope-partial-above-one", cfg(rope_parameters={"rope_theta": 5e5, "partial_rotary_factor": 1.5}), {},
     ["config.json: rope_parameters.partial_rotary_factor: expected a factor in (0, 1]", "found 1.5"]),
    ("rope-partial-odd-dims", cfg(partial_rotary_factor=0.1875), {},  # 3 of 16 dims
     ["config.json: partial_rotary_factor: expected a factor in (0, 1] that rotates an even number", "found 0.1875"]),
    ("rope-partial-too-few-dims", cfg(swa_rope_parameters={"partial_rotary_factor": 0.1}), {},  # 1 of 16
     ["config.json: swa_rope_parameters.partial_rotary_factor: expected a factor in (0, 1]", "found 0.1"]),
    ("rope-partial-text", cfg(partial_rotary_factor="half"), {},
     ["config.json: partial_rotary_factor: expected a factor in (0, 1]", 'found "half"']),
    ("rope-theta-absent", cfg(rope_theta=ABSENT), {},
     ["config.json: rope_theta: expected a positive finite number, found nothing"]),
    ("rope-theta-negative-nested", cfg(rope_parameters={"sliding_attention": {"rope_theta": -1.0}}), {},
     ["config.json: rope_parameters.sliding_attention.rope_theta: expected a positive finite number, found -1.0"]),
    ("rope-swa-type", cfg(swa_rope_parameters={"rope_type": "yarn", "factor": 2.0}), {},
     ['config.json: swa_rope_parameters.rope_type: expected "default" (plain RoPE), found "yarn"']),
    ("rope-parameters-not-object", cfg(rope_parameters=[1e4]), {},
     ["config.json: rope_parameters: expected an object (or no field), found [10000.0]"]),
    ("eps-zero", cfg(rms_norm_eps=0), {}, ["config.json: rms_norm_eps: expected a positive finite number, found 0"]),
    ("layers-too-many", cfg(num_hidden_layers=513), {},
     ["config.json: num_hidden_layers: expected an integer in 1..512, found 513"]),
    ("head-dim-range", cfg(head_dim=4096), {}, ["config.json: head_dim: expected an integer in 2..1024, found 4096"]),
    ("hidden-beyond-u32", cfg(hidden_size=1 << 40), {},
     ["config.json: hidden_size: expected an integer in 1..4294967295, found 1099511627776"]),
    ("dflash-config-absent", cfg(dflash_config=ABSENT), {},
     ["config.json: dflash_config: expected an object with block_size", "found nothing"]),
    # --- weights: sanitising, key set, shapes
    ("fused-and-split", dict(extra_tensors={"layers.1.self_attn.q_proj.weight": np.zeros((64, 64))}), {},
     ["model.safetensors: layers.1.self_attn: expected either qkv_proj or q_proj/k_proj/v_proj",
      "found both qkv_proj and q_proj"]),
    ("split-incomplete", dict(fused_qkv=False, drop_tensors=["layers.0.self_attn.v_proj.weight"]), {},
     ["model.safetensors: layers.0.self_attn: expected all of q_proj, k_proj, v_proj", "found only q_proj, k_proj"]),
    ("split-wrong-shape", dict(fused_qkv=False, drop_tensors=["layers.0.self_attn.k_proj.weight"],
                               extra_tensors={"layers.0.self_attn.k_proj.weight": np.zeros((64, 64))}), {},
     ["model.safetensors: layers.0.self_attn.k_proj.weight: expected shape [32, 64], found shape [64, 64]"]),
    ("prefix-twice", dict(prefix=True, extra_tensors={"norm.weight": np.ones(64)}), {},
     ["model.safetensors: norm.weight: expected one copy of the tensor (with or without the 'model.' prefix)",
      "found both norm.weight and model.norm.weight"]),
    ("missing", dict(drop_tensors=["aux_hidden_norms.1.weight"]), {},
     ["model.safetensors: aux_hidden_norms.1.weight: expected a tensor of shape [64], found nothing"]),
    ("missing-many", dict(drop_tensors=["layers.1.mlp.up_proj.weight", "layers.1.mlp.down_proj.weight"]), {},
     ["model.safetensors: layers.1.mlp.up_proj.weight: expected a tensor of shape [96, 64]",
      "found nothing (and 1 more tensors missing)"]),
    ("unexpected", dict(extra_tensors={"lm_head.weight": np.zeros((256, 64))}), {},
     ["model.safetensors: lm_head.weight: expected no such tensor in a Laguna DFlash drafter",
      "found a tensor of shape [256, 64]"]),
    ("wrong-shape", dict(drop_tensors=["fc.weight"], extra_tensors={"fc.weight": np.zeros((64, 192))}), {},
     ["model.safetensors: fc.weight: expected shape [64, 128], found shape [64, 192]"]),
    ("g-proj-shape", dict(drop_tensors=["layers.0.self_attn.g_proj.weight"],
                          extra_tensors={"layers.0.self_attn.g_proj.weight": np.zeros((64, 64))}), {},
     ["model.safetensors: layers.0.self_attn.g_proj.weight: expected shape [4, 64], found shape [64, 64]"]),
    ("layers-numbered-oddly", cfg(num_hidden_layers=3, layer_types=["sliding_attention"] * 3), {},
     ["model.safetensors: layers: expected layer indices 0..2 (or 4..6, after the target's layers), found 0..1"]),
    ("layers-shifted", dict(extra_tensors={"layers.2.input_layernorm.weight": np.ones(64)}), {},
     ["model.safetensors: layers: expected layer indices 0..1 (or 4..5, after the target's layers), found 0..2"]),
    ("sharded-missing-tensor", dict(shards=2, drop_tensors=["hidden_norm.weight"]), {},
     ["hidden_norm.weight: expected a tensor of shape [64], found nothing"]),
]


@pytest.mark.parametrize("options,target_over,fragments", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_rule_violation_exits_2_with_one_line_and_no_file(tmp_path: Path, options: dict[str, Any],
                                                        target_over: dict[str, Any], fragments: list[str]) -> None:
    drafter = write_drafter(tmp_path / "drafter", **{**XS, **options})
    target = target_for(XS, tmp_path / "target.gguf", **target_over)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    res = run_cli("convert", drafter, "--target", target, "-o", out_dir / "drafter.gguf")
    assert res.code == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"error: {drafter}"), lines[0]
    for frag in fragments:
        assert frag in lines[0], lines[0]
    assert leftovers(out_dir) == []


def test_the_unbroken_base_case_converts(tmp_path: Path) -> None:
    """The cases above differ from this one by exactly the broken rule."""
    drafter = write_drafter(tmp_path / "drafter", **XS)
    target = target_for(XS, tmp_path / "target.gguf")
    res = run_cli("convert", drafter, "--target", target, "-o", tmp_path / "ok.gguf", "-q")
    assert res.code == 0, res.stderr
    assert (tmp_path / "ok.gguf").is_file()


def test_q8_0_needs_rows_of_32(tmp_path: Path) -> None:
    odd = dict(XS, hidden=48, n_heads=3, n_kv_heads=1, head_dim=16, intermediate=64)
    drafter = write_drafter(tmp_path / "d", **odd)
    target = target_for(odd, tmp_path / "t.gguf")
    res = run_cli("convert", drafter, "--target", target, "-o", tmp_path / "o.gguf")
    assert res.code == 2
    assert ("model.safetensors: layers.0.self_attn.qkv_proj.weight: expected a row length that is a multiple of "
            "32 for Q8_0 (use --outtype bf16, f16 or f32), found 48") in res.stderr
    assert not (tmp_path / "o.gguf").exists()
    res = run_cli("convert", drafter, "--target", target, "-o", tmp_path / "o.gguf", "--outtype", "bf16", "-q")
    assert res.code == 0, res.stderr


def test_source_dtype_must_be_a_float(tmp_path: Path) -> None:
    d = tmp_path / "d"
    write_drafter(d, **XS)
    header = json.dumps({"fc.weight": {"dtype": "I8", "shape": [64, 128], "data_offsets": [0, 8192]}}).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(8192))
    res = run_cli("convert", d, "--target", target_for(XS, tmp_path / "t.gguf"), "-o", tmp_path / "o.gguf")
    assert res.code == 2
    assert "model.safetensors: fc.weight.dtype: expected BF16 or F16 or F32, found I8" in res.stderr
    assert leftovers(tmp_path) == ["t.gguf"]


@pytest.mark.parametrize("break_it,fragment", [
    (lambda d: (d / "config.json").unlink(), "config.json: not found"),
    (lambda d: (d / "config.json").write_text("{not json"), "config.json: not readable JSON"),
    (lambda d: (d / "model.safetensors").unlink(), "expected model.safetensors or model.safetensors.index.json"),
    (lambda d: (d / "model.safetensors").write_bytes(b"\x05"), "model.safetensors: header: expected a safetensors"),
], ids=["no-config", "bad-json", "no-weights", "truncated-weights"])
def test_unreadable_inputs(tmp_path: Path, break_it: Any, fragment: str) -> None:
    d = write_drafter(tmp_path / "d", **XS)
    break_it(d)
    res = run_cli("convert", d, "--target", target_for(XS, tmp_path / "t.gguf"), "-o", tmp_path / "o.gguf")
    assert res.code == 2 and fragment in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert leftovers(tmp_path) == ["t.gguf"]


def test_index_naming_a_missing_shard(tmp_path: Path) -> None:
    d = write_drafter(tmp_path / "d", **XS, shards=2)
    (d / "model-00002-of-00002.safetensors").unlink()
    res = run_cli("convert", d, "--target", target_for(XS, tmp_path / "t.gguf"), "-o", tmp_path / "o.gguf")
    assert res.code == 2
    assert ("model.safetensors.index.json: weight_map: expected shard model-00002-of-00002.safetensors to exist, "
            "found no such file") in res.stderr


def test_target_that_is_a_drafter_or_missing(tmp_path: Path) -> None:
    d = write_drafter(tmp_path / "d", **XS)
    target = target_for(XS, tmp_path / "t.gguf")
    assert run_cli("convert", d, "--target", target, "-o", tmp_path / "draft.gguf", "-q").code == 0
    res = run_cli("convert", d, "--target", tmp_path / "draft.gguf", "-o", tmp_path / "again.gguf")
    assert res.code == 2
    assert ("draft.gguf: general.architecture: expected the target model (e.g. laguna), found 'dflash-draft'"
            in res.stderr)
    res = run_cli("convert", d, "--target", tmp_path / "nope.gguf", "-o", tmp_path / "again.gguf")
    assert res.code == 2 and "nope.gguf: target not found" in res.stderr
    res = run_cli("convert", d, "--target", d / "config.json", "-o", tmp_path / "again.gguf")
    assert res.code == 2 and "config.json: not a readable GGUF file" in res.stderr
    res = run_cli("convert", d, "--target", target, "-o", target)
    assert res.code == 2 and "is the target file" in res.stderr
    assert not (tmp_path / "again.gguf").exists()


@pytest.mark.parametrize("field,written,shown", [
    ("rope_theta", "Infinity", "Infinity"),
    ("rms_norm_eps", "NaN", "NaN"),
    ("rope_theta", "-Infinity", "-Infinity"),
    ("rope_theta", "1e400", "1e400 (beyond a double)"),
    ("attention_dropout", "NaN", "NaN"),  # a field the converter never reads is still a broken number
])
def test_non_finite_numbers_are_refused_with_the_field_named(tmp_path: Path, field: str, written: str,
                                                             shown: str) -> None:
    d = write_drafter(tmp_path / "d", **XS)
    raw = json.loads((d / "config.json").read_text())
    raw[field] = "@@"
    (d / "config.json").write_text(json.dumps(raw).replace('"@@"', written))
    res = run_cli("convert", d, "--target", target_for(XS, tmp_path / "t.gguf"), "-o", tmp_path / "o.gguf")
    assert res.code == 2, res.stdout + res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert f"config.json: {field}: expected a finite number, found {shown}" in res.stderr, res.stderr
    assert not (tmp_path / "o.gguf").exists()


def test_a_non_finite_number_inside_a_nested_field_is_named_by_its_path(tmp_path: Path) -> None:
    d = write_drafter(tmp_path / "d", **XS, config_overrides={"rope_parameters": {
        "sliding_attention": {"rope_theta": 1e4}, "full_attention": {"rope_theta": 1e4}}})
    text = (d / "config.json").read_text()
    (d / "config.json").write_text(text.replace('"full_attention": {\n      "rope_theta": 10000.0',
                                                '"full_attention": {\n      "rope_theta": 1e999'))
    res = run_cli("convert", d, "--target", target_for(XS, tmp_path / "t.gguf"), "-o", tmp_path / "o.gguf")
    assert res.code == 2
    assert ("config.json: rope_parameters.full_attention.rope_theta: expected a finite number, "
            "found 1e999 (beyond a double)") in res.stderr, res.stderr


# vLLM's _resolve_rope_params: (config fields, RoPE base and rotated dims it gives the drafter's layers)
ROPE_CASES = [
    ("top-level", {}, 500000.0, 16),
    ("flat-parameters-win-over-top-level", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
     1e6, 16),
    ("nested-sliding", {"rope_parameters": {"sliding_attention": {"rope_theta": 2.5e5},
                                            "full_attention": {"rope_theta": 1e6}}}, 2.5e5, 16),
    ("nested-falls-back-to-full", {"rope_parameters": {"full_attention": {"rope_theta": 1e6}}}, 1e6, 16),
    ("nested-empty-sliding-falls-back", {"rope_parameters": {"sliding_attention": {},
                                                             "full_attention": {"rope_theta": 7e5}}}, 7e5, 16),
    ("nested-without-theta-takes-top-level", {"rope_parameters": {"sliding_attention": {"rope_type": "default"}}},
     500000.0, 16),
    ("swa-parameters-win", {"swa_rope_parameters": {"rope_theta": 2e4},
                            "rope_parameters": {"sliding_attention": {"rope_theta": 2.5e5}}}, 2e4, 16),
    ("swa-without-theta-takes-top-level", {"swa_rope_parameters": {"partial_rotary_factor": 0.5}}, 500000.0, 8),
    ("partial-top-level", {"partial_rotary_factor": 0.5}, 500000.0, 8),
    ("partial-inside-wins", {"partial_rotary_factor": 0.25,
                             "rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.5}}, 1e4, 8),
    ("partial-truncates-like-vllm", {"partial_rotary_factor": 0.3}, 500000.0, 4),  # int(16 * 0.3)
    ("partial-one", {"partial_rotary_factor": 1.0}, 500000.0, 16),
]


@pytest.mark.parametrize("overrides,theta,rope_dims", [pytest.param(*c[1:], id=c[0]) for c in ROPE_CASES])
def test_rope_parameters_resolve_as_vllm_does(tmp_path: Path, overrides: dict[str, Any], theta: float,
                                             rope_dims: int) -> None:
    from convert_fixtures import read_gguf

    d = write_drafter(tmp_path / "d", **XS, config_overrides=overrides)
    out = tmp_path / "o.gguf"
    res = run_cli("convert", d, "--target", target_for(XS, tmp_path / "t.gguf"), "-o", out, "-q")
    assert res.code == 0, res.stderr
    kv = read_gguf(out).kv
    assert kv[K.ROPE_FREQ_BASE] == pytest.approx(theta, rel=1e-7)
    assert kv[K.ROPE_DIMENSION_COUNT] == rope_dims


def test_swa_rope_parameters_do_not_apply_to_full_attention_layers(tmp_path: Path) -> None:
    from convert_fixtures import read_gguf

    d = write_drafter(tmp_path / "d", **XS, layer_type="full_attention", config_overrides={
        "swa_rope_parameters": {"rope_theta": 2e4, "partial_rotary_factor": 0.5},
        "rope_parameters": {"sliding_attention": {"rope_theta": 2.5e5}, "full_attention": {"rope_theta": 1e6}}})
    out = tmp_path / "o.gguf"
    assert run_cli("convert", d, "--target", target_for(XS, tmp_path / "t.gguf"), "-o", out, "-q").code == 0
    kv = read_gguf(out).kv
    assert kv[K.ROPE_FREQ_BASE] == 1e6 and kv[K.ROPE_DIMENSION_COUNT] == 16


@pytest.mark.parametrize("written,mode", [(True, "per-head"), ("per-head", "per-head"), (ABSENT, "per-head"),
                                          ("per-element", "per-element"), (False, "disabled"),
                                          ("disabled", "disabled")])
def test_gating_values_vllm_accepts(tmp_path: Path, written: Any, mode: str) -> None:
    from convert_fixtures import read_gguf

    gating = {"per-head": "per-head", "per-element": "per-element", "disabled": False}[mode]
    d = write_drafter(tmp_path / "d", **XS, gating=gating, config_overrides={"gating": written})
    out = tmp_path / "o.gguf"
    res = run_cli("convert", d, "--target", target_for(XS, tmp_path / "t.gguf"), "-o", out, "-q")
    assert res.code == 0, res.stderr
    g = read_gguf(out)
    assert g.kv[K.GATING] == mode
    gates = {n: shape for n, (shape, _, _) in g.tensors.items() if n.endswith("attn_gate.weight")}
    # GGUF ne order: [n_embd, rows]
    want = {"per-head": {f"blk.{n}.attn_gate.weight": (64, 4) for n in range(2)},
            "per-element": {f"blk.{n}.attn_gate.weight": (64, 64) for n in range(2)}, "disabled": {}}[mode]
    assert gates == want
