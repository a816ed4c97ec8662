"""Poolside's own drafter GGUFs (SPEC §5b), read and checked.

Poolside publishes drafters such as ``laguna-s-2.1-DFlash-BF16.gguf`` in the generic ``dflash``
architecture of llama.cpp plus two Laguna extras (``enc.aux_norm``, ``blk.N.attn_gate``), with
the target layers stored llama.cpp-style (HF id + 1). Neither upstream llama.cpp nor our loader
runs that file, so it is rewritten once into ``dflash-draft`` (SPEC §5a). Four modules, one
concern each:

    pf = read_poolside(Path("laguna-s-2.1-DFlash-BF16.gguf"), target)   # here: every contract check
    job = prepare(path, target)              # convert/poolside_rewrite.py: our tensors and metadata
    job.write(Path("drafter.gguf"))          # same-type tensors keep their bytes
    native_drafter_path(path, "target.gguf") # runtime/drafter_cache.py: the rewrite laguna-run loads
    # laguna-gguf inspect prints a Poolside file's contract (convert/cli.py)

Everything is checked from the header before a byte is written, with the rules of SPEC §2 (the
config is rebuilt from the metadata and goes through :func:`convert.checkpoint.parse_config`),
and each failure names the Poolside key or tensor. Our tensor names come from
:func:`convert.mapping.gguf_layout`; this module only knows Poolside's names and which of our
canonical (HF) tensors each one holds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, Keys

from .gguf import keys as K
from .checkpoint import ARCHITECTURE, DEFAULT_CONTEXT_LENGTH, MODEL_TYPE, SLIDING, DrafterConfig, check_pair, parse_config
from .converter import ARCH
from .errors import ContractError, UserError
from .mapping import Kind, LayoutEntry, gguf_layout
from .target import TargetInfo, open_gguf

POOLSIDE_ARCH = K.POOLSIDE_ARCH
LAGUNA_DECODER = "laguna"
AUX_NORM = "enc.aux_norm.weight"
#: llama.cpp's DFlash default when a file has no ``dflash.block_size`` (common/speculative.cpp).
DEFAULT_BLOCK_SIZE = 16
FULL_ATTENTION = "full_attention"

#: Our canonical (HF) tensor -> the Poolside tensor holding it, outside the blocks.
_GLOBAL_SOURCES = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",
    "norm.weight": "output_norm.weight",
}
#: Per block: HF suffix after ``layers.{n}.`` -> Poolside suffix after ``blk.{n}.``.
_BLOCK_SOURCES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.g_proj.weight": "attn_gate.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
#: The fused ``qkv_proj`` is stored split, in q, k, v row order.
_QKV_SOURCES = ("attn_q.weight", "attn_k.weight", "attn_v.weight")
_AUX = re.compile(r"^aux_hidden_norms\.(\d+)\.weight$")
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")

_FLOAT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)
_NOT_WEIGHTS = (GGMLQuantizationType.I8, GGMLQuantizationType.I16, GGMLQuantizationType.I32,
                GGMLQuantizationType.I64, GGMLQuantizationType.F64)
_INT_TYPES = (GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
              GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64)


def _key(name: str) -> str:
    """A key of Poolside's layout: one of ours under its arch, or a suffix only it has."""
    return K.for_arch(POOLSIDE_ARCH, name)


#: Metadata the Laguna drafter's forward does not have; a file setting any of them otherwise is
#: some other DFlash drafter, and would draft wrongly in our graph.
_NEUTRAL_VALUES: dict[str, tuple[object, ...]] = {
    _key("hidden_act"): ("silu",),
    _key("embedding_scale"): (0.0, 1.0),
    _key("logit_scale"): (0.0, 1.0),
    _key("final_logit_softcapping"): (0.0,),
    _key("attention.scale"): (0.0,),
    _key("attention.value_scale"): (0.0, 1.0),
    _key("rope.scaling.type"): ("none", "linear"),  # "linear" with factor 1 is plain RoPE
    _key("rope.scaling.factor"): (0.0, 1.0),
}

#: A SPEC §2 config field (as :func:`parse_config` names it) -> the Poolside key it was read from.
_FIELD_KEYS = (
    ("dflash_config.target_layer_ids", _key("target_layers")),
    ("dflash_config.block_size", _key("block_size")),
    ("dflash_config.mask_token_id", Keys.Tokenizer.MASK_ID),
    ("dflash_config.causal", _key(K.CAUSAL)),
    ("dflash_config.num_target_layers", _key("target_layers")),
    ("hidden_size", _key(K.EMBEDDING_LENGTH)),
    ("intermediate_size", _key(K.FEED_FORWARD_LENGTH)),
    ("num_hidden_layers", _key(K.BLOCK_COUNT)),
    ("num_attention_heads", _key(K.HEAD_COUNT)),
    ("num_key_value_heads", _key(K.HEAD_COUNT_KV)),
    ("head_dim", _key(K.KEY_LENGTH)),
    ("rms_norm_eps", _key(K.RMS_EPS)),
    ("draft_vocab_size", K.TOKENS),
    ("vocab_size", K.TOKENS),
    ("sliding_windows", _key(K.SLIDING_WINDOW)),
    ("sliding_window", _key(K.SLIDING_WINDOW)),
    ("rope_theta", _key(K.ROPE_FREQ_BASE)),
    ("rope_parameters", _key(K.ROPE_DIMENSION_COUNT)),
    ("rope_scaling", _key("rope.scaling.type")),
    ("max_position_embeddings", _key(K.CONTEXT_LENGTH)),
    ("gating", "blk.0.attn_gate.weight"),
)


# --------------------------------------------------------------------------- reading the file


@dataclass
class PoolsideFile:
    """A checked Poolside-layout drafter: its config in our terms and its tensors by Poolside name."""

    path: Path
    cfg: DrafterConfig
    stored_layers: tuple[int, ...]  # ``dflash.target_layers`` as stored (HF id + 1)
    values: dict[str, Any]  # every non-tokenizer key, decoded
    tensors: dict[str, Any] = field(repr=False)  # name -> gguf ReaderTensor
    tokens: list[bytes] = field(default_factory=list, repr=False)

    @property
    def name(self) -> str:
        v = self.values.get(K.GENERAL_NAME)
        return v if isinstance(v, str) and v.strip() else self.path.stem

    @property
    def source_repo(self) -> str | None:
        v = self.values.get(K.GENERAL_SOURCE_REPO)
        return v if isinstance(v, str) and re.match(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$", v) else None


def is_poolside_layout(path: Path | str) -> bool:
    """Whether ``path`` is a GGUF of the generic ``dflash`` architecture (Poolside's layout)."""
    path = Path(path)
    if not path.is_file():
        return False
    from .gguf.header import read_header

    # the header alone: laguna-run, inspect and Engine.load all ask, and gguf-py's reader
    # would map and index every tensor of the file to answer
    try:
        return read_header(path).arch == POOLSIDE_ARCH
    except Exception:  # not a GGUF at all: whoever reads it next says so, with its own message
        return False


def _values(reader: GGUFReader) -> tuple[dict[str, Any], dict[str, GGUFValueType]]:
    values, types = {}, {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or (key.startswith("tokenizer.") and key != Keys.Tokenizer.MASK_ID):
            continue
        values[key] = f.contents()
        types[key] = f.types[-1] if f.types and f.types[0] == GGUFValueType.ARRAY else f.types[0]
    return values, types


def _tokens(reader: GGUFReader) -> list[bytes]:
    f = reader.fields.get(K.TOKENS)
    return [] if f is None else [bytes(f.parts[i]) for i in f.data]


def _ne(shape: tuple[int, ...]) -> list[int]:
    """A numpy-order shape in GGUF ``ne`` order (what gguf-dump and llama.cpp print)."""
    return list(reversed(shape))


def _int(path: Path, values: Mapping[str, Any], types: Mapping[str, GGUFValueType], key: str,
         default: object = None) -> Any:
    """An integer key as stored (anything else is handed on for parse_config to refuse by name)."""
    if key not in values:
        if default is None:
            raise ContractError(path, key, "an integer", "nothing (key absent)")
        return default
    v = values[key]
    if types[key] not in _INT_TYPES or isinstance(v, list):
        raise ContractError(path, key, "an integer", repr(v))
    return int(v)


def _stored_layers(path: Path, values: Mapping[str, Any], types: Mapping[str, GGUFValueType],
                   n_target_layers: int | None) -> tuple[int, ...]:
    key = _key("target_layers")
    ids = values.get(key)
    if not isinstance(ids, list) or not ids or types.get(key) not in _INT_TYPES:
        raise ContractError(path, key, "a non-empty integer array of captured target layers (HF id + 1)",
                            "nothing (key absent)" if ids is None else repr(ids))
    top = f"1..{n_target_layers}" if n_target_layers else "1 or more"
    for i, t in enumerate(ids):
        if not 1 <= t <= (n_target_layers or t):
            why = "; 0 would be the token embeddings, which no Laguna drafter reads" if t < 1 else ""
            raise ContractError(path, f"{key}[{i}]", f"a layer in {top} (HF id + 1{why})", t)
        if i and t <= ids[i - 1]:
            raise ContractError(path, key, "strictly increasing layers", ids)
    return tuple(int(t) for t in ids)


def _hf_config(path: Path, values: Mapping[str, Any], types: Mapping[str, GGUFValueType],
               tensors: Mapping[str, Any], hf_ids: list[int], n_target_layers: int, vocab: int) -> dict:
    """The SPEC §2 ``config.json`` this file's metadata describes."""
    n_layer = values.get(_key(K.BLOCK_COUNT))
    n_head = values.get(_key(K.HEAD_COUNT))
    head_dim = values.get(_key(K.KEY_LENGTH))
    value_length = values.get(_key(K.VALUE_LENGTH), head_dim)
    if value_length != head_dim:
        raise ContractError(path, _key(K.VALUE_LENGTH), f"{head_dim} (= attention.key_length)",
                            value_length)
    raw: dict[str, Any] = {
        "model_type": MODEL_TYPE,
        "architectures": [ARCHITECTURE],
        "hidden_size": values.get(_key(K.EMBEDDING_LENGTH)),
        "intermediate_size": values.get(_key(K.FEED_FORWARD_LENGTH)),
        "num_hidden_layers": n_layer,
        "num_attention_heads": n_head,
        "num_key_value_heads": values.get(_key(K.HEAD_COUNT_KV)),
        "head_dim": head_dim,
        "rms_norm_eps": values.get(_key(K.RMS_EPS)),
        "vocab_size": vocab,
        "rope_theta": values.get(_key(K.ROPE_FREQ_BASE)),
        "max_position_embeddings": values.get(_key(K.CONTEXT_LENGTH), DEFAULT_CONTEXT_LENGTH),
        "attention_bias": False,
        "num_experts": 0,
        "gating": "per-head",
        "dflash_config": {
            "block_size": _int(path, values, types, _key("block_size"), DEFAULT_BLOCK_SIZE),
            "mask_token_id": _int(path, values, types, Keys.Tokenizer.MASK_ID),
            "num_target_layers": n_target_layers,
            "target_layer_ids": hf_ids,
            # Poolside's fork runs every Laguna drafter causally (it keys that on decoder_arch).
            "causal": values.get(_key(K.CAUSAL), True),
        },
    }
    gate = tensors.get("blk.0.attn_gate.weight")
    if gate is not None and isinstance(n_head, int) and isinstance(head_dim, int) and n_head > 1:
        if int(gate.shape[1]) == n_head * head_dim:
            raw["gating"] = "per-element"
    rope_dims = values.get(_key(K.ROPE_DIMENSION_COUNT))
    if rope_dims is not None and rope_dims != head_dim and isinstance(head_dim, int) and head_dim > 0:
        raw["rope_parameters"] = {"rope_type": "default", "partial_rotary_factor": rope_dims / head_dim}
    window = values.get(_key(K.SLIDING_WINDOW))
    n = n_layer if isinstance(n_layer, int) and n_layer > 0 else 0
    if window is not None:
        raw["sliding_window"] = window
        pattern = values.get(_key(K.SLIDING_WINDOW_PATTERN), [True] * n)
        if not isinstance(pattern, list) or len(pattern) != n:
            raise ContractError(path, _key(K.SLIDING_WINDOW_PATTERN), f"{n} booleans (one per layer)",
                                pattern)
        raw["layer_types"] = [SLIDING if p else FULL_ATTENTION for p in pattern]
    else:
        raw["layer_types"] = [FULL_ATTENTION] * n
    return raw


def _translated(path: Path, e: ContractError, values: Mapping[str, Any]) -> ContractError:
    """A parse_config/check_pair error about a config field, re-aimed at the Poolside key it came from."""
    f = e.field
    if f.startswith("layer_types"):
        if _key(K.SLIDING_WINDOW) not in values:
            return ContractError(path, _key(K.SLIDING_WINDOW),
                                 "a window (every layer of a Laguna drafter is sliding-window)",
                                 "nothing (full attention on every layer)")
        return ContractError(path, _key(K.SLIDING_WINDOW_PATTERN), "true on every layer",
                             values.get(_key(K.SLIDING_WINDOW_PATTERN)))
    for prefix, key in _FIELD_KEYS:
        if f == prefix or f.startswith(prefix + ".") or f.startswith(prefix + "["):
            return ContractError(path, key + f[len(prefix):] if f.startswith(prefix + "[") else key,
                                 e.expected, e.found)
    return ContractError(path, f, e.expected, e.found)


def read_poolside(path: Path | str, target: TargetInfo | None = None) -> PoolsideFile:
    """Check a Poolside-layout drafter (and, given ``target``, that the pair works); read no weights."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: not found")
    try:
        reader = open_gguf(path)
    except UserError as e:
        raise UserError(f"{e} (a drafter is its HF directory, or a GGUF in Poolside's layout)") from None
    values, types = _values(reader)
    tensors = {t.name: t for t in reader.tensors}
    arch = values.get(K.GENERAL_ARCHITECTURE)
    if arch != POOLSIDE_ARCH:
        found = f'"{arch}" (already this project\'s layout)' if arch == ARCH else repr(arch)
        raise ContractError(path, K.GENERAL_ARCHITECTURE, f'"{POOLSIDE_ARCH}" (Poolside\'s drafter layout)', found)
    decoder = values.get(_key("decoder_arch"))
    if decoder != LAGUNA_DECODER and (decoder is not None or AUX_NORM not in tensors):
        found = "nothing (a generic DFlash drafter, not a Laguna one)" if decoder is None else repr(decoder)
        raise ContractError(path, _key("decoder_arch"), f'"{LAGUNA_DECODER}" (a Laguna DFlash drafter)', found)
    for key, neutral in _NEUTRAL_VALUES.items():
        if key in values and values[key] not in neutral:
            raise ContractError(path, key, " or ".join(repr(v) for v in neutral) + " (the Laguna drafter's forward)",
                                repr(values[key]))
    hidden_key = _key(K.EMBEDDING_LENGTH)
    if _key("target_hidden_size") in values and values[_key("target_hidden_size")] != values.get(hidden_key):
        raise ContractError(path, _key("target_hidden_size"), f"{values.get(hidden_key)} (= embedding_length)",
                            values[_key("target_hidden_size")])

    stored = _stored_layers(path, values, types, target.n_layer if target else None)
    tokens = _tokens(reader)
    vocab = values.get(_key(K.VOCAB_SIZE)) or len(tokens) or (target.vocab_size if target else None)
    if not vocab:
        raise ContractError(path, K.TOKENS, "the target's vocabulary (or give --target)", "none")
    if tokens and len(tokens) != vocab:
        raise ContractError(path, _key(K.VOCAB_SIZE), f"{len(tokens)} (tokens in {K.TOKENS})", vocab)
    raw = _hf_config(path, values, types, tensors, [t - 1 for t in stored],
                     target.n_layer if target else max(stored), vocab)
    try:
        cfg = parse_config(raw, path)
        if target is not None:
            check_pair(cfg, target)
    except ContractError as e:
        raise _translated(path, e, values) from None
    if target is not None:
        _check_tokens(path, tokens, target)
    pf = PoolsideFile(path, cfg, stored, values, tensors, tokens)
    _check_tensors(pf)
    return pf


def _check_tokens(path: Path, tokens: list[bytes], target: TargetInfo) -> None:
    if not tokens:
        return  # nothing to compare: our output carries the target's tokenizer anyway
    want = target.tokens()
    if len(tokens) != len(want):
        raise ContractError(path, K.TOKENS, f"{len(want)} tokens (vocabulary of target {target.name})",
                            f"{len(tokens)} tokens")
    diff = next((i for i, (x, y) in enumerate(zip(tokens, want, strict=True)) if x != y), None)
    if diff is not None:
        raise ContractError(path, f"{K.TOKENS}[{diff}]", f"{want[diff]!r} (as in target {target.name})",
                            repr(tokens[diff]))


# --------------------------------------------------------------------------- Poolside names of our tensors


@dataclass(frozen=True)
class Source:
    """Where one of our tensors lives in a Poolside file: a tensor, or one row of a stacked one."""

    name: str
    row: int | None = None


def poolside_source(entry: LayoutEntry, cfg: DrafterConfig) -> Source:
    """The Poolside tensor (and row) that holds our layout entry ``entry``."""
    if m := _AUX.match(entry.hf_name):
        return Source(AUX_NORM, int(m.group(1)))
    if entry.hf_name in _GLOBAL_SOURCES:
        return Source(_GLOBAL_SOURCES[entry.hf_name])
    m = _LAYER.match(entry.hf_name)
    if m is None:
        raise KeyError(f"no Poolside tensor known for {entry.hf_name} (convert/poolside.py needs updating)")
    n, suffix = m.groups()
    if suffix == "self_attn.qkv_proj.weight":
        starts = (0, cfg.q_rows, cfg.q_rows + cfg.kv_rows)
        return Source(f"blk.{n}.{_QKV_SOURCES[starts.index(entry.rows[0])]}")
    if suffix not in _BLOCK_SOURCES:
        raise KeyError(f"no Poolside tensor known for {entry.hf_name} (convert/poolside.py needs updating)")
    return Source(f"blk.{n}.{_BLOCK_SOURCES[suffix]}")


def expected_poolside_tensors(cfg: DrafterConfig) -> dict[str, tuple[tuple[int, ...], Kind]]:
    """Poolside tensor name -> (numpy shape, kind), in our layout's order."""
    out: dict[str, tuple[tuple[int, ...], Kind]] = {}
    for e in gguf_layout(cfg):
        src = poolside_source(e, cfg)
        if src.row is None:
            out[src.name] = (e.shape, e.kind)
        else:
            out[src.name] = ((len(cfg.target_layer_ids), *e.shape), Kind.NORM)
    return out


def _check_tensors(pf: PoolsideFile) -> None:
    p, expected = pf.path, expected_poolside_tensors(pf.cfg)
    missing = [n for n in expected if n not in pf.tensors]
    if missing:
        more = f" (and {len(missing) - 1} more tensors missing)" if len(missing) > 1 else ""
        raise ContractError(p, missing[0], f"a tensor of ne {_ne(expected[missing[0]][0])}", "nothing" + more)
    extra = [n for n in pf.tensors if n not in expected]
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise ContractError(p, extra[0], "no such tensor in a Laguna DFlash drafter (it borrows the target's "
                            "embedding and head)", f"a tensor of ne {list(pf.tensors[extra[0]].shape)}{more}")
    n_aux = len(pf.cfg.target_layer_ids)
    for name, (shape, kind) in expected.items():
        t = pf.tensors[name]
        found = [int(d) for d in t.shape]
        if found != _ne(shape):
            why = f" (n_embd x {n_aux} captured layers)" if name == AUX_NORM else ""
            raise ContractError(p, name, f"ne {_ne(shape)}{why}", f"ne {found}")
        qtype = GGMLQuantizationType(t.tensor_type)
        if kind is Kind.NORM and qtype not in _FLOAT_TYPES:
            raise ContractError(p, name, "F32, F16 or BF16 (a norm vector)", qtype.name)
        if qtype in _NOT_WEIGHTS:
            raise ContractError(p, name, "a float or quantized weight type", qtype.name)
        block = GGML_QUANT_SIZES[qtype][0]
        if shape[-1] % block:
            raise ContractError(p, name, f"rows of whole {qtype.name} blocks ({block} values)", f"ne {found}")
