"""The drafter's config contract (SPEC §2): a typed view of ``config.json`` and every rule it must obey.

    cfg = load_config(Path("Laguna-XS-2.1-DFlash"))      # parse + standalone rules
    check_pair(cfg, target)                               # rules that need the target
    expected_tensors(cfg)                                 # the exact HF key set and shapes

Every violation raises :class:`~convert.errors.ContractError`, whose message is one line:
``FILE: FIELD: expected X, found Y``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ContractError, UserError

if TYPE_CHECKING:  # pragma: no cover
    from .target import TargetInfo

MODEL_TYPE = "laguna"
ARCHITECTURE = "DFlashLagunaForCausalLM"
SLIDING = "sliding_attention"
GATING = "per-head"
BLOCK_SIZE_RANGE = (2, 512)
WINDOW_RANGE = (2, 1 << 20)
DEFAULT_CONTEXT_LENGTH = 262144


@dataclass(frozen=True)
class DrafterConfig:
    """A validated Laguna DFlash drafter config. Every layer is sliding-window, causal, per-head gated."""

    source: Path  # the config.json it came from (named in error messages)
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    vocab_size: int
    rope_theta: float
    max_position_embeddings: int
    sliding_window: int
    block_size: int
    mask_token_id: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    name_or_path: str | None = None

    @property
    def q_rows(self) -> int:
        """Rows of the query projection: ``num_attention_heads * head_dim``."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_rows(self) -> int:
        """Rows of the key (and of the value) projection: ``num_key_value_heads * head_dim``."""
        return self.num_key_value_heads * self.head_dim

    @property
    def qkv_rows(self) -> int:
        return self.q_rows + 2 * self.kv_rows

    @property
    def n_target_features(self) -> int:
        """Width of the captured-hidden-state input of ``fc``: ``len(target_layer_ids) * hidden``."""
        return len(self.target_layer_ids) * self.hidden_size

    @property
    def layer_types(self) -> tuple[str, ...]:
        return (SLIDING,) * self.num_hidden_layers

    def n_parameters(self) -> int:
        total = 0
        for shape in expected_tensors(self).values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total


# --------------------------------------------------------------------------- parsing


def _show(v: Any) -> str:
    """A found value as the user wrote it in JSON (short)."""
    if v is _MISSING:
        return "nothing (field absent)"
    try:
        text = json.dumps(v)
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= 120 else text[:117] + "..."


_MISSING = object()


class _Reader:
    """Typed field access on a JSON object; every failure is a ContractError naming the field."""

    def __init__(self, raw: Mapping[str, Any], source: Path, prefix: str = "") -> None:
        self.raw, self.source, self.prefix = raw, source, prefix

    def fail(self, field: str, expected: str, found: Any) -> ContractError:
        return ContractError(self.source, self.prefix + field, expected, _show(found))

    def get(self, field: str, default: Any = _MISSING) -> Any:
        return self.raw.get(field, default)

    def int(self, field: str, lo: int | None = 1, hi: int | None = None, default: Any = _MISSING) -> int:
        v = self.raw.get(field, default)
        ok = isinstance(v, int) and not isinstance(v, bool)
        ok = ok and (lo is None or v >= lo) and (hi is None or v <= hi)
        if not ok:
            if lo is not None and hi is not None:
                want = f"an integer in {lo}..{hi}"
            elif lo is not None:
                want = f"an integer >= {lo}"
            else:
                want = "an integer"
            raise self.fail(field, want, v)
        return v

    def float(self, field: str, default: Any = _MISSING) -> float:
        v = self.raw.get(field, default)
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
            raise self.fail(field, "a positive number", v)
        return float(v)

    def equal(self, field: str, want: Any) -> None:
        v = self.raw.get(field, _MISSING)
        if v != want or type(v) is not type(want):
            raise self.fail(field, _show(want), v)


def parse_config(raw: Mapping[str, Any], source: Path | str) -> DrafterConfig:
    """Check a drafter ``config.json`` (already parsed) against SPEC §2 and return its typed view.

    Only the rules that need no target are checked here; :func:`check_pair` does the rest.
    """
    source = Path(source)
    r = _Reader(raw, source)

    r.equal("model_type", MODEL_TYPE)
    archs = r.get("architectures")
    if not isinstance(archs, list) or ARCHITECTURE not in archs:
        raise r.fail("architectures", _show([ARCHITECTURE]), archs)

    hidden = r.int("hidden_size")
    inter = r.int("intermediate_size")
    n_layer = r.int("num_hidden_layers")
    n_head = r.int("num_attention_heads")
    n_kv = r.int("num_key_value_heads")
    if n_head % n_kv:
        raise r.fail("num_key_value_heads", f"a divisor of num_attention_heads ({n_head})", n_kv)
    if "head_dim" in raw and raw["head_dim"] is not None:
        head_dim = r.int("head_dim")
    elif hidden % n_head == 0:
        head_dim = hidden // n_head
    else:
        raise r.fail("head_dim", f"a value (hidden_size {hidden} is not a multiple of {n_head} heads)", _MISSING)
    eps = r.float("rms_norm_eps")
    vocab = r.int("vocab_size")
    draft_vocab = r.get("draft_vocab_size", vocab)
    if draft_vocab != vocab:
        raise r.fail("draft_vocab_size", f"{vocab} (= vocab_size)", draft_vocab)

    gating = r.get("gating")
    if gating != GATING:
        raise r.fail("gating", _show(GATING), gating)
    experts = r.get("num_experts", 0)
    if experts not in (0, None) or isinstance(experts, bool):
        raise r.fail("num_experts", "0 (the drafter is dense)", experts)
    bias = r.get("attention_bias", False)
    if bias is not False:
        raise r.fail("attention_bias", "false", bias)

    types = r.get("layer_types")
    if not isinstance(types, list) or len(types) != n_layer:
        raise r.fail("layer_types", f"a list of {n_layer} {_show(SLIDING)}", types)
    for i, t in enumerate(types):
        if t != SLIDING:
            raise r.fail(f"layer_types[{i}]", _show(SLIDING), t)

    window = r.int("sliding_window", *WINDOW_RANGE)
    windows = raw.get("sliding_windows")
    if windows is not None:
        if not isinstance(windows, list) or len(windows) != n_layer:
            raise r.fail("sliding_windows", f"a list of {n_layer} windows (or no field)", windows)
        lo, hi = WINDOW_RANGE
        for i, w in enumerate(windows):
            if isinstance(w, bool) or not isinstance(w, int) or not lo <= w <= hi:
                raise r.fail(f"sliding_windows[{i}]", f"an integer in {lo}..{hi}", w)
            if w != window:
                raise r.fail(f"sliding_windows[{i}]", f"{window} (= sliding_window; the GGUF has one window)", w)

    rope_theta = _rope_theta(r, raw)
    ctx_len = r.int("max_position_embeddings", default=DEFAULT_CONTEXT_LENGTH)

    dflash = r.get("dflash_config")
    if not isinstance(dflash, Mapping):
        raise r.fail("dflash_config",
                     "an object with block_size, mask_token_id, num_target_layers, target_layer_ids, causal",
                     dflash if dflash is not None else _MISSING)
    d = _Reader(dflash, source, "dflash_config.")
    block_size = d.int("block_size", *BLOCK_SIZE_RANGE)
    mask_id = d.int("mask_token_id", 0, vocab - 1)
    n_target = d.int("num_target_layers")
    ids = d.get("target_layer_ids")
    if not isinstance(ids, list) or not ids:
        raise d.fail("target_layer_ids", "a non-empty list of target layer ids", ids)
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n_target:
            raise d.fail(f"target_layer_ids[{i}]", f"a layer id in 0..{n_target - 1} (num_target_layers {n_target})", t)
        if i and t <= ids[i - 1]:
            raise d.fail("target_layer_ids", "strictly increasing ids", ids)
    causal = d.get("causal")
    if causal is not True:
        raise d.fail("causal", "true", causal)

    name = raw.get("_name_or_path")
    return DrafterConfig(
        source=source,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=n_layer,
        num_attention_heads=n_head,
        num_key_value_heads=n_kv,
        head_dim=head_dim,
        rms_norm_eps=eps,
        vocab_size=vocab,
        rope_theta=rope_theta,
        max_position_embeddings=ctx_len,
        sliding_window=window,
        block_size=block_size,
        mask_token_id=mask_id,
        num_target_layers=n_target,
        target_layer_ids=tuple(ids),
        name_or_path=name if isinstance(name, str) and name else None,
    )


def _rope_theta(r: _Reader, raw: Mapping[str, Any]) -> float:
    """Plain RoPE only: ``rope_theta``, or a ``rope_parameters`` / ``rope_scaling`` of type default."""
    params = raw.get("rope_parameters")
    if isinstance(params, Mapping) and SLIDING in params and isinstance(params[SLIDING], Mapping):
        params, field = params[SLIDING], f"rope_parameters.{SLIDING}"
    else:
        field = "rope_parameters"
    for name, block in ((field, params), ("rope_scaling", raw.get("rope_scaling"))):
        if block is None:
            continue
        if not isinstance(block, Mapping):
            raise r.fail(name, "an object (or no field)", block)
        kind = block.get("rope_type", block.get("type", "default"))
        if kind != "default":
            raise r.fail(f"{name}.rope_type", '"default" (plain RoPE)', kind)
        factor = block.get("partial_rotary_factor", 1.0)
        if factor != 1.0:
            raise r.fail(f"{name}.partial_rotary_factor", "1.0 (RoPE on every head dim)", factor)
    if "rope_theta" in raw:
        return r.float("rope_theta")
    if isinstance(params, Mapping) and "rope_theta" in params:
        return _Reader(params, r.source, field + ".").float("rope_theta")
    raise r.fail("rope_theta", "a positive number", _MISSING)


def load_config(path: Path | str) -> DrafterConfig:
    """Read and check ``config.json`` (``path`` is the file or the drafter directory)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UserError(f"{path}: not found (a drafter directory holds config.json and model.safetensors)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ContractError(path, "(top level)", "a JSON object", _show(raw))
    return parse_config(raw, path)


def check_pair(cfg: DrafterConfig, target: TargetInfo) -> None:
    """The rules of SPEC §2 that need the target: layer count, hidden size, vocabulary."""
    who = f"target {target.name}"
    if cfg.num_target_layers != target.n_layer:
        raise ContractError(cfg.source, "dflash_config.num_target_layers",
                            f"{target.n_layer} (the layer count of {who})", cfg.num_target_layers)
    if cfg.hidden_size != target.hidden_size:
        raise ContractError(cfg.source, "hidden_size", f"{target.hidden_size} (the hidden size of {who})",
                            cfg.hidden_size)
    if cfg.vocab_size != target.vocab_size:
        raise ContractError(cfg.source, "vocab_size", f"{target.vocab_size} (the vocabulary of {who})",
                            cfg.vocab_size)
    if not 0 <= cfg.mask_token_id < target.vocab_size:
        raise ContractError(cfg.source, "dflash_config.mask_token_id",
                            f"a token id in 0..{target.vocab_size - 1} ({who})", cfg.mask_token_id)


# --------------------------------------------------------------------------- weights


def expected_tensors(cfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """The exact key set of a sanitised checkpoint (no ``model.`` prefix, fused ``qkv_proj``), with shapes.

    Shapes are rows x cols as stored in safetensors; the order is the conversion order.
    """
    h, hd = cfg.hidden_size, cfg.head_dim
    out: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, cfg.n_target_features),
        "hidden_norm.weight": (h,),
    }
    for i in range(len(cfg.target_layer_ids)):
        out[f"aux_hidden_norms.{i}.weight"] = (h,)
    out["norm.weight"] = (h,)
    for n in range(cfg.num_hidden_layers):
        p = f"layers.{n}."
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "self_attn.qkv_proj.weight"] = (cfg.qkv_rows, h)
        out[p + "self_attn.q_norm.weight"] = (hd,)
        out[p + "self_attn.k_norm.weight"] = (hd,)
        out[p + "self_attn.g_proj.weight"] = (cfg.num_attention_heads, h)
        out[p + "self_attn.o_proj.weight"] = (h, cfg.q_rows)
        out[p + "post_attention_layernorm.weight"] = (h,)
        out[p + "mlp.gate_proj.weight"] = (cfg.intermediate_size, h)
        out[p + "mlp.up_proj.weight"] = (cfg.intermediate_size, h)
        out[p + "mlp.down_proj.weight"] = (h, cfg.intermediate_size)
    return out


def split_qkv_shapes(cfg: DrafterConfig) -> dict[str, tuple[int, int]]:
    """Shapes of the split form of one layer's ``qkv_proj`` (q, k, v order)."""
    h = cfg.hidden_size
    return {"q_proj": (cfg.q_rows, h), "k_proj": (cfg.kv_rows, h), "v_proj": (cfg.kv_rows, h)}
