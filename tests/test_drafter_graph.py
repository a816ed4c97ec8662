"""The Laguna drafter inside llama.cpp (patch 0003) against the independent numpy reference.

Tolerances: with F32 weights and an F32 KV cache the two differ by summation order only
(observed ~1e-6 on logits of magnitude ~3); we require 1e-4 absolute. Every negative control
below (a wrong forward) must differ from llama.cpp by more than 100x that tolerance, which is
what makes the positive comparisons meaningful. Q8_0 (weights, and activations inside each
matmul, in 8-bit blocks of 32) stacks ~0.5% relative error per matmul over a dozen matmuls:
we require max |Δlogit| <= 10% of max |logit| and the same argmax on >= 75% of the rows.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from convert import converter, synthetic
from convert.target import read_target as read_target_info
from reference.dflash_numpy import DrafterReference, DrafterWeights, load_drafter
from runtime.drafter import Drafter
from runtime.llama import Context, ContextParams, LlamaError, Model

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


def rewrite(src: Path, dst: Path, drop=(), reshape=None, kv=None) -> Path:
    """Copy a GGUF, dropping tensors, changing tensor shapes or overriding scalar keys."""
    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    kv = kv or {}
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key in kv:
            continue
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), vtype, sub_type=f.types[-1])
        else:
            w.add_key_value(key, f.contents(), vtype)
    for key, (value, vtype) in kv.items():
        sub = gguf.GGUFValueType.INT32 if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, value, vtype, sub_type=sub)
    for t in r.tensors:
        if t.name in drop:
            continue
        data = np.array(t.data)
        if reshape and t.name in reshape:
            data = np.resize(data, reshape[t.name])
        w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


TENSOR_KINDS = ["dflash_fc.weight", "dflash_hidden_norm.weight", "dflash_aux_hidden_norm.1.weight",
                "output_norm.weight"] + [f"blk.1.{k}.weight" for k in (
                    "attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_gate",
                    "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")]


@pytest.mark.parametrize("missing", TENSOR_KINDS)
def test_missing_tensor_fails_to_load_without_aborting(drafter_files, missing, tmp_path):
    bad = rewrite(drafter_files["f32"], tmp_path / "bad.gguf", drop={missing})
    with pytest.raises(LlamaError, match="refused to load"):
        Model(bad)


def test_wrong_shape_and_extra_tensor_fail_to_load(drafter_files, tmp_path):
    bad = rewrite(drafter_files["f32"], tmp_path / "shape.gguf", reshape={"blk.0.attn_gate.weight": (3, 64)})
    with pytest.raises(LlamaError, match="refused to load"):
        Model(bad)
    # an aux norm more than target_layer_ids has is an extra tensor
    extra = tmp_path / "extra.gguf"
    r = gguf.GGUFReader(str(drafter_files["f32"]))
    w = gguf.GGUFWriter(str(extra), "dflash-draft")
    for key, f in r.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            vt = f.types[0]
            w.add_key_value(key, f.contents(), vt, sub_type=f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data))
    w.add_tensor("dflash_aux_hidden_norm.3.weight", np.ones(64, dtype=np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(LlamaError, match="refused to load"):
        Model(extra)


@pytest.mark.parametrize("key,value", [
    ("dflash-draft.attention.causal", False),
    ("dflash-draft.dflash.laguna", False),
])
def test_non_causal_or_non_laguna_metadata_fails_to_load(drafter_files, tmp_path, key, value):
    bad = rewrite(drafter_files["f32"], tmp_path / "meta.gguf", kv={key: (value, gguf.GGUFValueType.BOOL)})
    with pytest.raises(LlamaError, match="refused to load"):
        Model(bad)


def test_layer_ids_beyond_the_target_fail_at_context_creation(drafter_files, target_model, tmp_path):
    bad = rewrite(drafter_files["f32"], tmp_path / "ids.gguf",
                  kv={"dflash-draft.dflash.target_layer_ids": ([0, 2, 9], gguf.GGUFValueType.ARRAY)})
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
