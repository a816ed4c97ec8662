"""The drafter's config contract (SPEC §2): a typed view of ``config.json`` and every rule it must obey.

    cfg = load_config(Path("Laguna-XS-2.1-DFlash"))      # parse + standalone rules
    check_pair(cfg, target)                               # rules that need the target
    expected_tensors(cfg)                                 # the exact HF key set and shapes

Every violation raises :class:`~convert.errors.ContractError`, whose message is one line:
``FILE: FIELD: expected X, found Y``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .gguf import keys as K
from .errors import ContractError, UserError

if TYPE_CHECKING:  # pragma: no cover
    from .target import TargetInfo

MODEL_TYPE = "laguna"
ARCHITECTURE = "DFlashLagunaForCausalLM"
SLIDING = "sliding_attention"
FULL = "full_attention"
LAYER_TYPES = (SLIDING, FULL)
#: The MLP's activation (SiLU-gated); absent means this.
HIDDEN_ACT = "silu"
#: ``gating`` as vLLM accepts it -> the mode it means (``True`` and an absent field: per-head).
GATING_ALIASES: tuple[tuple[Any, str], ...] = (
    (True, K.GATING_PER_HEAD), (K.GATING_PER_HEAD, K.GATING_PER_HEAD),
    (K.GATING_PER_ELEMENT, K.GATING_PER_ELEMENT),
    (False, K.GATING_DISABLED), (K.GATING_DISABLED, K.GATING_DISABLED),
)
BLOCK_SIZE_RANGE = (2, 512)
WINDOW_RANGE = (2, 1 << 20)
#: llama.cpp's LLAMA_MAX_LAYERS: a drafter with more layers cannot load.
MAX_LAYERS = 512
#: 8x the published drafters' 128; llama.cpp's loader refuses more (patch 0003).
HEAD_DIM_RANGE = (2, 1024)
#: ik_llama.cpp keeps the captured layer ids in an array of 8.
IK_MAX_TARGET_LAYERS = 8
#: What a GGUF uint32 key holds.
U32_MAX = (1 << 32) - 1
DEFAULT_CONTEXT_LENGTH = 262144


@dataclass(frozen=True)
class DrafterConfig:
    """A validated Laguna DFlash drafter config: causal, every layer of one type (sliding or full).

    ``sliding_window`` is None for full attention; ``rotary_dims`` is None when RoPE rotates
    every head dim (else the first ``rotary_dims`` of each head, NeoX pairing within them).
    """

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
    gating: str = K.GATING_DEFAULT
    rotary_dims: int | None = None

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
        return (SLIDING if self.sliding_window is not None else FULL,) * self.num_hidden_layers

    @property
    def rope_dimension_count(self) -> int:
        return self.head_dim if self.rotary_dims is None else self.rotary_dims

    @property
    def gate_rows(self) -> int:
        """Rows of ``g_proj``: one per head, one per attention output element, or none."""
        return {K.GATING_PER_HEAD: self.num_attention_heads, K.GATING_PER_ELEMENT: self.q_rows,
                K.GATING_DISABLED: 0}[self.gating]

    def runtimes(self) -> tuple[str, ...]:
        """The runtimes that load a drafter of this config.

        ik_llama.cpp's loader wants a per-head ``attn_gate`` and at most 8 captured layers
        (``create_dflash_tensors``, ``load_dflash_target_layer_ids``); it runs partial RoPE
        (``rope.dimension_count``) and no window (it then sees its ``cross_ctx`` last rows).
        """
        ik = self.gating == K.GATING_PER_HEAD and len(self.target_layer_ids) <= IK_MAX_TARGET_LAYERS
        return ("laguna-run", "ik_llama.cpp") if ik else ("laguna-run",)

    def n_parameters(self) -> int:
        total = 0
        for shape in expected_tensors(self).values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total


# --------------------------------------------------------------------------- parsing


class _BeyondDouble(float):
    """A JSON number too large for a double (``1e400`` reads as inf): kept as the user wrote it."""

    literal: str


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isfinite(value):
        return value
    out = _BeyondDouble(value)
    out.literal = text
    return out


def _show(v: Any) -> str:
    """A found value as the user wrote it in JSON (short)."""
    if v is _MISSING:
        return "nothing (field absent)"
    if isinstance(v, _BeyondDouble):
        return f"{v.literal} (beyond a double)"
    try:
        text = json.dumps(v)
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= 120 else text[:117] + "..."


_MISSING = object()


def _first_non_finite(value: Any, path: str) -> tuple[str, float] | None:
    """The first number in a JSON value that is not finite (``Infinity``, ``NaN``, ``1e400``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return path, value
    if isinstance(value, Mapping):
        items = ((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for sub_path, sub in items:
        if (found := _first_non_finite(sub, sub_path)) is not None:
            return found
    return None


class _Reader:
    """Typed field access on a JSON object; every failure is a ContractError naming the field."""

    def __init__(self, raw: Mapping[str, Any], source: Path, prefix: str = "") -> None:
        self.raw, self.source, self.prefix = raw, source, prefix

    def fail(self, field: str, expected: str, found: Any) -> ContractError:
        return ContractError(self.source, self.prefix + field, expected, _show(found))

    def get(self, field: str, default: Any = _MISSING) -> Any:
        return self.raw.get(field, default)

    def int(self, field: str, lo: int | None = 1, hi: int | None = U32_MAX, default: Any = _MISSING) -> int:
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
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:
            raise self.fail(field, "a positive finite number", v)
        return float(v)

    def equal(self, field: str, want: Any) -> None:
        v = self.raw.get(field, _MISSING)
        if v != want or type(v) is not type(want):
            raise self.fail(field, _show(want), v)


def parse_config(raw: Mapping[str, Any], source: Path | str) -> DrafterConfig:
    """Check a drafter ``config.json`` (already parsed) against SPEC §2 and return its typed view.

    Only the rules that need no target are checked here; :func:`check_pair` does the rest.
    The semantics are vLLM's (``laguna_dflash.py``), which the published drafters are served with.
    """
    source = Path(source)
    r = _Reader(raw, source)

    # one rule for every number, read or not: a NaN or an overflowed literal is a broken file
    if (bad := _first_non_finite(raw, "")) is not None:
        raise r.fail(bad[0], "a finite number", bad[1])

    r.equal("model_type", MODEL_TYPE)
    archs = r.get("architectures")
    if not isinstance(archs, list) or ARCHITECTURE not in archs:
        raise r.fail("architectures", _show([ARCHITECTURE]), archs)

    hidden = r.int("hidden_size")
    inter = r.int("intermediate_size")
    n_layer = r.int("num_hidden_layers", 1, MAX_LAYERS)
    n_head = r.int("num_attention_heads")
    n_kv = r.int("num_key_value_heads")
    if n_head % n_kv:
        raise r.fail("num_key_value_heads", f"a divisor of num_attention_heads ({n_head})", n_kv)
    if "head_dim" in raw and raw["head_dim"] is not None:
        head_dim = r.int("head_dim", *HEAD_DIM_RANGE)
    elif hidden % n_head == 0 and HEAD_DIM_RANGE[0] <= hidden // n_head <= HEAD_DIM_RANGE[1]:
        head_dim = hidden // n_head
    else:
        raise r.fail("head_dim", f"a value in {HEAD_DIM_RANGE[0]}..{HEAD_DIM_RANGE[1]} (hidden_size {hidden} "
                     f"/ {n_head} heads does not give one)", _MISSING)
    if n_head * head_dim > U32_MAX:
        raise r.fail("num_attention_heads", f"at most {U32_MAX // head_dim} heads of {head_dim} dims", n_head)
    eps = r.float("rms_norm_eps")
    vocab = r.int("vocab_size")
    draft_vocab = r.get("draft_vocab_size", vocab)
    if draft_vocab != vocab:
        raise r.fail("draft_vocab_size", f"{vocab} (= vocab_size)", draft_vocab)

    gating = _gating(r)
    experts = r.get("num_experts", 0)
    if experts not in (0, None) or isinstance(experts, bool):
        raise r.fail("num_experts", "0 (the drafter is dense)", experts)
    bias = r.get("attention_bias", False)
    if bias is not False:
        raise r.fail("attention_bias", "false", bias)
    act = r.get("hidden_act", HIDDEN_ACT)
    if act != HIDDEN_ACT:
        raise r.fail("hidden_act", _show(HIDDEN_ACT), act)

    layer_type = _layer_type(r, n_layer)
    window = _window(r, n_layer) if layer_type == SLIDING else None
    rope_theta, rotary_dims = _rope(r, layer_type, head_dim)
    ctx_len = r.int("max_position_embeddings", default=DEFAULT_CONTEXT_LENGTH)

    dflash = r.get("dflash_config")
    if not isinstance(dflash, Mapping):
        raise r.fail("dflash_config",
                     "an object with block_size, mask_token_id, num_target_layers, target_layer_ids, causal",
                     dflash if dflash is not None else _MISSING)
    d = _Reader(dflash, source, "dflash_config.")
    block_size = d.int("block_size", *BLOCK_SIZE_RANGE)
    mask_id = d.int("mask_token_id", 0, vocab - 1)
    n_target = d.int("num_target_layers", 1, MAX_LAYERS)
    ids = d.get("target_layer_ids")
    if not isinstance(ids, list) or not ids:
        raise d.fail("target_layer_ids", "a non-empty list of target layer ids", ids)
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n_target:
            raise d.fail(f"target_layer_ids[{i}]", f"a layer id in 0..{n_target - 1} (num_target_layers {n_target})", t)
        if i and t <= ids[i - 1]:
            raise d.fail("target_layer_ids", "strictly increasing ids", ids)
    if len(ids) * hidden > U32_MAX:
        raise r.fail("hidden_size", f"at most {U32_MAX // len(ids)} ({len(ids)} captured layers of it feed fc)",
                     hidden)
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
        gating=gating,
        rotary_dims=rotary_dims,
    )


def _gating(r: _Reader) -> str:
    """vLLM's gating field: absent or ``true`` is per-head, ``false`` is disabled."""
    gating = r.get("gating", True)
    for alias, mode in GATING_ALIASES:
        if gating == alias and type(gating) is type(alias):
            return mode
    raise r.fail("gating", 'one of true, "per-head", "per-element", false, "disabled"', gating)


def _layer_type(r: _Reader, n_layer: int) -> str:
    """The one attention type of every layer (vLLM refuses a drafter that mixes them)."""
    types = r.get("layer_types")
    if not isinstance(types, list) or len(types) != n_layer:
        raise r.fail("layer_types", f"a list of {n_layer} layer types ({_show(SLIDING)} or {_show(FULL)})", types)
    for i, t in enumerate(types):
        if t not in LAYER_TYPES:
            raise r.fail(f"layer_types[{i}]", f"{_show(SLIDING)} or {_show(FULL)}", t)
    if len(set(types)) > 1:
        raise r.fail("layer_types", f"one type for every layer (all {_show(SLIDING)} or all {_show(FULL)}; "
                     "the drafter cannot mix them)", types)
    return types[0]


def _window(r: _Reader, n_layer: int) -> int:
    window = r.int("sliding_window", *WINDOW_RANGE)
    windows = r.get("sliding_windows", None)
    if windows is not None:
        if not isinstance(windows, list) or len(windows) != n_layer:
            raise r.fail("sliding_windows", f"a list of {n_layer} windows (or no field)", windows)
        lo, hi = WINDOW_RANGE
        for i, w in enumerate(windows):
            if isinstance(w, bool) or not isinstance(w, int) or not lo <= w <= hi:
                raise r.fail(f"sliding_windows[{i}]", f"an integer in {lo}..{hi}", w)
            if w != window:
                raise r.fail(f"sliding_windows[{i}]", f"{window} (= sliding_window; the GGUF has one window)", w)
    return window


def _rope(r: _Reader, layer_type: str, head_dim: int) -> tuple[float, int | None]:
    """RoPE base and rotated dims of the drafter's layers, resolved as vLLM's ``_resolve_rope_params``.

    The parameters are ``swa_rope_parameters`` (sliding layers only), else ``rope_parameters``:
    a flat object, or one nested by layer type (this type's, falling back to ``full_attention``'s).
    A ``rope_theta`` or ``partial_rotary_factor`` they lack comes from the top level. Only plain
    RoPE is supported (``rope_type`` default), which is what every published drafter uses.
    """
    top = r.get("rope_parameters", None)
    if top is not None and not isinstance(top, Mapping):
        raise r.fail("rope_parameters", "an object (or no field)", top)
    top = top or {}
    if any(isinstance(v, Mapping) for v in top.values()):
        name = layer_type if top.get(layer_type) else FULL
        params, field = top.get(name) or {}, f"rope_parameters.{name}"
        if not isinstance(params, Mapping):
            raise r.fail(field, "an object", params)
    else:
        params, field = top, "rope_parameters"
    swa = r.get("swa_rope_parameters", None)
    if layer_type == SLIDING and swa is not None:
        if not isinstance(swa, Mapping):
            raise r.fail("swa_rope_parameters", "an object (or no field)", swa)
        params, field = swa, "swa_rope_parameters"

    legacy = r.get("rope_scaling", None)
    for name, block in ((field, params), ("rope_scaling", legacy)):
        if block is None:
            continue
        if not isinstance(block, Mapping):
            raise r.fail(name, "an object (or no field)", block)
        kind = block.get("rope_type", block.get("type", "default"))
        if kind != "default":
            raise r.fail(f"{name}.rope_type", '"default" (plain RoPE)', kind)

    def resolved(key: str) -> tuple[_Reader, Any]:
        if key in params:
            return _Reader(params, r.source, field + "."), params[key]
        return r, r.get(key, _MISSING)

    reader, _ = resolved("rope_theta")
    theta = reader.float("rope_theta")
    reader, factor = resolved("partial_rotary_factor")
    if factor is _MISSING or factor is None:
        return theta, None
    # vLLM: rotary_dim = int(head_dim * partial_rotary_factor); NeoX RoPE rotates dims in pairs
    number = isinstance(factor, int | float) and not isinstance(factor, bool)
    rotary = int(head_dim * factor) if number and 0 < factor <= 1 else 0
    if rotary < 2 or rotary % 2:
        raise reader.fail("partial_rotary_factor",
                          f"a factor in (0, 1] that rotates an even number (>= 2) of the {head_dim} head dims",
                          factor)
    return theta, None if rotary == head_dim else rotary


def load_config(path: Path | str) -> DrafterConfig:
    """Read and check ``config.json`` (``path`` is the file or the drafter directory)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UserError(f"{path}: not found (a drafter directory holds config.json and model.safetensors)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"), parse_float=_parse_float)
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
        if cfg.gate_rows:
            out[p + "self_attn.g_proj.weight"] = (cfg.gate_rows, h)
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


PREFIX = "model."
SPLIT_QKV = ("q_proj", "k_proj", "v_proj")
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")


def sanitize_keys(shapes: Mapping[str, tuple[int, ...]], cfg: DrafterConfig, files: Mapping[str, Path],
                  source: Path) -> dict[str, tuple[str, ...]]:
    """Canonical key (SPEC §2, :func:`expected_tensors` order) -> the stored keys stacked by rows to form it.

    ``shapes`` are the stored tensors' shapes by stored key, ``files`` the file each is in (named
    in errors; ``source`` when an error concerns no single file). The rules:

    * a leading ``model.`` is dropped, and a tensor may not come both with and without it;
    * layers are numbered 0..n-1, or n_target..n_target+n-1 (after the target's, as vLLM names
      the drafter's layers) and then renumbered from 0; any other numbering is refused;
    * a layer has either a fused ``qkv_proj`` or all of ``q_proj``/``k_proj``/``v_proj``
      (stacked in q, k, v order), never both, never part of the split set;
    * the result is exactly the expected key set, every shape as the config implies.
    """
    def file_of(keys) -> Path:
        found = {files[k] for k in keys}
        return found.pop() if len(found) == 1 else source

    stripped: dict[str, str] = {}
    for key in shapes:
        name = key.removeprefix(PREFIX)
        if name in stripped:
            raise ContractError(files[key], name, "one copy of the tensor (with or without the 'model.' prefix)",
                                f"both {name} and {PREFIX}{name}")
        stripped[name] = key

    n, offset = cfg.num_hidden_layers, cfg.num_target_layers
    found = sorted({int(m.group(1)) for k in stripped if (m := _LAYER.match(k))})
    if found == list(range(offset, offset + n)) and offset:
        renamed = {}
        for k, key in stripped.items():
            m = _LAYER.match(k)
            renamed[f"layers.{int(m.group(1)) - offset}.{m.group(2)}" if m else k] = key
        stripped = renamed
    elif found and found != list(range(n)):
        raise ContractError(file_of(shapes), "layers",
                            f"layer indices 0..{n - 1} (or {offset}..{offset + n - 1}, after the target's layers)",
                            _ranges(found))

    stacks: dict[str, tuple[str, ...]] = {k: (key,) for k, key in stripped.items()}
    split_shapes = split_qkv_shapes(cfg)
    for layer in range(n):
        att = f"layers.{layer}.self_attn."
        have = [s for s in SPLIT_QKV if att + s + ".weight" in stacks]
        if not have:
            continue
        where = files[stripped[att + have[0] + ".weight"]]
        if att + "qkv_proj.weight" in stacks:
            raise ContractError(where, att.rstrip("."), "either qkv_proj or q_proj/k_proj/v_proj",
                                f"both qkv_proj and {'/'.join(have)}")
        if len(have) != 3:
            raise ContractError(where, att.rstrip("."), "all of q_proj, k_proj, v_proj (or a fused qkv_proj)",
                                "only " + ", ".join(have))
        parts = tuple(stripped[att + s + ".weight"] for s in SPLIT_QKV)
        for s, key in zip(SPLIT_QKV, parts, strict=True):
            if tuple(shapes[key]) != split_shapes[s]:
                raise ContractError(files[key], key, f"shape {list(split_shapes[s])}", f"shape {list(shapes[key])}")
            del stacks[att + s + ".weight"]
        stacks[att + "qkv_proj.weight"] = parts

    def stacked_shape(keys: tuple[str, ...]) -> tuple[int, ...]:
        first = tuple(shapes[keys[0]])
        return (sum(shapes[k][0] for k in keys), *first[1:]) if len(keys) > 1 else first

    expected = expected_tensors(cfg)
    missing = [k for k in expected if k not in stacks]
    extra = sorted(k for k in stacks if k not in expected)
    if missing:
        more = f" (and {len(missing) - 1} more tensors missing)" if len(missing) > 1 else ""
        raise ContractError(file_of(shapes), missing[0], f"a tensor of shape {list(expected[missing[0]])}",
                            "nothing" + more)
    if extra:
        keys = stacks[extra[0]]
        more = f" (and {len(extra) - 1} more unexpected tensors)" if len(extra) > 1 else ""
        raise ContractError(files[keys[0]], ", ".join(keys), "no such tensor in a Laguna DFlash drafter",
                            f"a tensor of shape {list(stacked_shape(keys))}{more}")
    out: dict[str, tuple[str, ...]] = {}
    for name, want in expected.items():
        keys = stacks[name]
        if stacked_shape(keys) != want:
            raise ContractError(files[keys[0]], ", ".join(keys), f"shape {list(want)}",
                                f"shape {list(stacked_shape(keys))}")
        out[name] = keys
    return out


def _ranges(ids: list[int]) -> str:
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}..{ids[-1]}"
    return ", ".join(map(str, ids))
