"""laguna-gguf convert: the written GGUF equals the SPEC §5a layout table, and its tensors equal the source."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from convert_fixtures import (LAYOUT_KEYS, PRESETS, SOURCE_REPO_KEY, cv_targets, expected_tensor_table,  # noqa: F401
                              leftovers, read_gguf, run_cli)
from gguf import GGMLQuantizationType as Q

from laguna_dflash.convert.gguf import keys as K
from helpers.synthetic import write_drafter

LAYOUTS = [
    pytest.param("xs", dict(fused_qkv=True), id="xs-fused"),
    pytest.param("xs", dict(fused_qkv=False), id="xs-split"),
    pytest.param("xs", dict(prefix=True), id="xs-model-prefix"),
    pytest.param("xs", dict(fused_qkv=False, shards=3), id="xs-split-sharded"),
    pytest.param("s", dict(fused_qkv=True), id="s-fused"),
    pytest.param("s", dict(fused_qkv=False, prefix=True), id="s-split-model-prefix"),
    pytest.param("s", dict(layers_after_target=True, prefix=True), id="s-layers-after-target"),
]


def source_tensors(drafter: Path, preset: dict[str, Any]) -> dict[str, np.ndarray]:
    """The checkpoint's canonical tensors as float32, read with the safetensors library (an independent reader)."""
    import json

    from safetensors import safe_open

    index = drafter / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else [
        "model.safetensors"]
    raw: dict[str, np.ndarray] = {}
    for f in files:
        with safe_open(drafter / f, framework="pt") as st:
            for k in st.keys():
                raw[k] = st.get_tensor(k).float().numpy()
    out: dict[str, np.ndarray] = {}
    offset = preset["num_target_layers"]
    layer_ids = {int(k.split(".")[1]) for k in (k.removeprefix("model.") for k in raw) if k.startswith("layers.")}
    shift = offset if min(layer_ids) == offset else 0
    for k, v in raw.items():
        k = k.removeprefix("model.")
        if k.startswith("layers."):
            _, n, rest = k.split(".", 2)
            k = f"layers.{int(n) - shift}.{rest}"
        out[k] = v
    for n in range(preset["n_layers"]):
        a = f"layers.{n}.self_attn."
        if a + "q_proj.weight" in out:
            out[a + "qkv_proj.weight"] = np.concatenate([out.pop(a + s + "_proj.weight") for s in "qkv"])
    return out


def convert(drafter: Path, target: Path, out: Path, *extra: str) -> None:
    res = run_cli("convert", drafter, "--target", target, "-o", out, "--quiet", *extra)
    assert res.code == 0, res.stderr
    assert out.is_file()


@pytest.mark.parametrize("preset_name,layout", LAYOUTS)
def test_q8_0_layout_and_data(tmp_path: Path, cv_targets: dict[str, Path], preset_name: str,  # noqa: F811
                              layout: dict[str, Any]) -> None:
    preset = PRESETS[preset_name]
    drafter = write_drafter(tmp_path / "drafter", **preset, **layout, seed=7)
    out = tmp_path / "out.gguf"
    convert(drafter, cv_targets[preset_name], out)
    g = read_gguf(out)

    # metadata: exactly the layout table plus the target's tokenizer keys, with the table's types
    own = {k: t for k, t in g.kv_types.items() if not k.startswith("tokenizer.")}
    assert own == LAYOUT_KEYS
    kv = g.kv
    assert kv[K.GENERAL_ARCHITECTURE] == K.ARCH
    assert kv["general.file_type"] == 7 and kv["general.quantization_version"] == 2
    assert kv["general.name"] == "drafter" and kv["general.basename"] == "drafter"
    assert kv[K.DFLASH_LAGUNA] is True and kv[K.CAUSAL] is True
    assert kv[K.TARGET_LAYER_IDS] == list(preset["target_layer_ids"])  # HF ids, not +1
    assert kv[K.N_TARGET_FEATURES] == len(preset["target_layer_ids"]) * preset["hidden"]
    assert kv[K.BLOCK_SIZE] == 16 and kv[K.MASK_TOKEN_ID] == 12
    assert kv[K.SLIDING_WINDOW] == 512
    assert kv[K.SLIDING_WINDOW_PATTERN] == [True] * preset["n_layers"]
    assert kv[K.BLOCK_COUNT] == preset["n_layers"]
    assert kv[K.EMBEDDING_LENGTH] == preset["hidden"]
    assert kv[K.FEED_FORWARD_LENGTH] == preset["intermediate"]
    assert kv[K.HEAD_COUNT] == preset["n_heads"]
    assert kv[K.HEAD_COUNT_KV] == preset["n_kv_heads"]
    assert kv[K.KEY_LENGTH] == kv[K.VALUE_LENGTH] == preset["head_dim"]
    assert kv[K.ROPE_DIMENSION_COUNT] == preset["head_dim"]
    assert kv[K.ROPE_FREQ_BASE] == 500000.0
    assert kv[K.RMS_EPS] == pytest.approx(1e-6)
    assert kv[K.CONTEXT_LENGTH] == 262144
    assert kv[K.VOCAB_SIZE] == preset["vocab_size"]
    assert kv[K.TARGET_NAME] == "Tiny Laguna Target"
    assert kv[K.TARGET_N_LAYER] == preset["num_target_layers"]

    # tensors: names (in order), GGUF dims, types, and data against the source
    table = expected_tensor_table(preset)
    assert g.tensor_order == list(table)
    src = source_tensors(drafter, preset)
    for name, (hf, rows, ne) in table.items():
        shape, qtype, data = g.tensors[name]
        assert shape == ne, name
        x = src[hf] if rows is None else src[hf][rows[0]:rows[1]]
        assert x.shape == tuple(reversed(ne)), name
        if len(ne) == 1:
            assert qtype == Q.F32, name
            np.testing.assert_array_equal(data.view(np.float32).reshape(x.shape), x, err_msg=name)
        else:
            assert qtype == Q.Q8_0, name
            want = gguf.quants.quantize(x, Q.Q8_0)
            assert np.array_equal(data.view(np.uint8).reshape(want.shape), want), name


@pytest.mark.parametrize("outtype,qtype,file_type", [("f32", Q.F32, 0), ("bf16", Q.BF16, 32), ("f16", Q.F16, 1)])
@pytest.mark.parametrize("preset_name,layout", [("xs", dict(fused_qkv=True)), ("s", dict(fused_qkv=False))])
def test_float_outtypes_read_back_exactly(tmp_path: Path, cv_targets: dict[str, Path], outtype: str,  # noqa: F811
                                          qtype: Q, file_type: int, preset_name: str, layout: dict) -> None:
    preset = PRESETS[preset_name]
    drafter = write_drafter(tmp_path / "d", **preset, **layout, seed=3)
    out = tmp_path / "out.gguf"
    convert(drafter, cv_targets[preset_name], out, "--outtype", outtype)
    g = read_gguf(out)
    assert g.kv["general.file_type"] == file_type
    src = source_tensors(drafter, preset)
    for name, (hf, rows, ne) in expected_tensor_table(preset).items():
        shape, got_type, data = g.tensors[name]
        x = src[hf] if rows is None else src[hf][rows[0]:rows[1]]
        raw = data.view(np.uint8).reshape(-1)
        if len(ne) == 1:
            assert got_type == Q.F32
            back = raw.view(np.float32)
        else:
            assert got_type == qtype, name
            if qtype == Q.BF16:
                back = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            elif qtype == Q.F16:
                back = raw.view(np.float16)
                x = x.astype(np.float16)
            else:
                back = raw.view(np.float32)
        np.testing.assert_array_equal(back.reshape(x.shape), x, err_msg=name)


def test_f32_checkpoint_to_f32_is_lossless(tmp_path: Path, cv_targets: dict[str, Path]) -> None:  # noqa: F811
    from laguna_dflash.convert.checkpoint import load_config
    from helpers.synthetic import random_weights

    preset = PRESETS["xs"]
    drafter = write_drafter(tmp_path / "d", **preset, dtype="f32", seed=11)
    out = tmp_path / "o.gguf"
    convert(drafter, cv_targets["xs"], out, "--outtype", "f32")
    g = read_gguf(out)
    gen = dict(random_weights(load_config(drafter), seed=11))
    for name, (hf, rows, _) in expected_tensor_table(preset).items():
        x = gen[hf] if rows is None else gen[hf][rows[0]:rows[1]]
        np.testing.assert_array_equal(g.tensors[name][2].view(np.float32).reshape(x.shape), x)


def test_every_checkpoint_layout_gives_the_same_file(tmp_path: Path, cv_targets: dict[str, Path]) -> None:  # noqa: F811
    """Fused, split, prefixed, renumbered and sharded forms of one checkpoint convert to identical bytes."""
    digests = set()
    for i, layout in enumerate([dict(), dict(fused_qkv=False), dict(prefix=True), dict(layers_after_target=True),
                                dict(shards=2, fused_qkv=False, prefix=True)]):
        d = write_drafter(tmp_path / f"d{i}", **PRESETS["xs"], **layout, seed=5)
        out = tmp_path / f"o{i}.gguf"
        convert(d, cv_targets["xs"], out, "--name", "same")
        digests.add(hashlib.sha256(out.read_bytes()).hexdigest())
    assert len(digests) == 1


def test_tokenizer_is_copied_with_exact_types(tmp_path: Path, cv_targets: dict[str, Path]) -> None:  # noqa: F811
    d = write_drafter(tmp_path / "d", **PRESETS["s"])
    out = tmp_path / "o.gguf"
    convert(d, cv_targets["s"], out)
    got, want = read_gguf(out), read_gguf(cv_targets["s"])
    tok = {k: t for k, t in want.kv_types.items() if k.startswith("tokenizer.")}
    assert len(tok) >= 10
    assert {k: t for k, t in got.kv_types.items() if k.startswith("tokenizer.")} == tok
    for k in tok:
        assert got.kv[k] == want.kv[k], k


def test_provenance_keys(tmp_path: Path, cv_targets: dict[str, Path]) -> None:  # noqa: F811
    d = write_drafter(tmp_path / "d", **PRESETS["xs"], name_or_path="poolside/Laguna-XS-2.1-DFlash")
    convert(d, cv_targets["xs"], tmp_path / "a.gguf")
    a = read_gguf(tmp_path / "a.gguf").kv
    assert a[SOURCE_REPO_KEY] == "poolside/Laguna-XS-2.1-DFlash"
    assert a["general.name"] == "Laguna-XS-2.1-DFlash"
    convert(d, cv_targets["xs"], tmp_path / "b.gguf", "--source-repo", "me/my-drafter", "--name", "My Drafter")
    b = read_gguf(tmp_path / "b.gguf").kv
    assert b[SOURCE_REPO_KEY] == "me/my-drafter"
    assert b["general.name"] == "My Drafter" and b["general.basename"] == "My-Drafter"
    plain = write_drafter(tmp_path / "plain", **PRESETS["xs"], name_or_path="/home/me/ckpt/final")
    convert(plain, cv_targets["xs"], tmp_path / "c.gguf")
    assert SOURCE_REPO_KEY not in read_gguf(tmp_path / "c.gguf").kv
    res = run_cli("convert", d, "--target", cv_targets["xs"], "-o", tmp_path / "x.gguf", "--source-repo", "no-slash")
    assert res.code == 2 and "--source-repo: expected ORG/NAME" in res.stderr
    assert not (tmp_path / "x.gguf").exists()


def test_default_output_name_and_summary(tmp_path: Path, cv_targets: dict[str, Path],  # noqa: F811
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    d = write_drafter(tmp_path / "XS-DFlash", **PRESETS["xs"])
    monkeypatch.chdir(tmp_path)
    res = run_cli("convert", d, "--target", cv_targets["xs"], "--outtype", "bf16")
    assert res.code == 0, res.stderr
    out = tmp_path / "XS-DFlash-bf16.gguf"
    assert out.is_file()
    g = read_gguf(out)
    n_params = sum(int(np.prod(s)) for s, _, _ in g.tensors.values())
    assert f"{len(g.tensors)} tensors, {n_params:,} parameters" in res.stdout
    assert "BF16" in res.stdout and "F32" in res.stdout
    assert f"({out.stat().st_size:,} bytes)" in res.stdout
    assert leftovers(tmp_path) == ["XS-DFlash-bf16.gguf"]


def test_writer_streams_one_tensor_at_a_time(tmp_path: Path) -> None:
    """The header is on disk before the first tensor is produced, and each tensor is written before the next is made."""
    from gguf import GGUFValueType

    from laguna_dflash.convert.writer import KV, TensorSpec, write_gguf

    specs = [TensorSpec(f"t{i}", (4, 32), Q.F32) for i in range(3)]
    out = tmp_path / "s.gguf"
    events: list[str] = []

    def data():
        for s in specs:
            partial = list(tmp_path.glob("s.gguf.partial-*"))
            events.append(f"make {s.name} at {partial[0].stat().st_size if partial else -1}")
            yield np.zeros(s.shape, np.float32)

    write_gguf(out, K.ARCH, {"a.b": KV(1, GGUFValueType.UINT32)}, specs, data(),
               on_tensor=lambda s: events.append(f"wrote {s.name}"))
    sizes = [int(e.rsplit(" ", 1)[1]) for e in events if e.startswith("make")]
    assert [e.split(" at")[0] for e in events] == ["make t0", "wrote t0", "make t1", "wrote t1", "make t2", "wrote t2"]
    assert sizes[0] > 0 and sizes[0] < sizes[1] < sizes[2]
    assert leftovers(tmp_path) == ["s.gguf"]


def test_failure_while_writing_leaves_nothing(tmp_path: Path) -> None:
    from laguna_dflash.convert.writer import TensorSpec, write_gguf

    specs = [TensorSpec("a", (32,), Q.F32), TensorSpec("b", (32,), Q.F32)]

    def data():
        yield np.zeros(32, np.float32)
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        write_gguf(tmp_path / "x.gguf", K.ARCH, {}, specs, data())
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("variant,runtimes,rows", [
    (dict(), "laguna-run, ik_llama.cpp", ["per-head", "500000.0 / 16", "512"]),
    (dict(gating="per-element"), "laguna-run", ["per-element"]),
    (dict(gating=False), "laguna-run", ["disabled"]),
    (dict(layer_type="full_attention", config_overrides={"partial_rotary_factor": 0.5}),
     "laguna-run, ik_llama.cpp", ["none (full attention)", "500000.0 / 8"]),
], ids=["per-head", "per-element", "disabled", "full-partial"])
def test_inspect_says_which_runtimes_load_each_variant(tmp_path: Path, cv_targets: dict[str, Path],  # noqa: F811
                                                       variant: dict, runtimes: str, rows: list[str]) -> None:
    d = write_drafter(tmp_path / "d", **PRESETS["xs"], **variant)
    out = tmp_path / "o.gguf"
    convert(d, cv_targets["xs"], out)
    res = run_cli("inspect", out, "--target", cv_targets["xs"])
    assert res.code == 0, res.stderr
    loads = next(line for line in res.stdout.splitlines() if "loads in" in line)
    assert loads.split("loads in", 1)[1].strip(" │|") == runtimes
    for text in rows:
        assert text in res.stdout, text


def test_layout_of_the_variants(tmp_path: Path, cv_targets: dict[str, Path]) -> None:  # noqa: F811
    """Full attention: no window key and a pattern of falses; a disabled gate: no attn_gate tensor."""
    d = write_drafter(tmp_path / "d", **PRESETS["xs"], layer_type="full_attention", gating="disabled")
    out = tmp_path / "o.gguf"
    convert(d, cv_targets["xs"], out)
    g = read_gguf(out)
    assert K.SLIDING_WINDOW not in g.kv
    assert g.kv[K.SLIDING_WINDOW_PATTERN] == [False, False]
    assert g.kv[K.GATING] == "disabled"
    table = {k: v for k, v in expected_tensor_table(PRESETS["xs"]).items() if "attn_gate" not in k}
    assert g.tensor_order == list(table)


def test_a_file_converted_before_with_ffn_norm_passes_inspect(tmp_path: Path, cv_targets: dict[str, Path]) -> None:  # noqa: F811
    d = write_drafter(tmp_path / "d", **PRESETS["xs"])
    out = tmp_path / "o.gguf"
    convert(d, cv_targets["xs"], out)
    r = gguf.GGUFReader(str(out))
    old = tmp_path / "old.gguf"
    w = gguf.GGUFWriter(str(old), K.ARCH)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", K.GATING):
            continue
        vt = f.types[0]
        w.add_key_value(key, f.contents(), vt, sub_type=f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        w.add_tensor(t.name.replace("post_attention_norm", "ffn_norm"), np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    assert "blk.0.ffn_norm.weight" in read_gguf(old).tensors
    res = run_cli("inspect", old, "--target", cv_targets["xs"])
    assert res.code == 0, res.stderr
    assert "layout: complete dflash-draft" in res.stdout
    loads = next(line for line in res.stdout.splitlines() if "loads in" in line)
    assert loads.split("loads in", 1)[1].strip(" │|") == "laguna-run"  # ik requires post_attention_norm
