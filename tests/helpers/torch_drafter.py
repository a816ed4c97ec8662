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
        "training.torch_drafter needs PyTorch (pip install 'laguna-dflash[test]'); "
        "laguna-run does not import this module"
    ) from exc

from laguna_dflash.convert.checkpoint import DrafterConfig, expected_tensors, parse_config, sanitize_keys
from laguna_dflash.convert.errors import ContractError

__all__ = [
    "LagunaDFlashDrafter",
    "RMSNorm",
    "build_window_mask",
    "expected_tensors",
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
# config and checkpoint: the contract's (laguna_dflash.convert.checkpoint), not a copy of it
# --------------------------------------------------------------------------------------


def parse_drafter_config(cfg: dict, source: str | Path = "config.json") -> DrafterConfig:
    """The drafter config as the converter reads it (every rule of SPEC §2, vLLM's semantics)."""
    return parse_config(cfg, Path(source))


def sanitize_state_dict(state: dict[str, Tensor], cfg: DrafterConfig) -> dict[str, Tensor]:
    """The canonical state dict (the converter's sanitising rules): split q/k/v stacked by rows."""
    stored = sanitize_keys({k: tuple(v.shape) for k, v in state.items()}, cfg,
                           {k: cfg.source for k in state}, cfg.source)
    return {name: state[keys[0]] if len(keys) == 1 else torch.cat([state[k] for k in keys], dim=0)
            for name, keys in stored.items()}


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


def _rope(x: Tensor, positions: Tensor, theta: float, rotary_dims: int | None = None) -> Tensor:
    """NeoX RoPE on the first ``rotary_dims`` dims of each head (all when None); the rest pass through.

    ``x``: [B, S, heads, hd]; ``positions``: [B, S] integer.
    """
    rot = x.shape[-1] if rotary_dims is None else rotary_dims
    inv_freq = theta ** (-torch.arange(0, rot, 2, dtype=torch.float64, device=x.device) / rot)
    angles = positions.to(torch.float64)[..., None] * inv_freq  # [B, S, rot/2]
    emb = torch.cat((angles, angles), dim=-1)[:, :, None, :]  # [B, S, 1, rot]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    head, rest = x[..., :rot], x[..., rot:]
    return torch.cat((head * cos + _rotate_half(head) * sin, rest), dim=-1)


def build_window_mask(
    query_positions: Tensor, key_positions: Tensor, window: int | None, key_valid: Tensor | None = None
) -> Tensor:
    """Bool [B, Lq, Lk], True where the query may attend: ``j <= p`` and ``p - j < window`` (no window: None)."""
    diff = query_positions[:, :, None] - key_positions[:, None, :]
    mask = diff >= 0
    if window is not None:
        mask = mask & (diff < window)
    if key_valid is not None:
        mask = mask & key_valid[:, None, :]
    return mask


class DFlashAttention(nn.Module):
    def __init__(self, c: DrafterConfig) -> None:
        super().__init__()
        H, hd = c.hidden_size, c.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, hd
        self.q_size, self.kv_size = c.q_rows, c.kv_rows
        self.rope_theta, self.rotary_dims = c.rope_theta, c.rotary_dims
        self.qkv_proj = nn.Linear(H, c.qkv_rows, bias=False)
        self.o_proj = nn.Linear(self.q_size, H, bias=False)
        # one factor per head, or per element of the attention output; no module when disabled
        self.g_proj = nn.Linear(H, c.gate_rows, bias=False) if c.gate_rows else None
        self.q_norm = RMSNorm(hd, c.rms_norm_eps)
        self.k_norm = RMSNorm(hd, c.rms_norm_eps)

    def context_kv(self, c: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """K/V of the (already input-normed) context ``c`` [B, T, H]: each [B, T, n_kv, hd]."""
        B, T, _ = c.shape
        kv = F.linear(c, self.qkv_proj.weight[self.q_size :])  # q rows are not needed
        k, v = kv.split([self.kv_size, self.kv_size], dim=-1)
        k = self.k_norm(k.view(B, T, self.num_kv_heads, self.head_dim))
        return _rope(k, positions, self.rope_theta, self.rotary_dims), v.view(B, T, self.num_kv_heads, self.head_dim)

    def forward(self, a: Tensor, positions: Tensor, ctx_k: Tensor, ctx_v: Tensor, mask: Tensor) -> Tensor:
        B, L, _ = a.shape
        q, k, v = self.qkv_proj(a).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = _rope(self.q_norm(q.view(B, L, self.num_heads, self.head_dim)), positions, self.rope_theta,
                  self.rotary_dims)
        k = _rope(self.k_norm(k.view(B, L, self.num_kv_heads, self.head_dim)), positions, self.rope_theta,
                  self.rotary_dims)
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

        if self.g_proj is not None:
            gate = F.softplus(self.g_proj(a).to(_acc_dtype(a.dtype))).to(o.dtype)  # [B, L, rows]
            # per head: [B, L, heads, 1]; per element: [B, L, heads, hd] (head-major rows)
            o = o * gate.view(B, L, self.num_heads, -1)
        return self.o_proj(o.reshape(B, L, self.q_size))


class DFlashMLP(nn.Module):
    def __init__(self, c: DrafterConfig) -> None:
        super().__init__()
        H, I = c.hidden_size, c.intermediate_size
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, c: DrafterConfig) -> None:
        super().__init__()
        self.window = c.sliding_window  # None: full attention
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = DFlashAttention(c)
        self.mlp = DFlashMLP(c)

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

    def __init__(self, config: dict, source: str | Path = "config.json") -> None:
        super().__init__()
        self.config = json.loads(json.dumps(config))  # private deep copy, JSON-serialisable
        c = self.contract = parse_drafter_config(self.config, source)
        H, n_aux, eps = c.hidden_size, len(c.target_layer_ids), c.rms_norm_eps
        self.fc = nn.Linear(c.n_target_features, H, bias=False)
        self.hidden_norm = RMSNorm(H, eps)
        self.aux_hidden_norms = nn.ModuleList(RMSNorm(H, eps) for _ in range(n_aux))
        self.layers = nn.ModuleList(DFlashDecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(H, eps)
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
        return self.contract.hidden_size

    @property
    def n_aux(self) -> int:
        return len(self.contract.target_layer_ids)

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
                    raise ContractError(f, k, "each tensor in one shard", "a tensor in more than one shard")
                state[k] = v
        model = cls(config, d / "config.json")
        state = sanitize_state_dict(state, model.contract)
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
