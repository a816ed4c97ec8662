"""The two drafter implementations (numpy reference, torch module) against each other and SPEC §3.

Tiny random drafters are written to disk as real HF-layout checkpoints (config.json +
model.safetensors) with random, non-unit norm weights so that any norm mix-up shows.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from reference.dflash_numpy import (  # noqa: E402
    DrafterReference,
    DrafterWeights,
    load_drafter,
    rms_norm,
    rope_neox,
)

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

from laguna_dflash.convert.checkpoint import expected_tensors  # noqa: E402
from laguna_dflash.convert.errors import ContractError  # noqa: E402
from helpers.torch_drafter import LagunaDFlashDrafter  # noqa: E402

H, I, NH, NKV, HD, VOCAB, WINDOW = 64, 128, 4, 2, 16, 97, 8
TARGET_IDS = [0, 2, 3]
MASK_ID = 5
EPS = 1e-6


def make_config(num_layers: int = 2, window: int = WINDOW, theta: float = 10000.0) -> dict:
    return {
        "model_type": "laguna",
        "architectures": ["DFlashLagunaForCausalLM"],
        "hidden_size": H,
        "intermediate_size": I,
        "num_hidden_layers": num_layers,
        "num_attention_heads": NH,
        "num_key_value_heads": NKV,
        "head_dim": HD,
        "rms_norm_eps": EPS,
        "vocab_size": VOCAB,
        "draft_vocab_size": VOCAB,
        "rope_theta": theta,
        "sliding_window": window,
        "layer_types": ["sliding_attention"] * num_layers,
        "gating": "per-head",
        "num_experts": 0,
        "attention_bias": False,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "dflash_config": {
            "block_size": 6,
            "mask_token_id": MASK_ID,
            "num_target_layers": 4,
            "target_layer_ids": TARGET_IDS,
            "causal": True,
        },
    }


def make_tensors(cfg: dict, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    n_aux = len(cfg["dflash_config"]["target_layer_ids"])
    q, kv = NH * HD, NKV * HD

    def mat(rows, cols, gain=1.0):
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    def norm(n):  # deliberately far from 1 so that norm bugs show
        return rng.uniform(0.3, 1.7, size=n).astype(np.float32)

    t = {"fc.weight": mat(H, n_aux * H), "hidden_norm.weight": norm(H), "norm.weight": norm(H)}
    for i in range(n_aux):
        t[f"aux_hidden_norms.{i}.weight"] = norm(H)
    for l in range(cfg["num_hidden_layers"]):
        p = f"layers.{l}."
        t[p + "input_layernorm.weight"] = norm(H)
        t[p + "post_attention_layernorm.weight"] = norm(H)
        t[p + "self_attn.qkv_proj.weight"] = mat(q + 2 * kv, H, 2.0)
        t[p + "self_attn.o_proj.weight"] = mat(H, q)
        t[p + "self_attn.g_proj.weight"] = mat(NH, H)
        t[p + "self_attn.q_norm.weight"] = norm(HD)
        t[p + "self_attn.k_norm.weight"] = norm(HD)
        t[p + "mlp.gate_proj.weight"] = mat(I, H)
        t[p + "mlp.up_proj.weight"] = mat(I, H)
        t[p + "mlp.down_proj.weight"] = mat(H, I)
    return t


def write_checkpoint(d: Path, cfg: dict, tensors: dict[str, np.ndarray], *, dtype=None, prefix="",
                     split_qkv=False) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    out = {}
    for k, v in tensors.items():
        tv = torch.from_numpy(np.ascontiguousarray(v))
        if dtype is not None:
            tv = tv.to(dtype)
        if split_qkv and k.endswith("qkv_proj.weight"):
            base = k[: -len("qkv_proj.weight")]
            qs, ks, _ = NH * HD, NKV * HD, NKV * HD
            out[prefix + base + "q_proj.weight"] = tv[:qs].contiguous()
            out[prefix + base + "k_proj.weight"] = tv[qs : qs + ks].contiguous()
            out[prefix + base + "v_proj.weight"] = tv[qs + ks :].contiguous()
        else:
            out[prefix + k] = tv
    save_file(out, str(d / "model.safetensors"))
    return d


def target_mats(seed: int = 123):
    rng = np.random.default_rng(seed)
    embed = rng.standard_normal((VOCAB, H)).astype(np.float32)
    lm_head = (rng.standard_normal((VOCAB, H)) / np.sqrt(H)).astype(np.float32)
    return embed, lm_head


def captured(T: int, seed: int) -> list[np.ndarray]:
    """One [T, H] array per target layer id, at very different scales (so aux norms matter)."""
    rng = np.random.default_rng(seed)
    scales = [3.0, 0.2, 15.0]
    return [(rng.standard_normal((T, H)) * s + 0.5 * s).astype(np.float32) for s in scales[: len(TARGET_IDS)]]


def block(seed: int, L: int = 6) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(rng.integers(VOCAB))] + [MASK_ID] * (L - 1)


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def numpy_logits(weights, hidden, T0, blk, start=None, chunks=None, **kw):
    embed, lm_head = target_mats()
    ref = DrafterReference(weights, embed, lm_head, **kw)
    T = hidden[0].shape[0]
    bounds = [0] + list(chunks or []) + [T]
    for a, b in zip(bounds, bounds[1:]):
        ref.add_context([h[a:b] for h in hidden], np.arange(T0 + a, T0 + b))
    return ref.draft_logits(blk, T0 + T if start is None else start)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    cfg = make_config(num_layers=3)
    return write_checkpoint(tmp_path_factory.mktemp("drafter3"), cfg, make_tensors(cfg, seed=0))


@pytest.fixture(scope="module")
def weights(ckpt):
    return load_drafter(ckpt)


# ------------------------------------------------------------------------------- (a)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_numpy_matches_torch(ckpt, weights, dtype, tol):
    """Batch of two: a 20-row context (window 8 matters) and a 15-row one padded with context_mask."""
    embed, lm_head = target_mats()
    L = 6
    hid0, hid1 = captured(20, seed=1), captured(15, seed=2)
    blk0, blk1 = block(3, L), block(4, L)
    # numpy: context in chunks; sample 1 starts at position 7 (positions need not start at 0)
    ref0 = numpy_logits(weights, hid0, 0, blk0, chunks=[7, 12])
    ref1 = numpy_logits(weights, hid1, 7, blk1, chunks=[4])

    model = LagunaDFlashDrafter.from_pretrained(ckpt, dtype=dtype)
    pad = [np.concatenate([h, np.full((5, H), 99.0, np.float32)]) for h in hid1]
    ctx = torch.stack(
        [torch.from_numpy(np.concatenate(hid0, -1)), torch.from_numpy(np.concatenate(pad, -1))]
    ).to(dtype)
    # padding rows sit at position 21, inside every query's window: only context_mask hides them
    ctx_pos = torch.stack([torch.arange(20), torch.cat([torch.arange(7, 22), torch.full((5,), 21)])])
    ctx_mask = torch.ones(2, 20, dtype=torch.bool)
    ctx_mask[1, 15:] = False
    emb = torch.from_numpy(embed).to(dtype)
    blk_emb = torch.stack([emb[blk0], emb[blk1]])
    blk_pos = torch.stack([torch.arange(20, 20 + L), torch.arange(22, 22 + L)])
    with torch.no_grad():
        out = model(ctx, ctx_pos, blk_emb, blk_pos, torch.from_numpy(lm_head), context_mask=ctx_mask)
    assert out.shape == (2, L, VOCAB) and out.dtype == dtype
    assert rel_err(out[0].numpy(), ref0) < tol
    assert rel_err(out[1].numpy(), ref1) < tol

    # the list-of-layers context form gives the same logits
    with torch.no_grad():
        out_list = model([ctx[..., i * H : (i + 1) * H] for i in range(3)], ctx_pos, blk_emb, blk_pos,
                         torch.from_numpy(lm_head), context_mask=ctx_mask)
    torch.testing.assert_close(out_list, out, rtol=0, atol=0)


def test_chunked_context_truncate_and_reset(weights):
    hid = captured(20, seed=5)
    blk = block(6)
    once = numpy_logits(weights, hid, 0, blk)
    chunked = numpy_logits(weights, hid, 0, blk, chunks=[1, 9, 13])
    np.testing.assert_allclose(chunked, once, rtol=1e-12, atol=1e-12)

    # rollback: 4 extra rows, then truncate back to 20 positions
    embed, lm_head = target_mats()
    ref = DrafterReference(weights, embed, lm_head)
    ref.add_context(hid, np.arange(20))
    ref.add_context(captured(4, seed=9), np.arange(20, 24))
    assert ref.n_context == 24
    with_extra = ref.draft_logits(blk, 20)
    assert not np.allclose(with_extra, once)  # the extra rows (positions 20..23 <= queries) are seen
    ref.truncate_context(20)
    assert ref.n_context == 20
    np.testing.assert_allclose(ref.draft_logits(blk, 20), once, rtol=1e-12, atol=1e-12)
    ref.reset()
    assert ref.n_context == 0
    ref.add_context(hid, np.arange(20))
    np.testing.assert_allclose(ref.draft_logits(blk, 20), once, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------- (b)


def test_block_is_causal(ckpt, weights):
    embed, lm_head = target_mats()
    hid = captured(12, seed=7)
    L = 6
    blk = block(8, L)
    base = numpy_logits(weights, hid, 0, blk)
    model = LagunaDFlashDrafter.from_pretrained(ckpt, dtype=torch.float64)
    ctx = torch.from_numpy(np.concatenate(hid, -1))[None].double()
    emb = torch.from_numpy(embed).double()
    for j in range(L):
        changed = list(blk)
        changed[j] = (changed[j] + 17) % VOCAB
        got = numpy_logits(weights, hid, 0, changed)
        np.testing.assert_array_equal(got[:j], base[:j])
        assert np.all(np.max(np.abs(got[j:] - base[j:]), axis=-1) > 1e-6), f"rows >= {j} must change"
        with torch.no_grad():
            a = model(ctx, torch.arange(12), emb[blk][None], torch.arange(12, 12 + L), torch.from_numpy(lm_head))
            b = model(ctx, torch.arange(12), emb[changed][None], torch.arange(12, 12 + L), torch.from_numpy(lm_head))
        assert torch.equal(a[0, :j], b[0, :j])
        assert bool(((a[0, j:] - b[0, j:]).abs().amax(-1) > 1e-6).all())


# ------------------------------------------------------------------------------- (c)


def test_window_is_per_query(tmp_path):
    """Context of 20 positions, window 8, block at 20..25."""
    T, L = 20, 6
    hid = captured(T, seed=11)
    blk = block(12, L)
    for n_layers in (1, 2):
        cfg = make_config(num_layers=n_layers)
        w = load_drafter(write_checkpoint(tmp_path / f"l{n_layers}", cfg, make_tensors(cfg, seed=20 + n_layers)))
        windowed = numpy_logits(w, hid, 0, blk)
        no_window = numpy_logits(w.with_windows(10**6), hid, 0, blk)
        assert rel_err(windowed, no_window) > 1e-3, "the window must matter with 20 context rows"
        # rows a query may see: positions p-7..p; drop the rest of the context by hand
        rows = range(L) if n_layers == 1 else [0]  # deeper layers mix rows with different windows
        for i in rows:
            first = (T + i) - WINDOW + 1
            manual = numpy_logits(w.with_windows(10**6), [h[first:] for h in hid], first, blk, start=T)
            np.testing.assert_allclose(windowed[i], manual[i], rtol=1e-10, atol=1e-10)
            if i > 0:  # a block-wide window (one slice of window-1 rows for every query) is wrong
                block_wide = numpy_logits(w.with_windows(10**6), [h[T - WINDOW + 1 :] for h in hid],
                                          T - WINDOW + 1, blk, start=T)
                assert rel_err(windowed[i], block_wide[i]) > 1e-6


def test_window_in_torch_matches_manual_drop(tmp_path):
    """The torch mask on its own: 1 layer, each row equals a no-window run on its own visible context."""
    T, L = 20, 6
    cfg = make_config(num_layers=1)
    d = write_checkpoint(tmp_path / "t1", cfg, make_tensors(cfg, seed=31))
    embed, lm_head = target_mats()
    hid = np.concatenate(captured(T, seed=13), -1)
    blk = block(14, L)
    model = LagunaDFlashDrafter.from_pretrained(d, dtype=torch.float64)
    cfg_nw = dict(cfg, sliding_window=10**6)
    model_nw = LagunaDFlashDrafter(cfg_nw).double()
    model_nw.load_state_dict(model.state_dict())
    emb = torch.from_numpy(embed).double()[blk][None]
    lm = torch.from_numpy(lm_head)
    with torch.no_grad():
        windowed = model(torch.from_numpy(hid)[None], torch.arange(T), emb, torch.arange(T, T + L), lm)[0]
        full = model_nw(torch.from_numpy(hid)[None], torch.arange(T), emb, torch.arange(T, T + L), lm)[0]
        assert (windowed - full).abs().max() > 1e-3
        for i in range(L):
            first = T + i - WINDOW + 1
            manual = model_nw(torch.from_numpy(hid[first:])[None], torch.arange(first, T), emb,
                              torch.arange(T, T + L), lm)[0]
            torch.testing.assert_close(windowed[i], manual[i], rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------------------------- (d)


@pytest.mark.parametrize("switch", ["skip_aux_norms", "skip_context_input_norm"])
def test_skipping_context_norms_changes_logits(weights, switch):
    hid = captured(12, seed=15)
    blk = block(16)
    good = numpy_logits(weights, hid, 0, blk)
    bad = numpy_logits(weights, hid, 0, blk, **{switch: True})
    assert rel_err(bad, good) > 1e-3


# ------------------------------------------------------------------------------- (e)


def test_swapping_q_and_k_rows_changes_logits(tmp_path, ckpt, weights):
    cfg = make_config(num_layers=3)
    tensors = make_tensors(cfg, seed=0)  # the same drafter as the `ckpt` fixture
    q, kv = NH * HD, NKV * HD
    for l in range(3):
        wt = tensors[f"layers.{l}.self_attn.qkv_proj.weight"].copy()
        wt[:kv], wt[q : q + kv] = tensors[f"layers.{l}.self_attn.qkv_proj.weight"][q : q + kv], wt[:kv].copy()
        tensors[f"layers.{l}.self_attn.qkv_proj.weight"] = wt
    swapped = load_drafter(write_checkpoint(tmp_path / "swap", cfg, tensors))
    hid = captured(12, seed=17)
    blk = block(18)
    assert rel_err(numpy_logits(swapped, hid, 0, blk), numpy_logits(weights, hid, 0, blk)) > 1e-3


# ------------------------------------------------------------------------------- loading / saving


def test_loader_variants(tmp_path, weights):
    cfg = make_config(num_layers=3)
    tensors = make_tensors(cfg, seed=0)
    hid = captured(10, seed=19)
    blk = block(20)
    base = numpy_logits(weights, hid, 0, blk)

    split = load_drafter(write_checkpoint(tmp_path / "split", cfg, tensors, prefix="model.", split_qkv=True))
    np.testing.assert_array_equal(numpy_logits(split, hid, 0, blk), base)

    bf = load_drafter(write_checkpoint(tmp_path / "bf16", cfg, tensors, dtype=torch.bfloat16))
    for k, v in tensors.items():  # exact widening of the stored bf16 values
        np.testing.assert_array_equal(bf[k], torch.from_numpy(v).to(torch.bfloat16).double().numpy())
    assert 0 < rel_err(numpy_logits(bf, hid, 0, blk), base) < 0.1

    # torch loader agrees on the split + prefixed layout
    m_split = LagunaDFlashDrafter.from_pretrained(tmp_path / "split")
    m_fused = LagunaDFlashDrafter.from_pretrained(tmp_path / "bf16", dtype="bf16")
    for k, v in m_split.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), tensors[k])
        assert torch.equal(m_fused.state_dict()[k], torch.from_numpy(tensors[k]).to(torch.bfloat16))

    # rejected layouts
    bad = dict(tensors)
    bad["layers.1.self_attn.q_proj.weight"] = tensors["layers.1.self_attn.qkv_proj.weight"][: NH * HD]
    write_checkpoint(tmp_path / "both", cfg, bad)
    partial = {k: v for k, v in tensors.items() if k != "norm.weight"}
    write_checkpoint(tmp_path / "missing", cfg, partial)
    write_checkpoint(tmp_path / "incomplete", cfg, tensors, split_qkv=True)
    st = tmp_path / "incomplete" / "model.safetensors"
    from safetensors.torch import load_file
    kept = {k: v for k, v in load_file(str(st)).items() if k != "layers.2.self_attn.v_proj.weight"}
    save_file(kept, str(st))
    for name in ("both", "missing", "incomplete"):
        with pytest.raises(ContractError):
            load_drafter(tmp_path / name)
        with pytest.raises(ContractError):
            LagunaDFlashDrafter.from_pretrained(tmp_path / name)


def test_torch_state_dict_is_the_hf_layout(tmp_path):
    cfg = make_config(num_layers=2)
    model = LagunaDFlashDrafter(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p))
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == expected_tensors(model.contract)

    model.save_pretrained(tmp_path / "f32", dtype="float32")
    saved_cfg = json.loads((tmp_path / "f32" / "config.json").read_text())
    assert saved_cfg["architectures"] == ["DFlashLagunaForCausalLM"]
    assert saved_cfg["dflash_config"] == cfg["dflash_config"]
    ref = load_drafter(tmp_path / "f32")
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(ref[k], v.double().numpy())

    model.save_pretrained(tmp_path / "bf16")  # bf16 by default
    back = LagunaDFlashDrafter.from_pretrained(tmp_path / "bf16")
    for k, v in model.state_dict().items():
        assert torch.equal(back.state_dict()[k], v.to(torch.bfloat16).float())


def test_torch_forward_is_trainable():
    cfg = make_config(num_layers=2)
    model = LagunaDFlashDrafter(cfg)
    embed, lm_head = (torch.from_numpy(m) for m in target_mats())
    ctx = torch.randn(2, 10, 3 * H)
    logits = model(ctx, torch.arange(10), embed[torch.tensor([[1, 5, 5, 5], [2, 5, 5, 5]])],
                   torch.arange(10, 14), lm_head)
    loss = torch.nn.functional.cross_entropy(logits[:, 1:].reshape(-1, VOCAB), torch.randint(VOCAB, (6,)))
    loss.backward()
    grads = {k: p.grad for k, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert grads["layers.0.self_attn.qkv_proj.weight"].abs().sum() > 0
    assert grads["aux_hidden_norms.2.weight"].abs().sum() > 0


# ------------------------------------------------------------------------------- conventions


def test_norm_and_rope_follow_transformers_laguna():
    """The reference's RMSNorm and RoPE are transformers' LagunaRMSNorm / rotate-half RoPE."""
    ml = pytest.importorskip("transformers.models.laguna.modeling_laguna")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3, HD)) * 4
    w = rng.uniform(0.3, 1.7, HD)
    norm = ml.LagunaRMSNorm(HD, eps=EPS).double()
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(w))
        # LagunaRMSNorm normalises in float32 whatever the input dtype, hence the f32-level tolerance
        np.testing.assert_allclose(rms_norm(x, w, EPS), norm(torch.from_numpy(x)).numpy(), rtol=1e-6, atol=1e-6)

    pos = np.array([0, 3, 17, 200, 4095])
    theta = 10000.0
    inv_freq = 1.0 / theta ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD)
    emb = torch.cat([torch.from_numpy(pos).double()[:, None] * inv_freq] * 2, -1)  # [T, hd]
    xt = torch.from_numpy(x).transpose(0, 1)  # [heads, T, hd]
    q_emb, _ = ml.apply_rotary_pos_emb(xt, xt, emb.cos(), emb.sin(), unsqueeze_dim=0)
    np.testing.assert_allclose(rope_neox(x, pos, theta), q_emb.transpose(0, 1).numpy(), rtol=1e-12, atol=1e-12)


def test_rope_parameters_resolution():
    """vLLM's precedence: swa_rope_parameters > rope_parameters > top-level rope_theta (torch agrees)."""
    from helpers.torch_drafter import parse_drafter_config
    from reference.dflash_numpy import DrafterConfig

    def theta(cfg):
        a, b = DrafterConfig.from_dict(cfg).rope_theta, parse_drafter_config(cfg).rope_theta
        assert a == b
        return a

    base = make_config()
    assert theta(base) == 10000.0
    flat = dict(base, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    assert theta(flat) == 500000.0
    nested = dict(base, rope_parameters={"full_attention": {"rope_theta": 1.0e6},
                                         "sliding_attention": {"rope_theta": 250000.0}})
    assert theta(nested) == 250000.0
    assert theta(dict(nested, swa_rope_parameters={"rope_theta": 20000.0})) == 20000.0
    bad = dict(base, rope_parameters={"rope_type": "yarn", "rope_theta": 1.0e4, "factor": 4.0})
    with pytest.raises(ContractError):
        DrafterConfig.from_dict(bad)
    with pytest.raises(ContractError):
        parse_drafter_config(bad)


def test_rope_parameters_of_full_attention_layers_ignore_the_swa_ones():
    from reference.dflash_numpy import DrafterConfig

    full = dict(make_config(), layer_types=["full_attention"] * 2,
                swa_rope_parameters={"rope_theta": 2e4, "partial_rotary_factor": 0.5},
                rope_parameters={"sliding_attention": {"rope_theta": 2.5e5}, "full_attention": {"rope_theta": 1e6}})
    c = DrafterConfig.from_dict(full)
    assert (c.rope_theta, c.rotary_dim, c.sliding_windows) == (1e6, None, [None, None])
    c = DrafterConfig.from_dict(dict(full, layer_types=["sliding_attention"] * 2))
    assert (c.rope_theta, c.rotary_dim, c.sliding_windows) == (2e4, HD // 2, [WINDOW, WINDOW])
    # a factor inside the parameters wins over the top-level one
    c = DrafterConfig.from_dict(dict(make_config(), partial_rotary_factor=0.25,
                                     rope_parameters={"rope_theta": 1e4, "partial_rotary_factor": 0.5}))
    assert c.rotary_dim == HD // 2
    with pytest.raises(ContractError):
        DrafterConfig.from_dict(dict(make_config(), layer_types=["sliding_attention", "full_attention"]))


def test_partial_rope_follows_transformers_laguna():
    """Partial rotary: the first int(f * head_dim) dims rotate (NeoX within them), the rest pass."""
    ml = pytest.importorskip("transformers.models.laguna.modeling_laguna")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 3, HD))
    pos = np.array([0, 3, 17, 200, 4095])
    theta, rot = 10000.0, HD // 2
    inv_freq = 1.0 / theta ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    emb = torch.cat([torch.from_numpy(pos).double()[:, None] * inv_freq] * 2, -1)  # [T, rot]
    xt = torch.from_numpy(x).transpose(0, 1)
    q_emb, _ = ml.apply_rotary_pos_emb(xt, xt, emb.cos(), emb.sin(), unsqueeze_dim=0)
    got = rope_neox(x, pos, theta, rot)
    np.testing.assert_allclose(got, q_emb.transpose(0, 1).numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got[..., rot:], x[..., rot:])
    assert np.abs(got - rope_neox(x, pos, theta)).max() > 1e-3


def _variant(tensors: dict, **config) -> DrafterWeights:
    return DrafterWeights.from_tensors(dict(make_config(), **config), tensors)


def test_per_element_gate_with_each_heads_row_repeated_is_the_per_head_gate():
    tensors = make_tensors(make_config(), seed=21)
    per_head = _variant(tensors)
    repeated = dict(tensors)
    for l in range(2):
        g = tensors[f"layers.{l}.self_attn.g_proj.weight"]
        repeated[f"layers.{l}.self_attn.g_proj.weight"] = np.repeat(g, HD, axis=0)  # head h -> rows h*HD..
    per_element = _variant(repeated, gating="per-element")
    hid, blk = captured(12, seed=22), block(23)
    np.testing.assert_allclose(numpy_logits(per_element, hid, 0, blk), numpy_logits(per_head, hid, 0, blk),
                               rtol=1e-12, atol=1e-12)
    # rows in another order are another gate: the layout (head-major, then dim) matters
    shuffled = dict(repeated)
    for l in range(2):
        g = tensors[f"layers.{l}.self_attn.g_proj.weight"]
        shuffled[f"layers.{l}.self_attn.g_proj.weight"] = np.tile(g, (HD, 1))
    assert rel_err(numpy_logits(_variant(shuffled, gating="per-element"), hid, 0, blk),
                   numpy_logits(per_head, hid, 0, blk)) > 1e-3


@pytest.mark.parametrize("disabled", [False, "disabled"])
def test_disabled_gate_is_a_per_head_gate_of_one(disabled):
    """softplus(0) = ln 2: a zero per-head g_proj with o_proj / ln 2 is exactly no gate."""
    tensors = make_tensors(make_config(), seed=24)
    ungated = {k: v for k, v in tensors.items() if not k.endswith("g_proj.weight")}
    scaled = dict(tensors)
    for l in range(2):
        scaled[f"layers.{l}.self_attn.g_proj.weight"] = np.zeros((NH, H), np.float32)
        scaled[f"layers.{l}.self_attn.o_proj.weight"] = tensors[f"layers.{l}.self_attn.o_proj.weight"] / np.log(2.0)
    hid, blk = captured(12, seed=25), block(26)
    want = numpy_logits(_variant(scaled), hid, 0, blk)
    np.testing.assert_allclose(numpy_logits(_variant(ungated, gating=disabled), hid, 0, blk), want,
                               rtol=1e-6, atol=1e-6)
    with pytest.raises(ContractError):  # a disabled gate has no g_proj
        _variant(tensors, gating=disabled)


def test_full_attention_sees_the_whole_context():
    tensors = make_tensors(make_config(), seed=27)
    full = _variant(tensors, layer_types=["full_attention"] * 2)
    hid, blk = captured(40, seed=28), block(29)
    got = numpy_logits(full, hid, 0, blk)
    np.testing.assert_allclose(got, numpy_logits(_variant(tensors).with_windows(10**6), hid, 0, blk),
                               rtol=1e-12, atol=1e-12)
    assert rel_err(got, numpy_logits(_variant(tensors), hid, 0, blk)) > 1e-3  # the window (8) matters here
