"""PyTorch Laguna DFlash drafter: a vectorised, trainable implementation of SPEC §3.

This module is for training a drafter against a target's captured hidden states and for
cross-checking the runtime; the inference runtime itself never imports it (nor torch).

Parameters carry exactly the Hugging Face checkpoint names (``fc.weight``,
``layers.0.self_attn.qkv_proj.weight``, ...), so ``state_dict()`` *is* the Poolside layout and
:meth:`LagunaDFlashDrafter.save_pretrained` writes a directory that Poolside-style loaders,
``convert/`` and ``tests/reference/dflash_numpy.py`` all read.

The forward is stateless: it takes the whole context (captured target rows) at once and
recomputes its K/V, which is what training wants. The attention mask is built from
positions: a query at position ``p`` sees a key at position ``j`` (context or block) iff
``j <= p`` and ``p - j < sliding_window`` (per query, per layer), which also makes the block
causal. When training on random anchors, pass ``context_mask`` to hide context rows at or
after the block's first position (the runtime never has those).

Numerics: RMSNorm and the softplus gate compute in float32 (float64 when the module runs in
float64) and RoPE tables are computed in float64 then cast, so a float64 module matches the
float64 numpy reference to rounding.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

try:
    import torch
    import torch.nn.functional as F
    from torch import Tensor, nn
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "runtime.torch_drafter needs PyTorch (pip install 'laguna-dflash[test]'); "
        "the inference runtime does not import this module"
    ) from exc

__all__ = [
    "LagunaDFlashDrafter",
    "RMSNorm",
    "build_window_mask",
    "expected_state_shapes",
    "parse_drafter_config",
    "sanitize_state_dict",
]

_DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "f16": torch.float16,
    "float16": torch.float16,
    "f32": torch.float32,
    "float32": torch.float32,
    "f64": torch.float64,
    "float64": torch.float64,
}


def _as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}") from None


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype for norms / gate: f32, or f64 when the module itself is f64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# --------------------------------------------------------------------------------------
# config
# --------------------------------------------------------------------------------------


def parse_drafter_config(cfg: dict) -> dict:
    """Validate the fields the forward depends on and return them resolved (plain ints/floats)."""
    n_layers = int(cfg["num_hidden_layers"])
    dfl = cfg.get("dflash_config") or {}
    ids = [int(t) for t in dfl.get("target_layer_ids", [])]
    if not ids:
        raise ValueError("dflash_config.target_layer_ids must not be empty")
    if any(b <= a for a, b in zip(ids, ids[1:])):
        raise ValueError(f"dflash_config.target_layer_ids must be strictly increasing, got {ids}")
    n_target = dfl.get("num_target_layers")
    if n_target is not None and max(ids) >= int(n_target):
        raise ValueError(f"dflash_config.target_layer_ids {ids} must be < num_target_layers {n_target}")
    if dfl.get("causal", True) is not True:
        raise ValueError("dflash_config.causal must be true")
    gating = cfg.get("gating", "per-head")
    if not (gating is True or gating == "per-head"):
        raise ValueError(f"gating must be 'per-head', got {gating!r}")
    if cfg.get("attention_bias", False):
        raise ValueError("attention_bias must be false")
    if int(cfg.get("num_experts", 0) or 0) != 0:
        raise ValueError("num_experts must be 0")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act must be 'silu', got {cfg.get('hidden_act')!r}")
    layer_types = cfg.get("layer_types") or ["sliding_attention"] * n_layers
    if len(layer_types) != n_layers or any(t != "sliding_attention" for t in layer_types):
        raise ValueError(f"layer_types must be ['sliding_attention'] * {n_layers}, got {layer_types!r}")
    windows = cfg.get("sliding_windows")
    if windows is None:
        windows = [int(cfg["sliding_window"])] * n_layers
    windows = [int(w) for w in windows]
    if len(windows) != n_layers:
        raise ValueError(f"sliding_windows has {len(windows)} entries for {n_layers} layers")
    if any(w < 1 for w in windows):
        raise ValueError(f"sliding_windows must be positive, got {windows}")
    vocab = int(cfg["vocab_size"])
    dvs = cfg.get("draft_vocab_size")
    if dvs is not None and int(dvs) != vocab:
        raise ValueError(f"draft_vocab_size {dvs} must equal vocab_size {vocab}")
    # sliding-layer RoPE, vLLM's precedence: swa_rope_parameters > rope_parameters (flat or
    # keyed by layer type) > top-level rope_theta / partial_rotary_factor
    rope = cfg.get("swa_rope_parameters")
    if rope is None:
        rope = cfg.get("rope_parameters") or {}
        if any(isinstance(v, dict) for v in rope.values()):
            rope = rope.get("sliding_attention") or rope.get("full_attention") or {}
    theta = rope.get("rope_theta", cfg.get("rope_theta"))
    if theta is None:
        raise ValueError("rope_theta is missing")
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope_type must be 'default', got {rope.get('rope_type')!r}")
    if float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))) != 1.0:
        raise ValueError("partial_rotary_factor must be 1.0: the drafter ropes all head dims")
    heads, kv_heads = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
    if heads % kv_heads:
        raise ValueError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    head_dim = int(cfg["head_dim"])
    if head_dim % 2:
        raise ValueError("head_dim must be even for rotate-half RoPE")
    return dict(
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=n_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        eps=float(cfg["rms_norm_eps"]),
        vocab_size=vocab,
        rope_theta=float(theta),
        sliding_windows=windows,
        target_layer_ids=ids,
        block_size=int(dfl.get("block_size", 16)),
        mask_token_id=int(dfl.get("mask_token_id", 0)),
    )


def expected_state_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """The HF key set of a drafter checkpoint with each tensor's shape."""
    p = parse_drafter_config(cfg)
    H, I, hd = p["hidden_size"], p["intermediate_size"], p["head_dim"]
    q, kv = p["num_heads"] * hd, p["num_kv_heads"] * hd
    n_aux = len(p["target_layer_ids"])
    out: dict[str, tuple[int, ...]] = {"fc.weight": (H, n_aux * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(n_aux):
        out[f"aux_hidden_norms.{i}.weight"] = (H,)
    for l in range(p["num_layers"]):
        b = f"layers.{l}."
        out.update(
            {
                b + "input_layernorm.weight": (H,),
                b + "post_attention_layernorm.weight": (H,),
                b + "self_attn.qkv_proj.weight": (q + 2 * kv, H),
                b + "self_attn.o_proj.weight": (H, q),
                b + "self_attn.g_proj.weight": (p["num_heads"], H),
                b + "self_attn.q_norm.weight": (hd,),
                b + "self_attn.k_norm.weight": (hd,),
                b + "mlp.gate_proj.weight": (I, H),
                b + "mlp.up_proj.weight": (I, H),
                b + "mlp.down_proj.weight": (H, I),
            }
        )
    return out


def sanitize_state_dict(state: dict[str, Tensor], cfg: dict) -> dict[str, Tensor]:
    """Strip ``model.``, fuse split q/k/v (q, k, v row order), check the exact key set and shapes."""
    out: dict[str, Tensor] = {}
    for name, t in state.items():
        key = name.removeprefix("model.")
        if key in out:
            raise ValueError(f"tensor {key!r} is present both with and without the 'model.' prefix")
        out[key] = t
    n_layers = int(cfg["num_hidden_layers"])
    for l in range(n_layers):
        b = f"layers.{l}.self_attn."
        names = [f"{b}{x}_proj.weight" for x in "qkv"]
        have = [n in out for n in names]
        if not any(have):
            continue
        if b + "qkv_proj.weight" in out:
            raise ValueError(f"layer {l}: both fused qkv_proj and split q/k/v projections present")
        if not all(have):
            missing = [n for n, h in zip(names, have) if not h]
            raise ValueError(f"layer {l}: incomplete split q/k/v set (missing {missing})")
        parts = [out.pop(n) for n in names]
        if len({tuple(t.shape[1:]) for t in parts}) != 1:
            raise ValueError(f"layer {l}: split q/k/v projections disagree past axis 0")
        out[b + "qkv_proj.weight"] = torch.cat(parts, dim=0)
    shapes = expected_state_shapes(cfg)
    missing, extra = sorted(set(shapes) - set(out)), sorted(set(out) - set(shapes))
    if missing or extra:
        raise ValueError(f"drafter key set mismatch: missing={missing} unexpected={extra}")
    for k, s in shapes.items():
        if tuple(out[k].shape) != s:
            raise ValueError(f"{k}: shape {tuple(out[k].shape)} does not match the config's {s}")
    return out


# --------------------------------------------------------------------------------------
# building blocks
# --------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Laguna RMSNorm: ``weight * (x / sqrt(mean(x^2) + eps))``, no ``1 + weight`` offset."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        xf = x.to(_acc_dtype(x.dtype))
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rope(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """NeoX RoPE on all dims. ``x``: [B, S, heads, hd]; ``positions``: [B, S] integer."""
    hd = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64, device=x.device) / hd)
    angles = positions.to(torch.float64)[..., None] * inv_freq  # [B, S, hd/2]
    emb = torch.cat((angles, angles), dim=-1)[:, :, None, :]  # [B, S, 1, hd]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    return x * cos + _rotate_half(x) * sin


def build_window_mask(
    query_positions: Tensor, key_positions: Tensor, window: int, key_valid: Tensor | None = None
) -> Tensor:
    """Bool [B, Lq, Lk], True where the query may attend: ``j <= p`` and ``p - j < window``."""
    diff = query_positions[:, :, None] - key_positions[:, None, :]
    mask = (diff >= 0) & (diff < window)
    if key_valid is not None:
        mask = mask & key_valid[:, None, :]
    return mask


class DFlashAttention(nn.Module):
    def __init__(self, p: dict) -> None:
        super().__init__()
        H, hd = p["hidden_size"], p["head_dim"]
        self.num_heads, self.num_kv_heads, self.head_dim = p["num_heads"], p["num_kv_heads"], hd
        self.q_size, self.kv_size = self.num_heads * hd, self.num_kv_heads * hd
        self.rope_theta = p["rope_theta"]
        self.qkv_proj = nn.Linear(H, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, H, bias=False)
        self.g_proj = nn.Linear(H, self.num_heads, bias=False)
        self.q_norm = RMSNorm(hd, p["eps"])
        self.k_norm = RMSNorm(hd, p["eps"])

    def context_kv(self, c: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """K/V of the (already input-normed) context ``c`` [B, T, H]: each [B, T, n_kv, hd]."""
        B, T, _ = c.shape
        kv = F.linear(c, self.qkv_proj.weight[self.q_size :])  # q rows are not needed
        k, v = kv.split([self.kv_size, self.kv_size], dim=-1)
        k = self.k_norm(k.view(B, T, self.num_kv_heads, self.head_dim))
        return _rope(k, positions, self.rope_theta), v.view(B, T, self.num_kv_heads, self.head_dim)

    def forward(self, a: Tensor, positions: Tensor, ctx_k: Tensor, ctx_v: Tensor, mask: Tensor) -> Tensor:
        B, L, _ = a.shape
        q, k, v = self.qkv_proj(a).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = _rope(self.q_norm(q.view(B, L, self.num_heads, self.head_dim)), positions, self.rope_theta)
        k = _rope(self.k_norm(k.view(B, L, self.num_kv_heads, self.head_dim)), positions, self.rope_theta)
        v = v.view(B, L, self.num_kv_heads, self.head_dim)

        keys = torch.cat((ctx_k, k), dim=1).transpose(1, 2)  # [B, n_kv, T+L, hd]
        values = torch.cat((ctx_v, v), dim=1).transpose(1, 2)
        group = self.num_heads // self.num_kv_heads
        keys = keys.repeat_interleave(group, dim=1)  # head h reads kv head h // group
        values = values.repeat_interleave(group, dim=1)
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=mask[:, None], scale=1.0 / math.sqrt(self.head_dim)
        )  # [B, heads, L, hd]
        o = o.transpose(1, 2)  # [B, L, heads, hd]

        gate = F.softplus(self.g_proj(a).to(_acc_dtype(a.dtype))).to(o.dtype)  # [B, L, heads]
        o = (o * gate[..., None]).reshape(B, L, self.q_size)
        return self.o_proj(o)


class DFlashMLP(nn.Module):
    def __init__(self, p: dict) -> None:
        super().__init__()
        H, I = p["hidden_size"], p["intermediate_size"]
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, p: dict, window: int) -> None:
        super().__init__()
        self.window = window
        self.input_layernorm = RMSNorm(p["hidden_size"], p["eps"])
        self.post_attention_layernorm = RMSNorm(p["hidden_size"], p["eps"])
        self.self_attn = DFlashAttention(p)
        self.mlp = DFlashMLP(p)

    def forward(self, x: Tensor, positions: Tensor, ctx: Tensor, ctx_positions: Tensor, mask: Tensor) -> Tensor:
        # the context goes through this layer's own input_layernorm before its K/V projection
        ctx_k, ctx_v = self.self_attn.context_kv(self.input_layernorm(ctx), ctx_positions)
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


# --------------------------------------------------------------------------------------
# the model
# --------------------------------------------------------------------------------------


def _positions(pos: Tensor | Sequence[int], batch: int, length: int, device: torch.device) -> Tensor:
    pos = torch.as_tensor(pos, dtype=torch.long, device=device)
    if pos.dim() == 1:
        pos = pos[None].expand(batch, -1)
    if tuple(pos.shape) != (batch, length):
        raise ValueError(f"positions must be [{length}] or [{batch}, {length}], got {tuple(pos.shape)}")
    return pos


class LagunaDFlashDrafter(nn.Module):
    """The Laguna DFlash drafter (``DFlashLagunaForCausalLM``) with HF parameter names."""

    def __init__(self, config: dict) -> None:
        super().__init__()
        self.config = json.loads(json.dumps(config))  # private deep copy, JSON-serialisable
        p = parse_drafter_config(self.config)
        self.params = p
        H, n_aux = p["hidden_size"], len(p["target_layer_ids"])
        self.fc = nn.Linear(n_aux * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, p["eps"])
        self.aux_hidden_norms = nn.ModuleList(RMSNorm(H, p["eps"]) for _ in range(n_aux))
        self.layers = nn.ModuleList(DFlashDecoderLayer(p, w) for w in p["sliding_windows"])
        self.norm = RMSNorm(H, p["eps"])
        self.reset_parameters(float(self.config.get("initializer_range", 0.02)))

    # ---- init / io -------------------------------------------------------------------

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, generator: torch.Generator | None = None) -> None:
        """Matrices ~ N(0, std), every norm weight = 1."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                m.weight.normal_(0.0, std, generator=generator)
            elif isinstance(m, RMSNorm):
                m.weight.fill_(1.0)

    @property
    def hidden_size(self) -> int:
        return self.params["hidden_size"]

    @property
    def n_aux(self) -> int:
        return len(self.params["target_layer_ids"])

    def save_pretrained(self, directory: str | Path, dtype: str | torch.dtype = "bfloat16") -> Path:
        """Write ``config.json`` + ``model.safetensors`` (HF / Poolside layout) in ``dtype``."""
        from safetensors.torch import save_file

        dt = _as_dtype(dtype)
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        cfg = dict(self.config)
        cfg["torch_dtype"] = str(dt).removeprefix("torch.")
        (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        state = {k: v.detach().to("cpu", dt).contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})
        return d

    @classmethod
    def from_pretrained(
        cls, directory: str | Path, dtype: str | torch.dtype = torch.float32, device: str | torch.device = "cpu"
    ) -> "LagunaDFlashDrafter":
        """Load a drafter directory (``model.`` prefix and split q/k/v tolerated)."""
        from safetensors.torch import load_file

        d = Path(directory)
        config = json.loads((d / "config.json").read_text())
        files = [d / "model.safetensors"] if (d / "model.safetensors").exists() else sorted(d.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no .safetensors file in {d}")
        state: dict[str, Tensor] = {}
        for f in files:
            for k, v in load_file(str(f)).items():
                if k in state:
                    raise ValueError(f"tensor {k!r} appears in more than one shard")
                state[k] = v
        state = sanitize_state_dict(state, config)
        model = cls(config)
        dt = _as_dtype(dtype)
        model.load_state_dict({k: v.to(dt) for k, v in state.items()}, strict=True)
        return model.to(device=device, dtype=dt)

    # ---- forward ---------------------------------------------------------------------

    def combine_hidden(self, context_hidden: Tensor | Sequence[Tensor]) -> Tensor:
        """``hidden_norm(fc(concat_i aux_hidden_norms[i](h_i)))``: [B, T, n_aux*H] or list -> [B, T, H]."""
        if isinstance(context_hidden, (list, tuple)):
            parts = list(context_hidden)
            if len(parts) != self.n_aux:
                raise ValueError(f"expected {self.n_aux} captured layers, got {len(parts)}")
        else:
            if context_hidden.shape[-1] != self.n_aux * self.hidden_size:
                raise ValueError(
                    f"context_hidden last dim {context_hidden.shape[-1]} != {self.n_aux} * {self.hidden_size}"
                )
            parts = list(context_hidden.split(self.hidden_size, dim=-1))
        dtype = self.fc.weight.dtype
        normed = [norm(h.to(dtype)) for norm, h in zip(self.aux_hidden_norms, parts)]
        return self.hidden_norm(self.fc(torch.cat(normed, dim=-1)))

    def forward_hidden(
        self,
        context_hidden: Tensor | Sequence[Tensor],
        context_positions: Tensor | Sequence[int],
        block_embeds: Tensor,
        block_positions: Tensor | Sequence[int],
        context_mask: Tensor | None = None,
    ) -> Tensor:
        """The block's hidden states after the final ``norm``: [B, L, H]."""
        dtype = self.fc.weight.dtype
        x = block_embeds.to(dtype)
        B, L, _ = x.shape
        ctx = self.combine_hidden(context_hidden)
        if ctx.shape[0] != B:
            raise ValueError(f"context batch {ctx.shape[0]} != block batch {B}")
        T = ctx.shape[1]
        ctx_pos = _positions(context_positions, B, T, x.device)
        blk_pos = _positions(block_positions, B, L, x.device)
        key_pos = torch.cat((ctx_pos, blk_pos), dim=1)
        key_valid = None
        if context_mask is not None:
            cm = torch.as_tensor(context_mask, dtype=torch.bool, device=x.device)
            if cm.dim() == 1:
                cm = cm[None].expand(B, -1)
            key_valid = torch.cat((cm, torch.ones(B, L, dtype=torch.bool, device=x.device)), dim=1)
        masks: dict[int, Tensor] = {}
        for layer in self.layers:
            if layer.window not in masks:
                masks[layer.window] = build_window_mask(blk_pos, key_pos, layer.window, key_valid)
            x = layer(x, blk_pos, ctx, ctx_pos, masks[layer.window])
        return self.norm(x)

    def forward(
        self,
        context_hidden: Tensor | Sequence[Tensor],
        context_positions: Tensor | Sequence[int],
        block_embeds: Tensor,
        block_positions: Tensor | Sequence[int],
        lm_head: Tensor,
        context_mask: Tensor | None = None,
    ) -> Tensor:
        """Logits for every block row (row 0 re-predicts the bonus): [B, L, vocab].

        ``context_hidden``: [B, T, n_aux*H] (captured layers concatenated in
        ``target_layer_ids`` order) or a list of n_aux [B, T, H]; ``context_positions``: [T] or
        [B, T]; ``block_embeds``: [B, L, H] (the target's embedding of ``[bonus, MASK, ...]``);
        ``block_positions``: [L] or [B, L]; ``lm_head``: the target's [vocab, H];
        ``context_mask``: optional bool [B, T] (or [T]), False hides a context row (padding,
        or rows at/after the block in anchor-based training).
        """
        h = self.forward_hidden(context_hidden, context_positions, block_embeds, block_positions, context_mask)
        return F.linear(h, lm_head.to(h.dtype))
