"""Range rules for the GGUF metadata llama.cpp reads, checked in Python before it reads them.

llama.cpp trusts most header values: a NaN or negative RMS epsilon, a zero KV-head count, a
rope dimension larger than the head or an unknown expert gating function end in a GGML_ASSERT,
a division by zero or an abort that kills the whole process — at load, or later at the first
decode. Every rule here is one such value; :func:`header_problems` checks a header against them
and returns one :class:`~convert.errors.ContractError` per violation (file, key, expected,
found). ``laguna-gguf inspect`` (convert/drafter_info.py), the converter's target reader and the
runtime's loader (convert/gguf/specs.py, runtime/llama.py) all use this module, so each rule lives in
one place.

To add a key, add one line to :data:`MODEL_RULES` (any architecture, key ``{arch}.<suffix>``),
to :data:`ARCH_RULES` (one architecture; it overrides the general line) or to
:data:`GLOBAL_RULES` (a full key name); a rule that relates two keys goes to :data:`RELATIONS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from gguf import GGUFValueType as T

from . import keys as K
from .errors import ContractError
from .header import Header, Value, read_header

LLAMA_MAX_LAYERS = 512  # src/llama-hparams.h
LLAMA_MAX_EXPERTS = 1024
I32_MAX = 2**31 - 1  # llama.cpp stores most counts in uint32 but computes with int
DRAFT_ARCH = K.ARCH
#: ``{arch}.`` is prefixed per architecture: the rules are keyed by what follows it.
S = K.suffix
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")


@dataclass(frozen=True)
class Rule:
    """What one key must hold: its GGUF type(s) and a test on each value."""

    expected: str  # the value part of the message, e.g. "an integer in 1..512"
    types: tuple[T, ...]  # the scalar types llama.cpp reads it as
    ok: Callable[[object], bool]
    per_layer: bool = False  # llama.cpp also takes an array with one value per layer (get_key_or_arr)
    array_types: tuple[T, ...] = ()  # for per_layer keys: element types it accepts
    required: bool = False  # llama.cpp refuses a file without it
    # False: llama.cpp's loader refuses a bad value cleanly by itself (its refusal is tested), so
    # only the contract readers check it, not the pre-load check of runtime.llama.Model
    before_load: bool = True

    def describe(self) -> str:
        if not self.types:
            return f"{self.expected} (an {'/'.join(t.name for t in self.array_types)} array)"
        names = "/".join(t.name for t in self.types)
        return f"{self.expected} ({names}{', or an array of one per layer' if self.per_layer else ''})"


def count(lo: int, hi: int = I32_MAX, *, per_layer: bool = False, required: bool = False) -> Rule:
    return Rule(f"an integer in {lo}..{_num(hi)}", (T.UINT32,), lambda v: lo <= v <= hi, per_layer=per_layer,
                array_types=(T.UINT32, T.INT32) if per_layer else (), required=required)


def even_count(lo: int, hi: int = I32_MAX) -> Rule:
    return Rule(f"an even integer in {lo}..{_num(hi)}", (T.UINT32,), lambda v: lo <= v <= hi and v % 2 == 0)


def positive_float(*, required: bool = False) -> Rule:
    return Rule("a finite number > 0", (T.FLOAT32,), lambda v: math.isfinite(v) and v > 0, required=required)


def non_negative_float() -> Rule:
    return Rule("a finite number >= 0", (T.FLOAT32,), lambda v: math.isfinite(v) and v >= 0)


def one_of(*choices: str) -> Rule:
    return Rule(f"one of {', '.join(choices)}", (T.STRING,),
                lambda v: v.decode("utf-8", errors="replace") in choices)


def flag(value: bool, *, required: bool = False, before_load: bool = True) -> Rule:
    return Rule(str(value).lower(), (T.BOOL,), lambda v: v is value, required=required, before_load=before_load)


def _num(n: int) -> str:
    return {I32_MAX: "2^31-1", 1 << 20: "2^20"}.get(n, str(n))


#: ``{arch}.<suffix>`` for every architecture: the hyperparameters of llama.cpp's load_hparams.
MODEL_RULES: dict[str, Rule] = {
    S(K.CONTEXT_LENGTH): count(1, required=True),
    S(K.EMBEDDING_LENGTH): count(1, required=True),
    S(K.BLOCK_COUNT): count(1, LLAMA_MAX_LAYERS, required=True),
    "nextn_predict_layers": count(0, LLAMA_MAX_LAYERS),
    S(K.FEED_FORWARD_LENGTH): count(1, per_layer=True),
    S(K.HEAD_COUNT): count(1, per_layer=True),
    S(K.HEAD_COUNT_KV): count(1, per_layer=True),
    S(K.KEY_LENGTH): count(1),
    S(K.VALUE_LENGTH): count(1),
    "attention.key_length_swa": count(1),
    "attention.value_length_swa": count(1),
    S(K.RMS_EPS): positive_float(),
    "attention.layer_norm_epsilon": positive_float(),
    S(K.SLIDING_WINDOW): count(0),
    S(K.ROPE_FREQ_BASE): positive_float(),
    "rope.freq_base_swa": positive_float(),
    S(K.ROPE_DIMENSION_COUNT): even_count(2),
    "rope.dimension_count_swa": even_count(2),
    "rope.scaling.type": one_of(*ROPE_SCALING_TYPES),
    "rope.scaling.factor": non_negative_float(),  # 0: no scaling
    "rope.scale_linear": non_negative_float(),
    "rope.scaling.attn_factor": positive_float(),
    "rope.scaling.original_context_length": count(1),
    "expert_count": count(0, LLAMA_MAX_EXPERTS),
    "expert_used_count": count(0, LLAMA_MAX_EXPERTS, per_layer=True),
    "expert_group_count": count(0, LLAMA_MAX_EXPERTS),
    "expert_group_used_count": count(0, LLAMA_MAX_EXPERTS),
    "expert_feed_forward_length": count(1, per_layer=True),
    "expert_shared_feed_forward_length": count(1),
    "expert_shared_count": count(1, LLAMA_MAX_EXPERTS),
    "expert_weights_scale": positive_float(),
    "expert_gating_func": Rule("1..4 (softmax, sigmoid, softmax_weight, sqrt_softplus)", (T.UINT32,),
                               lambda v: 1 <= v <= 4),
    "leading_dense_block_count": count(0, LLAMA_MAX_LAYERS),
    S(K.VOCAB_SIZE): count(1),
}

#: Per architecture: lines that replace or add to MODEL_RULES.
ARCH_RULES: dict[str, dict[str, Rule]] = {
    "laguna": {  # src/models/laguna.cpp
        S(K.RMS_EPS): positive_float(required=True),
        "leading_dense_block_count": count(0, LLAMA_MAX_LAYERS, required=True),
        "expert_feed_forward_length": count(1, per_layer=True, required=True),
    },
    DRAFT_ARCH: {  # src/models/dflash-draft.cpp (patch 0003) and SPEC §5a; one value for all layers
        S(K.FEED_FORWARD_LENGTH): count(1, required=True),
        S(K.HEAD_COUNT): count(1, required=True),
        S(K.HEAD_COUNT_KV): count(1, required=True),
        S(K.KEY_LENGTH): count(1, required=True),
        S(K.VALUE_LENGTH): count(1),
        S(K.RMS_EPS): positive_float(required=True),
        S(K.CAUSAL): flag(True, required=True, before_load=False),
        # absent: full attention (no window), as ik_llama.cpp reads it
        S(K.SLIDING_WINDOW): count(2, 1 << 20),
        S(K.ROPE_DIMENSION_COUNT): even_count(2),
        S(K.GATING): one_of(*K.GATING_MODES),
        S(K.DFLASH_LAGUNA): flag(True, required=True, before_load=False),
        S(K.BLOCK_SIZE): count(2, 512, required=True),
        S(K.MASK_TOKEN_ID): count(0, required=True),
        S(K.N_TARGET_FEATURES): count(1),
        S(K.TARGET_N_LAYER): count(1, LLAMA_MAX_LAYERS),
        S(K.TARGET_LAYER_IDS): Rule(f"a non-empty array of layer ids in 0..{LLAMA_MAX_LAYERS - 1}", (),
                                        lambda v: 0 <= v < LLAMA_MAX_LAYERS, per_layer=True,
                                        array_types=(T.INT32, T.UINT32), required=True),
        S(K.SLIDING_WINDOW_PATTERN): Rule("one bool per layer", (), lambda v: isinstance(v, bool),
                                                 per_layer=True, array_types=(T.BOOL,)),
    },
}

#: Full key names, whatever the architecture.
GLOBAL_RULES: dict[str, Rule] = {
    K.GENERAL_ALIGNMENT: Rule("a power of two", (T.UINT32,), lambda v: v > 0 and v & (v - 1) == 0),
}


def rules_for(arch: str) -> dict[str, Rule]:
    """Full key name -> rule for a file of architecture ``arch``."""
    merged = {f"{arch}.{k}": r for k, r in {**MODEL_RULES, **ARCH_RULES.get(arch, {})}.items()}
    return {**merged, **GLOBAL_RULES}


# --------------------------------------------------------------------------- relations between keys


class _View:
    """The values of one header, by suffix after ``{arch}.``, with llama.cpp's defaults."""

    def __init__(self, header: Header, arch: str) -> None:
        self.header, self.arch = header, arch

    def key(self, suffix: str) -> str:
        return f"{self.arch}.{suffix}"

    def raw(self, suffix: str) -> object:
        v = self.header.fields.get(self.key(suffix))
        return None if v is None else v.value

    def per_layer(self, suffix: str, default: list[int] | None = None) -> list[int] | None:
        v = self.raw(suffix)
        n_layer = self.raw(S(K.BLOCK_COUNT))
        if v is None:
            return default
        return list(v) if isinstance(v, list) else [v] * n_layer


def _heads(v: _View) -> ContractError | None:
    n_layer = v.raw(S(K.BLOCK_COUNT))
    for suffix in (S(K.HEAD_COUNT), S(K.HEAD_COUNT_KV), S(K.FEED_FORWARD_LENGTH),
                   "expert_feed_forward_length", "expert_used_count"):
        arr = v.raw(suffix)
        if isinstance(arr, list) and len(arr) != n_layer:
            return ContractError(v.header.path, v.key(suffix), f"{n_layer} values (block_count)",
                                 f"{len(arr)} values")
    heads = v.per_layer(S(K.HEAD_COUNT))
    kv = v.per_layer(S(K.HEAD_COUNT_KV), heads)
    if heads is None:
        return None
    for il, (h, k) in enumerate(zip(heads, kv)):
        if h % k:
            return ContractError(v.header.path, v.key(S(K.HEAD_COUNT_KV)),
                                 f"a divisor of attention.head_count ({h})", f"{k} (layer {il})")
    return None


def _experts(v: _View) -> ContractError | None:
    n_expert = v.raw("expert_count") or 0
    used = v.per_layer("expert_used_count", [0]) or [0]
    key = v.key("expert_used_count")
    if n_expert == 0 and max(used) > 0:
        return ContractError(v.header.path, key, "0 (expert_count is 0)", max(used))
    if n_expert > 0 and not all(1 <= u <= n_expert for u in used):
        return ContractError(v.header.path, key, f"1..{n_expert} (expert_count) in every layer",
                             min(used) if min(used) < 1 else max(used))
    groups = v.raw("expert_group_count") or 0
    if groups and (n_expert == 0 or groups >= n_expert or (groups > 1 and n_expert % groups)):
        return ContractError(v.header.path, v.key("expert_group_count"),
                             f"a divisor of expert_count ({n_expert}) below it", groups)
    group_used = v.raw("expert_group_used_count") or 0
    if groups > 1 and not 0 < group_used < groups:
        return ContractError(v.header.path, v.key("expert_group_used_count"), f"1..{groups - 1}", group_used)
    return None


def _layers(v: _View) -> ContractError | None:
    n_layer = v.raw(S(K.BLOCK_COUNT))
    for suffix in ("leading_dense_block_count", "nextn_predict_layers"):
        n = v.raw(suffix)
        if n is not None and n > n_layer:
            return ContractError(v.header.path, v.key(suffix), f"at most block_count ({n_layer})", n)
    return None


def _rope(v: _View) -> ContractError | None:
    heads = v.per_layer(S(K.HEAD_COUNT))
    n_embd = v.raw(S(K.EMBEDDING_LENGTH))
    head_dim = v.raw(S(K.KEY_LENGTH)) or (n_embd // heads[0] if heads and heads[0] else None)
    for rot, dim, dim_key in ((S(K.ROPE_DIMENSION_COUNT), head_dim, S(K.KEY_LENGTH)),
                              ("rope.dimension_count_swa", v.raw("attention.key_length_swa") or head_dim,
                               "attention.key_length_swa")):
        n_rot = v.raw(rot)
        if n_rot is not None and dim is not None and n_rot > dim:
            return ContractError(v.header.path, v.key(rot), f"at most the head size ({dim_key} = {dim})", n_rot)
    return None


def _drafter(v: _View) -> ContractError | None:
    if v.arch != DRAFT_ARCH:
        return None
    path, n_layer = v.header.path, v.raw(S(K.BLOCK_COUNT))
    ids = v.raw(S(K.TARGET_LAYER_IDS))
    if not ids or any(b <= a for a, b in zip(ids, ids[1:])):
        return ContractError(path, v.key(S(K.TARGET_LAYER_IDS)), "non-empty, strictly increasing", ids)
    n_feat = v.raw(S(K.N_TARGET_FEATURES))
    if n_feat is not None and n_feat != len(ids) * v.raw(S(K.EMBEDDING_LENGTH)):
        return ContractError(path, v.key(S(K.N_TARGET_FEATURES)),
                             f"{len(ids) * v.raw('embedding_length')} (len(target_layer_ids) x embedding_length)",
                             n_feat)
    # partial rotary (vLLM's partial_rotary_factor) rotates fewer dims than the head has;
    # _rope already refuses more than the head
    pattern = v.raw(S(K.SLIDING_WINDOW_PATTERN))
    sliding = v.raw(S(K.SLIDING_WINDOW)) is not None
    if pattern is not None and (len(pattern) != n_layer or any(bool(x) != sliding for x in pattern)):
        expected = "true (sliding)" if sliding else "false (no attention.sliding_window: full attention)"
        return ContractError(path, v.key(S(K.SLIDING_WINDOW_PATTERN)), f"{n_layer} x {expected}", pattern)
    tokens = v.header.fields.get(K.TOKENS)
    n_vocab = len(tokens.value) if tokens is not None and tokens.is_array else 0
    if n_vocab == 0:
        return ContractError(path, K.TOKENS, "the target's vocabulary", "none")
    mask = v.raw(S(K.MASK_TOKEN_ID))
    if not mask < n_vocab:
        return ContractError(path, v.key(S(K.MASK_TOKEN_ID)), f"0..{n_vocab - 1} (a token id)", mask)
    return None


#: Rules between keys; each runs only when every single-key rule passed.
RELATIONS: list[Callable[[_View], ContractError | None]] = [_heads, _experts, _layers, _rope, _drafter]


# --------------------------------------------------------------------------- checking


def _found(value: Value) -> str:
    v = value.value
    if value.type == T.STRING:
        v = v.decode("utf-8", errors="replace")
    if isinstance(v, list) and len(v) > 8:
        v = f"[{', '.join(map(repr, v[:8]))}, ...] ({len(v)} values)"
    return f"{v!r} ({value.type_name()})" if isinstance(v, (str, float)) else f"{v} ({value.type_name()})"


def _value_problem(rule: Rule, value: Value) -> str | None:
    """None when ``value`` passes ``rule``, else the expected-part of the message."""
    if value.is_array:
        if not rule.per_layer or value.sub_type not in rule.array_types:
            return rule.describe()
        items = value.value
        if not items or not all(rule.ok(x) for x in items):
            return f"{rule.expected} in every element ({'/'.join(t.name for t in rule.array_types)} array)"
        return None
    if value.type not in rule.types or not rule.ok(value.value):
        return rule.describe()
    return None


def header_problems(header: Header, *, require: bool = True, before_load: bool = False) -> list[ContractError]:
    """Every rule ``header`` breaks; [] when it passes. ``require``: a missing required key is a
    problem too; ``before_load``: only the rules that protect llama.cpp's loader (Rule.before_load)."""
    arch = header.arch
    if arch is None:
        return [ContractError(header.path, K.GENERAL_ARCHITECTURE, "a string naming the architecture",
                              "nothing" if K.GENERAL_ARCHITECTURE not in header.fields
                              else _found(header.fields[K.GENERAL_ARCHITECTURE]))]
    out = []
    for key, rule in rules_for(arch).items():
        if before_load and not rule.before_load:
            continue
        value = header.fields.get(key)
        if value is None:
            if require and rule.required:
                out.append(ContractError(header.path, key, rule.describe(), "nothing (the key is missing)"))
            continue
        problem = _value_problem(rule, value)
        if problem is not None:
            out.append(ContractError(header.path, key, problem, _found(value)))
    if not out and all(header.fields.get(f"{arch}.{k}") is not None for k in (S(K.BLOCK_COUNT), S(K.EMBEDDING_LENGTH))):
        view = _View(header, arch)
        out += [p for p in (rel(view) for rel in RELATIONS) if p is not None]
    return out


def check_header(header: Header, *, require: bool = True, before_load: bool = False) -> Header:
    """Raise the first problem of :func:`header_problems`; return the header when there is none."""
    problems = header_problems(header, require=require, before_load=before_load)
    if problems:
        raise problems[0]
    return header


def read_header_cached(path: Path | str) -> Header:
    """:func:`~convert.gguf.header.read_header`, once per file version: loading a pair reads each
    header several times (contracts, then each model's own check)."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        return read_header(p)  # says why it cannot be read
    return _read_cached(str(p), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))


def checked_header(path: Path | str, *, require: bool = True, before_load: bool = False) -> Header:
    """The header of ``path``, range-checked: ContractError for the first rule it breaks."""
    return check_header(read_header_cached(path), require=require, before_load=before_load)


@lru_cache(maxsize=16)
def _read_cached(path: str, stamp: tuple[int, int, int, int]) -> Header:
    return read_header(Path(path))
