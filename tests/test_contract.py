"""One drafter contract: the converter and the training model read every config alike (SPEC §2).

Each config below is written as a real checkpoint and read through both entry points: the
converter's ``prepare`` and the torch model's ``from_pretrained``. Where the two used to keep
their own copies (RoPE base, partial rotary, gating, full attention, layers numbered after
the target's) a test pins the vLLM rule the contract follows.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from convert_fixtures import TINY_XS, target_for

from laguna_dflash.convert.gguf import keys as K
from laguna_dflash.convert.checkpoint import ARCHITECTURE, MODEL_TYPE, DrafterConfig, parse_config
from laguna_dflash.convert.converter import prepare
from laguna_dflash.convert.errors import ContractError
from helpers.synthetic import write_drafter
from laguna_dflash.convert.target import read_target
from laguna_dflash.runtime.assets import TINY_DRAFTER_HF

torch = pytest.importorskip("torch")
from helpers.torch_drafter import LagunaDFlashDrafter  # noqa: E402

HEAD_DIM = TINY_XS["head_dim"]

#: name -> write_drafter keywords; every variant of SPEC §2 the converter accepts.
CONFIGS: dict[str, dict] = {
    "xs": {},
    "top-level-rope-theta": {"config_overrides": {"rope_theta": 123456.0}},
    "flat-rope-parameters": {"config_overrides": {"rope_parameters": {"rope_type": "default", "rope_theta": 2e5}}},
    "nested-rope-parameters": {"config_overrides": {"rope_parameters": {
        "sliding_attention": {"rope_theta": 2.5e5}, "full_attention": {"rope_theta": 1e6}}}},
    "nested-full-only": {"config_overrides": {"rope_parameters": {"full_attention": {"rope_theta": 1e6}}}},
    "swa-rope-parameters": {"config_overrides": {
        "swa_rope_parameters": {"rope_theta": 2e4},
        "rope_parameters": {"sliding_attention": {"rope_theta": 2.5e5}}}},
    "partial-rotary-top-level": {"config_overrides": {"partial_rotary_factor": 0.5}},
    "partial-rotary-in-parameters": {"config_overrides": {
        "partial_rotary_factor": 0.25, "rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.5}}},
    "gating-true": {"gating": True},
    "gating-per-element": {"gating": "per-element"},
    "gating-false": {"gating": False},
    "gating-disabled": {"gating": "disabled"},
    "full-attention": {"layer_type": "full_attention", "config_overrides": {
        "swa_rope_parameters": {"rope_theta": 2e4}, "rope_parameters": {"full_attention": {"rope_theta": 1e6}}}},
    "layers-after-target": {"layers_after_target": True},
    "split-qkv-prefixed": {"fused_qkv": False, "prefix": True},
}


def _write(tmp_path: Path, name: str) -> Path:
    return write_drafter(tmp_path / name, **{**TINY_XS, **CONFIGS[name]}, dtype="f32")


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return target_for(TINY_XS, tmp_path_factory.mktemp("contract") / "target.gguf")


def _through_both(d: Path, target: Path) -> tuple[DrafterConfig, DrafterConfig]:
    converted = prepare(d, read_target(target)).cfg
    trained = LagunaDFlashDrafter.from_pretrained(d).contract
    return converted, trained


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_converter_and_training_model_parse_every_config_alike(tmp_path, target, name):
    converted, trained = _through_both(_write(tmp_path, name), target)
    assert converted == trained


def test_the_demo_pair_parses_alike_in_both(tmp_path):
    raw = json.loads((TINY_DRAFTER_HF / "config.json").read_text())
    source = TINY_DRAFTER_HF / "config.json"
    assert LagunaDFlashDrafter(raw, source).contract == parse_config(raw, source)


def _cfg(tmp_path: Path, target: Path, name: str) -> DrafterConfig:
    converted, trained = _through_both(_write(tmp_path, name), target)
    assert converted == trained
    return trained


def test_rope_base_is_swa_rope_parameters_first(tmp_path, target):
    assert _cfg(tmp_path, target, "swa-rope-parameters").rope_theta == 2e4


def test_rope_base_nested_by_layer_type_falls_back_to_full_attention(tmp_path, target):
    assert _cfg(tmp_path, target, "nested-rope-parameters").rope_theta == 2.5e5
    assert _cfg(tmp_path, target, "nested-full-only").rope_theta == 1e6


def test_rope_base_flat_parameters_then_top_level(tmp_path, target):
    assert _cfg(tmp_path, target, "flat-rope-parameters").rope_theta == 2e5
    assert _cfg(tmp_path, target, "top-level-rope-theta").rope_theta == 123456.0


def test_full_attention_layers_ignore_swa_rope_parameters(tmp_path, target):
    c = _cfg(tmp_path, target, "full-attention")
    assert (c.rope_theta, c.sliding_window) == (1e6, None)


def test_partial_rotary_factor_inside_the_parameters_wins(tmp_path, target):
    assert _cfg(tmp_path, target, "partial-rotary-top-level").rotary_dims == HEAD_DIM // 2
    assert _cfg(tmp_path, target, "partial-rotary-in-parameters").rotary_dims == HEAD_DIM // 2


@pytest.mark.parametrize(("name", "mode"), [("gating-true", K.GATING_PER_HEAD), ("gating-per-element",
                         K.GATING_PER_ELEMENT), ("gating-false", K.GATING_DISABLED),
                         ("gating-disabled", K.GATING_DISABLED)])
def test_gating_values_as_vllm_reads_them(tmp_path, target, name, mode):
    c = _cfg(tmp_path, target, name)
    assert c.gating == mode
    gates = [k for k in LagunaDFlashDrafter.from_pretrained(tmp_path / name).state_dict() if "g_proj" in k]
    assert len(gates) == (0 if mode == K.GATING_DISABLED else c.num_hidden_layers)


def test_layers_numbered_after_the_targets_are_renumbered_from_zero(tmp_path, target):
    plain = LagunaDFlashDrafter.from_pretrained(_write(tmp_path, "xs"))
    after = LagunaDFlashDrafter.from_pretrained(_write(tmp_path, "layers-after-target"))
    assert plain.contract == dataclasses.replace(after.contract, source=plain.contract.source)
    for (k, a), (k2, b) in zip(plain.state_dict().items(), after.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(a, b), k


def test_the_torch_model_refuses_what_the_converter_refuses(tmp_path, target):
    d = write_drafter(tmp_path / "bad", **TINY_XS, dtype="f32",
                      config_overrides={"layer_types": ["sliding_attention", "full_attention"]})
    with pytest.raises(ContractError, match="layer_types"):
        prepare(d, read_target(target))
    with pytest.raises(ContractError, match="layer_types"):
        LagunaDFlashDrafter.from_pretrained(d)


def test_hidden_act_other_than_silu_is_refused(tmp_path):
    raw = json.loads((TINY_DRAFTER_HF / "config.json").read_text())
    assert raw["model_type"] == MODEL_TYPE and ARCHITECTURE in raw["architectures"]
    with pytest.raises(ContractError, match='hidden_act: expected "silu", found "gelu"'):
        parse_config({**raw, "hidden_act": "gelu"}, "config.json")
