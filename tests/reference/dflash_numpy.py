"""Plain-numpy reference of the Laguna DFlash drafter forward (SPEC §3).

Written for clarity, not speed: loops over heads, no batching, no fused kernels.
Every computation runs in **float64** (weights, activations, RoPE tables, the softplus
gate and the softmax), whatever the checkpoint's storage dtype; a bf16 checkpoint is
widened exactly (bf16 -> f32 -> f64 is lossless). Logits come back as float64.

Conventions (checked against transformers' ``models/laguna/modeling_laguna.py``):

* RMSNorm: ``x * 1/sqrt(mean(x**2) + eps) * w`` — the weight multiplies directly,
  there is no ``(1 + w)`` offset (``LagunaRMSNorm`` returns ``weight * normed``).
* RoPE: NeoX / rotate-half over the first ``r`` dims of each head, ``r = int(head_dim *
  partial_rotary_factor)`` (all of them by default), ``inv_freq[k] = theta**(-2k/r)``,
  ``cos``/``sin`` tables are ``cat(freqs, freqs)``; dims ``r..head_dim`` pass through.
* QK norm is per head (over ``head_dim``), applied before RoPE; V is never normed.
* The output gate is ``softplus(g_proj(a))``, computed from the same normed layer input ``a``
  that feeds ``qkv_proj``: one scalar per query head (``per-head``, also ``gating: true``), one
  per element of the attention output (``per-element``), or none (``disabled``/``false``).
* GQA: query head ``h`` reads kv head ``h // (n_heads // n_kv_heads)``.

DFlash specifics (vLLM ``laguna_dflash.py`` semantics):

* context = ``hidden_norm(fc(concat_i aux_hidden_norms[i](h_i)))``; per drafter layer the
  context is normed by *that layer's own* ``input_layernorm`` before the k/v rows of
  ``qkv_proj``; ``k`` gets ``k_norm`` then RoPE at the context positions.
* the sliding window is per query over ``[context cache | block]``: a query at position
  ``p`` sees a key at position ``j`` iff ``j <= p`` and ``p - j < sliding_window``
  (this also makes the block causal). Full-attention layers drop the second condition.
* the config and the checkpoint's key set are read by the converter's contract
  (:mod:`laguna_dflash.convert.checkpoint`), so this reference cannot read a config differently from it.

Public API: :func:`load_drafter`, :class:`DrafterWeights`, :class:`DrafterReference`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from pathlib import Path
from typing import Sequence

import numpy as np

from laguna_dflash.convert.checkpoint import DrafterConfig as CheckpointConfig
from laguna_dflash.convert.checkpoint import parse_config, sanitize_keys

#: The dtype of every computation in this module.
DTYPE = np.float64

__all__ = [
    "DTYPE",
    "DrafterConfig",
    "DrafterWeights",
    "DrafterReference",
    "load_drafter",
    "read_safetensors",
    "rms_norm",
    "rope_neox",
    "sanitize_tensors",
]


# --------------------------------------------------------------------------------------
# safetensors reader (independent of the safetensors package, so bf16 needs no torch)
# --------------------------------------------------------------------------------------

_ST_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # widened by hand below
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
}


def _bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 is the top half of an IEEE float32: shift the 16 bits up and reinterpret."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Read every tensor of a ``.safetensors`` file; bf16 tensors come back as float32."""
    raw = Path(path).read_bytes()
    if len(raw) < 8:
        raise ValueError(f"{path}: not a safetensors file (too short)")
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_len].decode("utf-8"))
    data = memoryview(raw)[8 + header_len :]
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        st_dtype = info["dtype"]
        if st_dtype not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {st_dtype}")
        start, end = info["data_offsets"]
        shape = tuple(int(s) for s in info["shape"])
        arr = np.frombuffer(data[start:end], dtype=_ST_DTYPES[st_dtype]).reshape(shape)
        if st_dtype == "BF16":
            arr = _bf16_bits_to_f32(arr)
        out[name] = arr.copy()
    return out


# --------------------------------------------------------------------------------------
# config + weights
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    vocab_size: int
    rope_theta: float
    sliding_windows: list[int | None]  # None: a full-attention layer
    block_size: int
    mask_token_id: int
    target_layer_ids: list[int]
    num_target_layers: int
    gating: str = "per-head"
    rotary_dim: int | None = None  # None: every head dim
    contract: CheckpointConfig | None = None

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def n_aux(self) -> int:
        return len(self.target_layer_ids)

    @classmethod
    def from_dict(cls, cfg: dict) -> "DrafterConfig":
        """The config as the converter parses it (``laguna_dflash.convert.checkpoint``: SPEC §2, vLLM's semantics)."""
        c = parse_config(cfg, Path("config.json"))
        return cls(
            hidden_size=c.hidden_size,
            intermediate_size=c.intermediate_size,
            num_layers=c.num_hidden_layers,
            num_heads=c.num_attention_heads,
            num_kv_heads=c.num_key_value_heads,
            head_dim=c.head_dim,
            rms_norm_eps=c.rms_norm_eps,
            vocab_size=c.vocab_size,
            rope_theta=c.rope_theta,
            sliding_windows=[c.sliding_window] * c.num_hidden_layers,
            block_size=c.block_size,
            mask_token_id=c.mask_token_id,
            target_layer_ids=list(c.target_layer_ids),
            num_target_layers=c.num_target_layers,
            gating=c.gating,
            rotary_dim=c.rotary_dims,
            contract=c,
        )


def sanitize_tensors(raw: dict[str, np.ndarray], c: DrafterConfig) -> dict[str, np.ndarray]:
    """The canonical tensors by the converter's sanitising rules, split q/k/v stacked, as float64."""
    source = Path("model.safetensors")
    stored = sanitize_keys({k: v.shape for k, v in raw.items()}, c.contract, {k: source for k in raw}, source)
    return {name: np.concatenate([raw[k] for k in keys], axis=0).astype(DTYPE) for name, keys in stored.items()}


@dataclasses.dataclass
class DrafterWeights:
    """A sanitised drafter checkpoint: the parsed config, the raw config dict, float64 tensors."""

    config: DrafterConfig
    raw_config: dict
    tensors: dict[str, np.ndarray]

    def __getitem__(self, key: str) -> np.ndarray:
        return self.tensors[key]

    def with_windows(self, windows: int | Sequence[int]) -> "DrafterWeights":
        """A copy with other sliding windows (tests use this for a 'no window' baseline)."""
        if isinstance(windows, int):
            windows = [windows] * self.config.num_layers
        cfg = dataclasses.replace(self.config, sliding_windows=[int(w) for w in windows])
        return DrafterWeights(cfg, dict(self.raw_config), self.tensors)

    @classmethod
    def from_tensors(cls, raw_config: dict, tensors: dict[str, np.ndarray]) -> "DrafterWeights":
        cfg = DrafterConfig.from_dict(raw_config)
        return cls(cfg, raw_config, sanitize_tensors(tensors, cfg))


def load_drafter(checkpoint_dir: str | Path) -> DrafterWeights:
    """Read ``config.json`` + ``model.safetensors`` (or every ``*.safetensors`` shard) of a drafter."""
    d = Path(checkpoint_dir)
    raw_config = json.loads((d / "config.json").read_text())
    files = [d / "model.safetensors"] if (d / "model.safetensors").exists() else sorted(d.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors file in {d}")
    tensors: dict[str, np.ndarray] = {}
    for f in files:
        for k, v in read_safetensors(f).items():
            if k in tensors:
                raise ValueError(f"tensor {k!r} appears in more than one shard")
            tensors[k] = v
    return DrafterWeights.from_tensors(raw_config, tensors)


# --------------------------------------------------------------------------------------
# math helpers (all float64)
# --------------------------------------------------------------------------------------


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Laguna RMSNorm over the last axis: ``x / sqrt(mean(x^2) + eps) * w`` (no 1 + w offset)."""
    x = np.asarray(x, dtype=DTYPE)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_neox(x: np.ndarray, positions: np.ndarray, theta: float, rotary_dim: int | None = None) -> np.ndarray:
    """Rotate-half RoPE on the first ``rotary_dim`` dims (all by default); the rest pass through.

    ``x``: [T, heads, head_dim]; ``positions``: [T]. The frequencies are those of a head of
    ``rotary_dim`` dims (vLLM builds its rotary embedding with ``rotary_dim``, not ``head_dim``).
    """
    d = x.shape[-1] if rotary_dim is None else rotary_dim
    half = d // 2
    inv_freq = theta ** (-np.arange(0, d, 2, dtype=DTYPE) / d)  # [d/2]
    angles = np.asarray(positions, dtype=DTYPE)[:, None] * inv_freq[None, :]  # [T, d/2]
    cos = np.cos(angles)[:, None, :]  # [T, 1, d/2], broadcast over heads
    sin = np.sin(angles)[:, None, :]
    x1, x2, rest = x[..., :half], x[..., half:d], x[..., d:]
    # x*cat(cos,cos) + rotate_half(x)*cat(sin,sin), with rotate_half(x) = cat(-x2, x1)
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def silu(x: np.ndarray) -> np.ndarray:
    # x * sigmoid(x), with sigmoid written through tanh so it never overflows
    return x * 0.5 * (1.0 + np.tanh(0.5 * x))


def window_mask(q_pos: np.ndarray, k_pos: np.ndarray, window: int | None) -> np.ndarray:
    """[Lq, Lk] bool: query at p sees key at j iff j <= p and p - j < window (no window: j <= p)."""
    diff = np.asarray(q_pos)[:, None] - np.asarray(k_pos)[None, :]
    return (diff >= 0) & (diff < window) if window is not None else diff >= 0


def attention(
    q: np.ndarray,  # [L, n_heads, hd]
    k: np.ndarray,  # [S, n_kv, hd]
    v: np.ndarray,  # [S, n_kv, hd]
    allowed: np.ndarray,  # [L, S] bool
) -> np.ndarray:  # [L, n_heads, hd]
    n_heads, hd = q.shape[1], q.shape[2]
    n_kv = k.shape[1]
    group = n_heads // n_kv
    scale = 1.0 / math.sqrt(hd)
    out = np.zeros_like(q)
    for h in range(n_heads):
        kv = h // group
        scores = (q[:, h, :] @ k[:, kv, :].T) * scale  # [L, S]
        scores = np.where(allowed, scores, -np.inf)
        scores = scores - scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p = p / p.sum(axis=-1, keepdims=True)
        out[:, h, :] = p @ v[:, kv, :]
    return out


# --------------------------------------------------------------------------------------
# the drafter
# --------------------------------------------------------------------------------------


class DrafterReference:
    """Stateful numpy drafter: a per-layer context K/V cache plus a block pass.

    ``embed_tokens`` and ``lm_head`` are the *target's* ``[vocab, H]`` matrices.
    ``skip_aux_norms`` / ``skip_context_input_norm`` reproduce the two known porting bugs
    (for negative tests only).
    """

    def __init__(
        self,
        weights: DrafterWeights,
        embed_tokens: np.ndarray,
        lm_head: np.ndarray,
        *,
        skip_aux_norms: bool = False,
        skip_context_input_norm: bool = False,
    ) -> None:
        c = weights.config
        self.weights = weights
        self.config = c
        self.embed_tokens = np.asarray(embed_tokens, dtype=DTYPE)
        self.lm_head = np.asarray(lm_head, dtype=DTYPE)
        for name, m in (("embed_tokens", self.embed_tokens), ("lm_head", self.lm_head)):
            if m.ndim != 2 or m.shape[1] != c.hidden_size:
                raise ValueError(f"{name} must be [vocab, {c.hidden_size}], got {m.shape}")
            if m.shape[0] != c.vocab_size:
                raise ValueError(f"{name} has {m.shape[0]} rows, drafter vocab_size is {c.vocab_size}")
        self.skip_aux_norms = skip_aux_norms
        self.skip_context_input_norm = skip_context_input_norm
        self.reset()

    # ---- context cache ---------------------------------------------------------------

    def reset(self) -> None:
        """Forget every context position."""
        c = self.config
        self._ctx_k = [np.zeros((0, c.num_kv_heads, c.head_dim), DTYPE) for _ in range(c.num_layers)]
        self._ctx_v = [np.zeros((0, c.num_kv_heads, c.head_dim), DTYPE) for _ in range(c.num_layers)]
        self._ctx_pos = np.zeros((0,), dtype=np.int64)

    @property
    def n_context(self) -> int:
        return int(self._ctx_pos.shape[0])

    @property
    def context_positions(self) -> np.ndarray:
        return self._ctx_pos.copy()

    def context_kv(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """The cached (K after k_norm + RoPE, V) of one layer: [T, n_kv, hd] each."""
        return self._ctx_k[layer].copy(), self._ctx_v[layer].copy()

    def combine_hidden(self, hidden_by_layer: Sequence[np.ndarray]) -> np.ndarray:
        """``hidden_norm(fc(concat_i aux_hidden_norms[i](h_i))) -> [T, H]``.

        ``hidden_by_layer``: one [T, H] array per target layer id (``target_layer_ids`` order),
        or a single [T, n_aux*H] array holding them concatenated.
        """
        c, W = self.config, self.weights
        if isinstance(hidden_by_layer, np.ndarray) and hidden_by_layer.ndim == 2:
            # one [T, n_aux*H] array, layers concatenated in target_layer_ids order
            if hidden_by_layer.shape[1] != c.n_aux * c.hidden_size:
                raise ValueError(f"concatenated capture must be [T, {c.n_aux * c.hidden_size}]")
            hidden_by_layer = np.split(hidden_by_layer, c.n_aux, axis=1)
        if len(hidden_by_layer) != c.n_aux:
            raise ValueError(f"expected {c.n_aux} captured layers, got {len(hidden_by_layer)}")
        parts = []
        for i, h in enumerate(hidden_by_layer):
            h = np.asarray(h, dtype=DTYPE)
            if h.ndim != 2 or h.shape[1] != c.hidden_size:
                raise ValueError(f"captured layer {i} must be [T, {c.hidden_size}], got {h.shape}")
            if not self.skip_aux_norms:
                h = rms_norm(h, W[f"aux_hidden_norms.{i}.weight"], c.rms_norm_eps)
            parts.append(h)
        if len({p.shape[0] for p in parts}) != 1:
            raise ValueError("captured layers disagree on the number of rows")
        fused = np.concatenate(parts, axis=-1) @ W["fc.weight"].T
        return rms_norm(fused, W["hidden_norm.weight"], c.rms_norm_eps)

    def add_context(self, hidden_by_layer: Sequence[np.ndarray], positions: np.ndarray) -> None:
        """Project ``T`` new captured target rows into every layer's context K/V and append them."""
        c, W = self.config, self.weights
        positions = np.asarray(positions, dtype=np.int64).reshape(-1)
        ctx = self.combine_hidden(hidden_by_layer)  # [T, H]
        T = ctx.shape[0]
        if positions.shape[0] != T:
            raise ValueError(f"{T} context rows but {positions.shape[0]} positions")
        for l in range(c.num_layers):
            p = f"layers.{l}."
            x = ctx
            if not self.skip_context_input_norm:
                x = rms_norm(ctx, W[p + "input_layernorm.weight"], c.rms_norm_eps)
            w_kv = W[p + "self_attn.qkv_proj.weight"][c.q_size :]  # the q rows are never needed
            kv = x @ w_kv.T  # [T, 2 * kv_size]
            k = kv[:, : c.kv_size].reshape(T, c.num_kv_heads, c.head_dim)
            v = kv[:, c.kv_size :].reshape(T, c.num_kv_heads, c.head_dim)
            k = rms_norm(k, W[p + "self_attn.k_norm.weight"], c.rms_norm_eps)
            k = rope_neox(k, positions, c.rope_theta, c.rotary_dim)
            self._ctx_k[l] = np.concatenate([self._ctx_k[l], k], axis=0)
            self._ctx_v[l] = np.concatenate([self._ctx_v[l], v], axis=0)
        self._ctx_pos = np.concatenate([self._ctx_pos, positions])

    def truncate_context(self, n_keep: int) -> None:
        """Rollback: drop every cached context entry whose position is ``>= n_keep``.

        For a context that starts at position 0 and grows contiguously (the runtime's case)
        this is the same as keeping the first ``n_keep`` entries.
        """
        keep = self._ctx_pos < int(n_keep)
        for l in range(self.config.num_layers):
            self._ctx_k[l] = self._ctx_k[l][keep]
            self._ctx_v[l] = self._ctx_v[l][keep]
        self._ctx_pos = self._ctx_pos[keep]

    # ---- the block pass --------------------------------------------------------------

    def draft_hidden(self, block_tokens: Sequence[int], start_pos: int) -> np.ndarray:
        """The block's final hidden states after ``norm``: [L, H]."""
        c, W = self.config, self.weights
        tokens = np.asarray(list(block_tokens), dtype=np.int64)
        if tokens.ndim != 1 or tokens.size == 0:
            raise ValueError("block_tokens must be a non-empty list of ids")
        if tokens.min() < 0 or tokens.max() >= c.vocab_size:
            raise ValueError("block token id outside the vocabulary")
        L = tokens.shape[0]
        pos = int(start_pos) + np.arange(L, dtype=np.int64)
        x = self.embed_tokens[tokens].copy()  # [L, H], embedding scale 1.0
        eps = c.rms_norm_eps
        for l in range(c.num_layers):
            p = f"layers.{l}."
            a = rms_norm(x, W[p + "input_layernorm.weight"], eps)
            qkv = a @ W[p + "self_attn.qkv_proj.weight"].T
            q = qkv[:, : c.q_size].reshape(L, c.num_heads, c.head_dim)
            k = qkv[:, c.q_size : c.q_size + c.kv_size].reshape(L, c.num_kv_heads, c.head_dim)
            v = qkv[:, c.q_size + c.kv_size :].reshape(L, c.num_kv_heads, c.head_dim)
            q = rope_neox(rms_norm(q, W[p + "self_attn.q_norm.weight"], eps), pos, c.rope_theta, c.rotary_dim)
            k = rope_neox(rms_norm(k, W[p + "self_attn.k_norm.weight"], eps), pos, c.rope_theta, c.rotary_dim)

            keys = np.concatenate([self._ctx_k[l], k], axis=0)
            values = np.concatenate([self._ctx_v[l], v], axis=0)
            key_pos = np.concatenate([self._ctx_pos, pos])
            allowed = window_mask(pos, key_pos, c.sliding_windows[l])
            o = attention(q, keys, values, allowed)  # [L, n_heads, hd]

            if c.gating == "per-head":
                o = o * softplus(a @ W[p + "self_attn.g_proj.weight"].T)[:, :, None]  # [L, n_heads, 1]
            elif c.gating == "per-element":
                o = o * softplus(a @ W[p + "self_attn.g_proj.weight"].T).reshape(L, c.num_heads, c.head_dim)
            x = x + o.reshape(L, c.q_size) @ W[p + "self_attn.o_proj.weight"].T

            m = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
            mlp = silu(m @ W[p + "mlp.gate_proj.weight"].T) * (m @ W[p + "mlp.up_proj.weight"].T)
            x = x + mlp @ W[p + "mlp.down_proj.weight"].T
        return rms_norm(x, W["norm.weight"], eps)

    def draft_logits(self, block_tokens: Sequence[int], start_pos: int) -> np.ndarray:
        """Logits for every block row, row 0 included: [L, vocab] (the caller takes ``[1:]``)."""
        return self.draft_hidden(block_tokens, start_pos) @ self.lm_head.T
