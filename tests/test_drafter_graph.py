"""The Laguna drafter inside llama.cpp (patch 0003) against the independent numpy reference.

Tolerances: with F32 weights and an F32 KV cache the two differ by summation order only
(observed ~1e-6 on logits of magnitude ~3); we require 1e-4 absolute. Every negative control
below (a wrong forward) must differ from llama.cpp by more than 100x that tolerance, which is
what makes the positive comparisons meaningful. Q8_0 (weights, and activations inside each
matmul, in 8-bit blocks of 32) stacks ~0.5% relative error per matmul over a dozen matmuls:
we require max |Δlogit| <= 10% of max |logit| and the same argmax on >= 75% of the rows.
"""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest

from helpers import synthetic
from laguna_dflash.convert.gguf import keys as K
from laguna_dflash.convert import converter
from laguna_dflash.convert.target import read_target as read_target_info
from reference.dflash_numpy import DrafterReference, DrafterWeights, load_drafter
from laguna_dflash.runtime.drafter import Drafter
from laguna_dflash.runtime.llama import Context, ContextParams, LlamaError, Model

TOL = 1e-4
Q8_REL_TOL = 0.1
HIDDEN_IDS = (0, 2, 5)  # HF ids: after layers 0, 2 and the last of the 6-layer tiny target


def write_gguf_drafter(tmp: Path, name: str, tiny_target, outtype="f32", **kw) -> tuple[Path, Path]:
    args = dict(hidden=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, intermediate=96,
                target_layer_ids=HIDDEN_IDS, num_target_layers=6, vocab_size=512, sliding_window=24,
                dtype="f32", seed=7)
    args.update(kw)
    hf = synthetic.write_drafter(tmp / name, **args)
    out = tmp / f"{name}-{outtype}.gguf"
    converter.convert(hf, read_target_info(tiny_target["gguf"]), out, converter.OutType(outtype))
    return hf, out


@pytest.fixture(scope="module")
def target_model(tiny_target):
    with Model(tiny_target["gguf"]) as m:
        yield m


@pytest.fixture(scope="module")
def head_and_embd(tiny_target):
    r = gguf.GGUFReader(str(tiny_target["gguf"]))
    t = {x.name: np.array(x.data) for x in r.tensors}
    return t["token_embd.weight"], t["output.weight"]


@pytest.fixture(scope="module")
def drafter_files(tmp_path_factory, tiny_target):
    tmp = tmp_path_factory.mktemp("drafters")
    hf, f32 = write_gguf_drafter(tmp, "base", tiny_target)
    _, q8 = write_gguf_drafter(tmp, "base", tiny_target, outtype="q8_0")
    return {"hf": hf, "f32": f32, "q8_0": q8, "tmp": tmp}


def target_ctx(model, n_ctx=1024):
    return Context(model, ContextParams(n_ctx=n_ctx, n_batch=512, n_ubatch=512, kv_type="f32"))


def prompt(n, seed=0, vocab=512):
    return np.random.default_rng(seed).integers(16, vocab, size=n).astype(np.int32)


def prefill(tctx, drafter, tokens, chunk=512):
    """Target prefill in chunks, injecting each chunk's captured rows; returns the features."""
    feats = []
    for i0 in range(0, len(tokens), chunk):
        part = tokens[i0:i0 + chunk]
        tctx.decode(part, np.arange(i0, i0 + len(part)), logits="last")
        f = drafter.captured_features()
        drafter.inject(f, i0)
        feats.append(f)
    return np.concatenate(feats)


def reference_for(weights: DrafterWeights, head_and_embd, feats, positions=None, **kw) -> DrafterReference:
    emb, head = head_and_embd
    ref = DrafterReference(weights, emb, head, **kw)
    h = feats.shape[1] // len(HIDDEN_IDS)
    positions = np.arange(len(feats)) if positions is None else positions
    ref.add_context([feats[:, i * h:(i + 1) * h] for i in range(len(HIDDEN_IDS))], positions)
    return ref


def llama_block(target_model, path, tokens, block, kv_type="f32"):
    with target_ctx(target_model) as tctx, Drafter(path, tctx, kv_type=kv_type) as d:
        d.enable_capture()
        feats = prefill(tctx, d, tokens)
        return d.block_logits(block), feats


BLOCK = [100, 12, 12, 12, 12, 12, 12, 12]



@pytest.fixture
def c_loader_only(monkeypatch):
    """Reach patch 0003's own refusals (defence in depth): the Python header checks that run
    before llama.cpp (convert/gguf/rules.py, tested in test_gguf_ranges.py) would answer first."""
    import laguna_dflash.runtime.llama

    monkeypatch.setattr(laguna_dflash.runtime.llama, "checked_header", lambda *args, **kwargs: None)


def test_block_logits_match_numpy_reference(target_model, drafter_files, head_and_embd):
    tokens = prompt(96)
    got, feats = llama_block(target_model, drafter_files["f32"], tokens, BLOCK)
    ref = reference_for(load_drafter(drafter_files["hf"]), head_and_embd, feats)
    want = ref.draft_logits(BLOCK, len(tokens))
    assert got.shape == want.shape == (len(BLOCK), 512)
    assert np.abs(got - want).max() < TOL


def test_q8_0_drafter_stays_close_to_f32(target_model, drafter_files):
    tokens = prompt(96, seed=1)
    f32, _ = llama_block(target_model, drafter_files["f32"], tokens, BLOCK)
    q8, _ = llama_block(target_model, drafter_files["q8_0"], tokens, BLOCK)
    assert 0 < np.abs(q8 - f32).max() <= Q8_REL_TOL * np.abs(f32).max()
    assert (q8.argmax(1) == f32.argmax(1)).mean() >= 0.75


def test_block_is_causal(target_model, drafter_files):
    tokens = prompt(64, seed=2)
    with target_ctx(target_model) as tctx, Drafter(drafter_files["f32"], tctx, kv_type="f32") as d:
        d.enable_capture()
        prefill(tctx, d, tokens)
        base = d.block_logits([5, 20, 30, 40, 50, 60, 70, 80])
        for j in (1, 4, 7):
            block = [5, 20, 30, 40, 50, 60, 70, 80]
            block[j] = 300
            changed = d.block_logits(block)
            np.testing.assert_array_equal(changed[:j], base[:j], err_msg=f"row < {j} changed")
            assert np.abs(changed[j:] - base[j:]).max(axis=1).min() > 1e-4, f"rows >= {j} unchanged"


def test_window_is_applied_per_query_over_a_long_context(target_model, tmp_path, tiny_target, head_and_embd):
    hf, path = write_gguf_drafter(tmp_path, "w512", tiny_target, sliding_window=512)
    tokens = prompt(600, seed=3)
    block = [77] + [12] * 15
    got, feats = llama_block(target_model, path, tokens, block)
    weights = load_drafter(hf)
    want = reference_for(weights, head_and_embd, feats).draft_logits(block, len(tokens))
    assert np.abs(got - want).max() < TOL
    # the window matters here: without it, or with one fixed context view for the whole
    # block (the last window - 1 positions), the logits are measurably different
    unwindowed = reference_for(weights.with_windows(1 << 20), head_and_embd, feats).draft_logits(block, len(tokens))
    fixed = reference_for(weights.with_windows(1 << 20), head_and_embd, feats[-511:],
                          positions=np.arange(600 - 511, 600)).draft_logits(block, len(tokens))
    assert np.abs(got - unwindowed).max() > 100 * TOL
    assert np.abs(got - fixed).max() > 100 * TOL


def test_chunked_injection_equals_one_injection(target_model, drafter_files):
    tokens = prompt(200, seed=4)
    whole, _ = llama_block(target_model, drafter_files["f32"], tokens, BLOCK)
    with target_ctx(target_model) as tctx, Drafter(drafter_files["f32"], tctx, kv_type="f32") as d:
        d.enable_capture()
        prefill(tctx, d, tokens, chunk=37)
        chunked = d.block_logits(BLOCK)
    assert np.abs(chunked - whole).max() < TOL


@pytest.mark.parametrize("broken", ["skip_aux_norms", "skip_context_input_norm", "swap_qk"])
def test_reference_comparison_detects_a_wrong_forward(target_model, tmp_path, tiny_target, head_and_embd, broken):
    # q and k rows can only swap when they have the same width: n_heads == n_kv_heads here
    hf, path = write_gguf_drafter(tmp_path, "qk", tiny_target, n_heads=2, n_kv_heads=2)
    tokens = prompt(48, seed=5)
    got, feats = llama_block(target_model, path, tokens, BLOCK)
    weights = load_drafter(hf)
    good = reference_for(weights, head_and_embd, feats).draft_logits(BLOCK, len(tokens))
    assert np.abs(got - good).max() < TOL
    if broken == "swap_qk":
        t = dict(weights.tensors)
        for i in range(2):
            w = t[f"layers.{i}.self_attn.qkv_proj.weight"]
            t[f"layers.{i}.self_attn.qkv_proj.weight"] = np.concatenate([w[32:64], w[:32], w[64:]])
        bad_ref = reference_for(DrafterWeights.from_tensors(weights.raw_config, t), head_and_embd, feats)
    else:
        bad_ref = reference_for(weights, head_and_embd, feats, **{broken: True})
    bad = bad_ref.draft_logits(BLOCK, len(tokens))
    assert np.abs(got - bad).max() > 100 * TOL


# ---------------------------------------------------------------------------- malformed files


def rewrite(src: Path, dst: Path, drop=(), reshape=None, kv=None, drop_kv=(), rename=None, add=None) -> Path:
    """Copy a GGUF, dropping tensors, changing tensor shapes or names, adding tensors (``add``:
    name -> array), overriding or dropping keys.

    ``kv`` maps a key to ``(value, type)`` or ``(value, ARRAY, element type)`` (INT32 by default).
    """
    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    kv = kv or {}
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key in kv or key in drop_kv:
            continue
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), vtype, sub_type=f.types[-1])
        else:
            w.add_key_value(key, f.contents(), vtype)
    for key, (value, vtype, *sub) in kv.items():
        sub_type = (sub[0] if sub else gguf.GGUFValueType.INT32) if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, value, vtype, sub_type=sub_type)
    for t in r.tensors:
        if t.name in drop:
            continue
        data = np.array(t.data)
        if reshape and t.name in reshape:
            data = np.resize(data, reshape[t.name])
        w.add_tensor((rename or {}).get(t.name, t.name), data)
    for name, data in (add or {}).items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


TENSOR_KINDS = ["dflash_fc.weight", "dflash_hidden_norm.weight", "dflash_aux_hidden_norm.1.weight",
                "output_norm.weight"] + [f"blk.1.{k}.weight" for k in (
                    "attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_gate",
                    "attn_output", "post_attention_norm", "ffn_gate", "ffn_up", "ffn_down")]


@pytest.mark.parametrize("missing", TENSOR_KINDS)
@pytest.mark.usefixtures("c_loader_only")
def test_missing_tensor_fails_to_load_without_aborting(drafter_files, missing, tmp_path):
    bad = rewrite(drafter_files["f32"], tmp_path / "bad.gguf", drop={missing})
    with pytest.raises(LlamaError, match="refused to load"):
        Model(bad)


@pytest.mark.usefixtures("c_loader_only")
def test_wrong_shape_and_extra_tensor_fail_to_load(drafter_files, tmp_path):
    bad = rewrite(drafter_files["f32"], tmp_path / "shape.gguf", reshape={"blk.0.attn_gate.weight": (3, 64)})
    with pytest.raises(LlamaError, match="refused to load"):
        Model(bad)
    # an aux norm more than target_layer_ids has is an extra tensor
    extra = rewrite(drafter_files["f32"], tmp_path / "extra.gguf",
                    add={"dflash_aux_hidden_norm.3.weight": np.ones(64, dtype=np.float32)})
    with pytest.raises(LlamaError, match="refused to load"):
        Model(extra)


@pytest.mark.parametrize("key,value", [
    (K.CAUSAL, False),
    (K.DFLASH_LAGUNA, False),
])
@pytest.mark.usefixtures("c_loader_only")
def test_non_causal_or_non_laguna_metadata_fails_to_load(drafter_files, tmp_path, key, value):
    bad = rewrite(drafter_files["f32"], tmp_path / "meta.gguf", kv={key: (value, gguf.GGUFValueType.BOOL)})
    with pytest.raises(LlamaError, match="refused to load"):
        Model(bad)


def test_layer_ids_beyond_the_target_fail_at_context_creation(drafter_files, target_model, tmp_path):
    bad = rewrite(drafter_files["f32"], tmp_path / "ids.gguf",
                  kv={K.TARGET_LAYER_IDS: ([0, 2, 9], gguf.GGUFValueType.ARRAY)})
    with target_ctx(target_model) as tctx, Model(bad) as m:
        with pytest.raises(LlamaError, match="could not create a context"):
            Context(m, ContextParams(n_ctx=256), other=tctx)


def test_rows_outside_every_future_window_can_be_skipped(target_model, drafter_files):
    """inject_visible skips context rows no later query can see: same logits as injecting all."""
    tokens = prompt(100, seed=6)
    whole, _ = llama_block(target_model, drafter_files["f32"], tokens, BLOCK)
    with target_ctx(target_model) as tctx, Drafter(drafter_files["f32"], tctx, kv_type="f32") as d:
        d.enable_capture()
        tctx.decode(tokens, np.arange(len(tokens)), logits="last")
        d.inject_visible(d.captured_features(), 0, len(tokens))
        assert d.n_context == len(tokens)
        assert d.ctx.pos_max() == len(tokens) - 1
        skipped = d.block_logits(BLOCK)
    np.testing.assert_allclose(skipped, whole, atol=TOL, rtol=0)


# ---------------------------------------------------------------------------- files written before

def old_named(src: Path, dst: Path) -> Path:
    """``src`` with the pre-FFN norm under the name files converted before ik compatibility use."""
    r = gguf.GGUFReader(str(src))
    names = {t.name: t.name.replace("post_attention_norm", "ffn_norm") for t in r.tensors
             if "post_attention_norm" in t.name}
    assert names, "the converter writes post_attention_norm"
    return rewrite(src, dst, rename=names, drop_kv={K.GATING})


def test_a_file_with_the_old_ffn_norm_name_loads_and_drafts_the_same(target_model, drafter_files, tmp_path):
    from laguna_dflash.convert.drafter_info import layout_problems, read_drafter_gguf
    from laguna_dflash.convert.gguf.specs import read_drafter

    old = old_named(drafter_files["f32"], tmp_path / "old.gguf")
    assert not layout_problems(read_drafter_gguf(old))
    read_drafter(old)
    tokens = prompt(80, seed=8)
    new_logits, _ = llama_block(target_model, drafter_files["f32"], tokens, BLOCK)
    old_logits, _ = llama_block(target_model, old, tokens, BLOCK)
    np.testing.assert_array_equal(old_logits, new_logits)


@pytest.mark.usefixtures("c_loader_only")
def test_a_file_with_both_pre_ffn_norm_names_is_refused(drafter_files, tmp_path):
    from laguna_dflash.convert.drafter_info import layout_problems, read_drafter_gguf

    both = rewrite(drafter_files["f32"], tmp_path / "both.gguf",
                   add={"blk.0.ffn_norm.weight": np.ones(64, dtype=np.float32)})
    with pytest.raises(LlamaError, match="refused to load"):
        Model(both)
    assert any("blk.0.ffn_norm.weight" in str(p) for p in layout_problems(read_drafter_gguf(both)))


# ---------------------------------------------------------------------------- loader: errors, never aborts

U32, F32T, I32, BOOLT, STRT, ARR = (gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.INT32,
                                    gguf.GGUFValueType.BOOL, gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY)
P = K.ARCH + "."

# (id, keys to override, keys to drop, the loader's message). Each value passes the GGUF reader; without
# the loader's own check the file would load (or fail only later, or abort): the message says which check.
BAD_KEYS = [
    ("eps-nan", {K.RMS_EPS: (float("nan"), F32T)}, (),
     "attention.layer_norm_rms_epsilon nan must be positive and finite"),
    ("eps-zero", {K.RMS_EPS: (0.0, F32T)}, (),
     "attention.layer_norm_rms_epsilon 0 must be positive and finite"),
    ("eps-negative", {K.RMS_EPS: (-1e-6, F32T)}, (),
     "attention.layer_norm_rms_epsilon -1e-06 must be positive and finite"),
    ("rope-base-inf", {K.ROPE_FREQ_BASE: (float("inf"), F32T)}, (), "rope.freq_base inf must be positive and finite"),
    ("rope-base-zero", {K.ROPE_FREQ_BASE: (0.0, F32T)}, (), "rope.freq_base 0 must be positive and finite"),
    ("heads-zero", {K.HEAD_COUNT: (0, U32)}, (),
     "attention.head_count 0 and head_count_kv 2 must be positive, the first a multiple of the second"),
    ("kv-heads-zero", {K.HEAD_COUNT_KV: (0, U32)}, (),
     "attention.head_count 4 and head_count_kv 0 must be positive"),
    ("kv-heads-not-dividing", {K.HEAD_COUNT_KV: (3, U32)}, (),
     "attention.head_count 4 and head_count_kv 3 must be positive, the first a multiple of the second"),
    ("heads-per-layer", {K.HEAD_COUNT: ([4, 2], ARR, U32)}, (),
     "layer 1 has other head counts or feed_forward_length than layer 0"),
    ("ff-zero", {K.FEED_FORWARD_LENGTH: (0, U32)}, (), "feed_forward_length must be positive"),
    ("head-dim-zero", {K.KEY_LENGTH: (0, U32), K.VALUE_LENGTH: (0, U32)}, (),
     "attention.key_length 0 and value_length 0 must be equal and in 2..1024"),
    ("head-dim-huge", {K.KEY_LENGTH: (4096, U32), K.VALUE_LENGTH: (4096, U32)}, (),
     "attention.key_length 4096 and value_length 4096 must be equal and in 2..1024"),
    ("value-length-differs", {K.VALUE_LENGTH: (32, U32)}, (),
     "attention.key_length 16 and value_length 32 must be equal"),
    ("rope-dims-zero", {K.ROPE_DIMENSION_COUNT: (0, U32)}, (),
     "rope.dimension_count 0, expected an even count in 2..16 (the head size)"),
    ("rope-dims-odd", {K.ROPE_DIMENSION_COUNT: (7, U32)}, (), "rope.dimension_count 7, expected an even count"),
    ("rope-dims-beyond-head", {K.ROPE_DIMENSION_COUNT: (32, U32)}, (),
     "rope.dimension_count 32, expected an even count in 2..16"),
    ("block-size-1", {K.BLOCK_SIZE: (1, U32)}, (), "block_size 1 outside 2..512"),
    ("block-size-513", {K.BLOCK_SIZE: (513, U32)}, (), "block_size 513 outside 2..512"),
    ("window-1", {K.SLIDING_WINDOW: (1, U32)}, (), "attention.sliding_window 1 outside 2..2^20"),
    ("window-huge", {K.SLIDING_WINDOW: ((1 << 20) + 1, U32)}, (),
     "attention.sliding_window 1048577 outside 2..2^20"),
    ("ids-beyond-any-target", {K.TARGET_LAYER_IDS: ([0, 2, 600], ARR)}, (),
     "dflash.target_layer_ids must be strictly increasing ids in 0..511"),
    ("ids-decreasing", {K.TARGET_LAYER_IDS: ([2, 0, 5], ARR)}, (),
     "dflash.target_layer_ids must be strictly increasing"),
    ("ids-negative", {K.TARGET_LAYER_IDS: ([-1, 2, 5], ARR)}, (),
     "dflash.target_layer_ids must be strictly increasing"),
    ("gating-unknown", {K.GATING: ("per-row", STRT)}, (),
     'dflash.gating "per-row", expected per-head, per-element or disabled'),
    ("layers-mixed", {K.SLIDING_WINDOW_PATTERN: ([True, False], ARR, BOOLT)}, (),
     "layer 1 is full, but attention.sliding_window is set"),
    ("pattern-without-window", {}, (K.SLIDING_WINDOW,),
     "layer 0 is sliding, but attention.sliding_window is absent"),
    ("pattern-length", {K.SLIDING_WINDOW_PATTERN: ([True], ARR, BOOLT)}, (),
     "attention.sliding_window_pattern must hold one entry per layer (2)"),
]


@pytest.mark.parametrize("kv,drop_kv,message", [pytest.param(*c[1:], id=c[0]) for c in BAD_KEYS])
@pytest.mark.usefixtures("c_loader_only")
def test_bad_metadata_fails_to_load_with_the_loaders_message(drafter_files, tmp_path, capsys, kv, drop_kv, message):
    bad = rewrite(drafter_files["f32"], tmp_path / "bad.gguf", kv=kv, drop_kv=drop_kv)
    with pytest.raises(LlamaError, match="refused to load"):
        Model(bad)
    assert f"dflash-draft: {message}" in capsys.readouterr().err


# keys the generic loader GGML_ASSERTs on before the drafter's own checks: run in a child process,
# so that an abort (the check missing) fails this test instead of killing the test session
ABORTING_KEYS = [
    ("block-count-zero", {K.BLOCK_COUNT: (0, U32)}, "block_count 0 outside 1..512"),
    ("block-count-huge", {K.BLOCK_COUNT: (600, U32)}, "block_count 600 outside 1..512"),
    ("experts", {P + "expert_count": (4, U32)}, "dflash-draft.expert_count is set, but the drafter is dense"),
    ("rope-scaling-unknown", {P + "rope.scaling.type": ("spline", STRT)},
     'rope.scaling.type "spline", expected none (plain RoPE)'),
    ("rope-scaling-yarn", {P + "rope.scaling.type": ("yarn", STRT)}, 'rope.scaling.type "yarn", expected none'),
    ("rope-scale-factor", {P + "rope.scaling.factor": (4.0, F32T)},
     "dflash-draft.rope.scaling.factor is set, but the drafter uses plain RoPE"),
]


@pytest.mark.parametrize("kv,message", [pytest.param(*c[1:], id=c[0]) for c in ABORTING_KEYS])
def test_keys_the_generic_loader_asserts_on_fail_cleanly(drafter_files, tmp_path, kv, message):
    import subprocess
    import sys

    bad = rewrite(drafter_files["f32"], tmp_path / "bad.gguf", kv=kv)
    # the C loader alone, as c_loader_only does (the Python header checks would answer first)
    code = ("import sys\nimport laguna_dflash.runtime.llama\nlaguna_dflash.runtime.llama.checked_header = lambda *a, **k: None\n"
            "from laguna_dflash.runtime.llama import LlamaError, Model\n"
            "try:\n    Model(sys.argv[1])\nexcept LlamaError:\n    sys.exit(3)\n")
    res = subprocess.run([sys.executable, "-c", code, str(bad)], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert res.returncode == 3, res.stderr[-2000:]
    assert f"dflash-draft: {message}" in res.stderr


# ---------------------------------------------------------------------------- every config variant vLLM runs

def _variant_control(name: str, weights: DrafterWeights) -> DrafterWeights | None:
    """The same weights read without the variant's semantics (what a converter ignoring it would run)."""
    import dataclasses

    cfg = weights.config
    wrong = {
        "partial-rotary": dict(rotary_dim=None),
        "swa-rope-parameters": dict(rope_theta=1e6, rotary_dim=None),  # rope_parameters instead
        "nested-rope-parameters": dict(rope_theta=500000.0),  # the top-level rope_theta instead
        "per-element-gate": dict(gating="disabled"),
        "full-attention": dict(sliding_windows=[24] * cfg.num_layers),
        "full-attention-per-element-partial": dict(sliding_windows=[24] * cfg.num_layers, rotary_dim=None),
    }.get(name)
    if wrong is None:
        return None
    return DrafterWeights(dataclasses.replace(cfg, **wrong), weights.raw_config, weights.tensors)


VARIANTS = {
    "partial-rotary": dict(config_overrides={"partial_rotary_factor": 0.5}),
    "swa-rope-parameters": dict(config_overrides={
        "swa_rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.25},
        "rope_parameters": {"sliding_attention": {"rope_theta": 1e6}}}),
    "nested-rope-parameters": dict(config_overrides={"rope_parameters": {"full_attention": {"rope_theta": 2e4}}}),
    "per-element-gate": dict(gating="per-element"),
    "gate-disabled": dict(gating=False),
    "full-attention": dict(layer_type="full_attention"),
    "full-attention-per-element-partial": dict(layer_type="full_attention", gating="per-element",
                                               config_overrides={"partial_rotary_factor": 0.5}),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_config_variant_matches_the_reference_at_run_time(target_model, tmp_path, tiny_target, head_and_embd,
                                                               variant):
    """Convert a tiny checkpoint of the variant, run it through the runtime's injection path with a
    context 4x the window (24), compare the block logits with the numpy reference, and the drafts."""
    hf, path = write_gguf_drafter(tmp_path, variant, tiny_target, **VARIANTS[variant])
    weights = load_drafter(hf)
    tokens = prompt(96, seed=9)
    block = [int(tokens[-1])] + [12] * 7
    with target_ctx(target_model) as tctx, Drafter(path, tctx, kv_type="f32") as d:
        d.enable_capture()
        feats = []
        for i0 in range(0, len(tokens), 40):  # chunked prefill, rows injected as the engine does
            part = tokens[i0:i0 + 40]
            tctx.decode(part, np.arange(i0, i0 + len(part)), logits="last")
            f = d.captured_features()
            d.inject_visible(f, i0, len(tokens))
            feats.append(f)
        got = d.block_logits(block)
        drafts = d.draft(block[0], 7)
    feats = np.concatenate(feats)
    want = reference_for(weights, head_and_embd, feats).draft_logits(block, len(tokens))
    assert np.abs(got - want).max() < TOL
    assert drafts == [int(t) for t in want[1:].argmax(axis=1)]
    control = _variant_control(variant, weights)
    if control is not None:
        wrong = reference_for(control, head_and_embd, feats).draft_logits(block, len(tokens))
        assert np.abs(got - wrong).max() > 100 * TOL, "the variant must change the logits"


def test_a_full_attention_drafter_is_written_without_a_window(tmp_path, tiny_target):
    from laguna_dflash.convert.gguf.specs import read_drafter

    _, path = write_gguf_drafter(tmp_path, "full", tiny_target, layer_type="full_attention")
    kv = {k: f.contents() for k, f in gguf.GGUFReader(str(path)).fields.items()}
    assert K.SLIDING_WINDOW not in kv
    assert kv[K.SLIDING_WINDOW_PATTERN] == [False, False]
    assert read_drafter(path).sliding_window == 0


def test_without_a_window_the_runtime_keeps_every_context_row(target_model, tmp_path, tiny_target):
    """inject_visible (the engine's catch-up path) skips no row of a full-attention drafter, and
    queue_visible (its prefill path) reads every row at once: without a window nothing waits."""
    _, path = write_gguf_drafter(tmp_path, "full", tiny_target, layer_type="full_attention")
    tokens = prompt(100, seed=10)
    with target_ctx(target_model) as tctx, Drafter(path, tctx, kv_type="f32") as d:
        d.enable_capture()
        tctx.decode(tokens, np.arange(len(tokens)), logits="last")
        feats = d.captured_features()
        d.inject(feats, 0)
        every_row = d.block_logits(BLOCK)
        d.reset()
        d.inject_visible(feats[:60], 0, len(tokens))
        d.inject_visible(feats[60:], 60, len(tokens))
        assert d.n_context == len(tokens)
        np.testing.assert_allclose(d.block_logits(BLOCK), every_row, atol=TOL, rtol=0)
        d.reset()
        d.queue_visible(feats[:60], 0, len(tokens))
        d.queue_visible(feats[60:], 60, len(tokens))
        assert d.n_context == len(tokens) and d.n_pending == 0
        np.testing.assert_allclose(d.block_logits(BLOCK), every_row, atol=TOL, rtol=0)


def test_without_a_window_every_plain_step_reads_its_row_for_the_drafter(tiny_target, tmp_path):
    """The engine's capture horizon (plain steps before a draft whose rows the drafter reads)
    covers the whole sequence when the drafter has no window, and at most the window otherwise."""
    from laguna_dflash.runtime.engine import Engine, EngineConfig

    _, full = write_gguf_drafter(tmp_path, "full", tiny_target, layer_type="full_attention")
    _, windowed = write_gguf_drafter(tmp_path, "w", tiny_target, sliding_window=24)
    cfg = EngineConfig(n_ctx=256, kv_type="f32")
    with Engine.load(tiny_target["gguf"], full, cfg) as engine:
        assert engine.drafter.capture_horizon == math.inf
    with Engine.load(tiny_target["gguf"], windowed, cfg) as engine:
        assert engine.drafter.capture_horizon == 24
