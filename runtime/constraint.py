"""Structured output: what a generation must match, compiled against the target's vocabulary.

    c = Constraint.json_schema({"type": "object", "properties": {"n": {"type": "integer"}}})
    engine.generate(prompt, GenerateOptions(constraint=c))

A :class:`Constraint` is the user's side (a JSON schema, any JSON object, a GBNF or Lark
grammar, Laguna tool calls); :func:`compile_constraint` turns it into a grammar for one target's
vocabulary (llguidance, chosen by measurement: ``docs/results/structured/README.md``) and refuses a bad one
with one :class:`ConstraintError` naming the field. A :class:`Matcher` follows one generation:
the mask of the next token, consuming tokens, rolling back, and how many leading tokens of a
draft the grammar allows, without computing a mask.

:class:`ConstrainedSampler` is the engine's sampler under a constraint. Every token is the
user's sampler applied to the target's logits with the tokens the grammar forbids removed (the
masked distribution; greedy: the masked argmax). Greedy decoding computes a full mask only when
the plain argmax is forbidden: the argmax, when allowed, is also the masked argmax (the same
first-maximum rule), and whether one token is allowed costs microseconds.
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from .errors import RequestError
from .sampling import Sampler, SamplingParams

#: A grammar or schema text larger than this is refused before it is parsed.
MAX_SOURCE_BYTES = 1 << 20
#: Bounds on what compiling may cost (llguidance's fuel: about 50k units per ms of lexer
#: construction; grammar symbols; lexer states of ~1-2 kB each). A schema beyond them is refused
#: in bounded time instead of being compiled for seconds: docs/results/structured/README.md has the
#: pathological cases and their refusal times.
LIMITS = dict(initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000, max_grammar_size=50_000,
              max_lexer_states=50_000, step_max_items=50_000)
#: How JSON is laid out: Python's json.dumps default, on one line. Flexible whitespace lets a
#: model pad between tokens until it runs out of tokens (the bundled target did, 24 spaces at a
#: time); one layout also keeps the drafter's proposals predictable.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class ConstraintError(RequestError):
    """A constraint that cannot be used; ``field`` is the name the user gave it (a flag, a JSON
    parameter), so front ends report it as it is: one line, exit 2 or HTTP 400."""

    def __init__(self, field: str, expected: str, found: object) -> None:
        found_text = found if isinstance(found, str) else repr(found)
        super().__init__(field, expected, _shorten(found_text), code="invalid_constraint")

    def render(self, name: str) -> str:
        return f"{name}: expected {self.expected}, found {self.found}"


def _shorten(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass(frozen=True)
class Constraint:
    """What the output must match. Build one with the class methods; ``field`` is the name the
    user gave it (a flag, a request field), used in every error message."""

    kind: str  # "json_schema" | "json_object" | "grammar" | "tool_calls"
    is_output_constraint: ClassVar[bool] = True  # what runtime/request.py checks
    source: Any = None
    strict: bool = True
    field: str = "constraint"
    #: the output may start inside reasoning (a prompt ending in <think>): free text up to
    #: </think> first, then the constrained part
    after_reasoning: bool = False
    options: tuple = ()

    @classmethod
    def json_schema(cls, schema: dict | str, *, strict: bool = True, field: str = "json_schema",
                    after_reasoning: bool = False) -> "Constraint":
        """A JSON value valid under ``schema`` (a dict or its JSON text). ``strict``: a keyword
        the grammar cannot enforce is refused; otherwise it is ignored."""
        return cls("json_schema", schema, strict, field, after_reasoning)

    @classmethod
    def json_object(cls, *, field: str = "response_format", after_reasoning: bool = False) -> "Constraint":
        """Any JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""
        return cls("json_object", None, True, field, after_reasoning)

    @classmethod
    def grammar(cls, text: str, *, field: str = "grammar", after_reasoning: bool = False) -> "Constraint":
        """A llama.cpp GBNF grammar (root rule ``root``), or a Lark grammar in llguidance's
        dialect (a ``start:`` rule, or a first line ``%llguidance {}``)."""
        return cls("grammar", text, True, field, after_reasoning)

    @classmethod
    def tool_calls(cls, tools: Sequence[dict], choice: str | dict = "required", *, parallel: bool = True,
                   field: str = "tools", after_reasoning: bool = False) -> "Constraint":
        """One or more Laguna tool calls (``choice="required"``; exactly one with ``parallel=False``,
        OpenAI's ``parallel_tool_calls``), or exactly one call of a named function
        (``choice={"type": "function", "function": {"name": NAME}}`` or ``NAME``), in
        the model's own markup: ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>
        ...</tool_call>``, string values raw, others JSON valid under the parameter's schema."""
        # key order kept: a call's arguments follow the order of the schema's properties
        return cls("tool_calls", (tuple(json.dumps(t) for t in tools),
                                  json.dumps(choice, sort_keys=True), bool(parallel)), True, field, after_reasoning)


# ---------------------------------------------------------------------------------------- vocabulary


class _LlamaVocab:
    """A target's vocabulary as llguidance's TokenizerWrapper reads it: each token's bytes,
    the special tokens (matched by name in grammars, never inside text), and a tokenize
    function that goes through the checked Model (a closed model raises, never crashes)."""

    def __init__(self, model) -> None:
        from llama_cpp import llama_cpp as ll

        self._model = weakref.ref(model)
        n = model.n_vocab
        self.tokens = [model.token_bytes(t, special=True) for t in range(n)]
        # llama.cpp's control tokens, and user-defined ones written like tags (<tool_call>)
        attrs = [ll.llama_vocab_get_attr(model.vocab, t) for t in range(n)]
        self.special_token_ids = [t for t in range(n) if attrs[t] & ll.LLAMA_TOKEN_ATTR_CONTROL
                                  or (attrs[t] & ll.LLAMA_TOKEN_ATTR_USER_DEFINED
                                      and self.tokens[t].startswith(b"<") and self.tokens[t].endswith(b">"))]
        self.eog_ids = [t for t in range(n) if model.is_eog(t)]
        self.eos_token_id = self.eog_ids[0] if self.eog_ids else ll.llama_vocab_eos(model.vocab)
        bos = ll.llama_vocab_bos(model.vocab)
        self.bos_token_id = bos if bos >= 0 else None

    def __call__(self, text: bytes | str) -> list[int]:
        model = self._model()
        if model is None:
            raise RuntimeError("the target model is gone")
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return model.tokenize(text, add_special=False, parse_special=False)


@dataclass(frozen=True, eq=False)
class Vocabulary:
    """llguidance's tokenizer of one target and the ids of its special tokens by text."""

    llg: Any
    special: dict[str, int]
    eog: frozenset[int] = frozenset()  # the end-of-generation tokens


_tokenizers: "weakref.WeakKeyDictionary[Any, Vocabulary]" = weakref.WeakKeyDictionary()
_tokenizers_lock = threading.Lock()


def tokenizer_for(model) -> Vocabulary:
    """The vocabulary of a target Model for llguidance, built once per model (about 1 s for 100k
    tokens, most of it reading each token's bytes through llama.cpp)."""
    import llguidance

    with _tokenizers_lock:
        tok = _tokenizers.get(model)
        if tok is None:
            vocab = _LlamaVocab(model)
            llg = llguidance.LLTokenizer(llguidance.TokenizerWrapper(vocab), n_vocab=model.n_vocab,
                                         eos_token=vocab.eog_ids or None)
            tok = Vocabulary(llg, {vocab.tokens[t].decode("utf-8", "replace"): t for t in vocab.special_token_ids},
                             frozenset(vocab.eog_ids))
            _tokenizers[model] = tok
        return tok


# ---------------------------------------------------------------------------------------- compiling


class CompiledConstraint:
    """A constraint compiled for one target: ``matcher()`` gives a fresh :class:`Matcher` per
    generation (a copy of the compiled one: microseconds)."""

    is_output_constraint = True

    def __init__(self, constraint: Constraint, grammar: str, vocabulary: Vocabulary, n_vocab: int) -> None:
        import llguidance

        self.constraint, self.grammar, self.vocabulary, self.n_vocab = constraint, grammar, vocabulary, n_vocab
        # building the lexer is where a large grammar costs: once here, inside the limits
        self._compiled = llguidance.LLMatcher(vocabulary.llg, grammar, log_level=0, limits=_limits())
        if self._compiled.is_error():
            raise ConstraintError(constraint.field, "a grammar within the compile limits",
                                  self._compiled.get_error())
        first = self.matcher()
        if not first.accepting and not first.allowed().any():
            raise ConstraintError(constraint.field, "a constraint some output can satisfy", "none can")

    def matcher(self) -> "Matcher":
        return Matcher(self._compiled.deep_copy(), self.n_vocab, self.vocabulary.eog)


_compiled: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def compile_constraint(constraint: Constraint | CompiledConstraint, model) -> CompiledConstraint:
    """``constraint`` compiled for ``model``'s vocabulary (cached per model: a server's clients
    send the same schema many times). ConstraintError, naming ``constraint.field``, for a
    constraint that cannot be used."""
    if isinstance(constraint, CompiledConstraint):
        if constraint.vocabulary is tokenizer_for(model):
            return constraint
        constraint = constraint.constraint
    if not isinstance(constraint, Constraint):
        raise ConstraintError("constraint", "a Constraint", type(constraint).__name__)
    key = _cache_key(constraint)
    with _tokenizers_lock:
        per_model = _compiled.setdefault(model, {})
        hit = per_model.get(key)
    if hit is not None:
        return hit
    vocabulary = tokenizer_for(model)
    compiled = CompiledConstraint(constraint, _grammar_text(constraint, vocabulary), vocabulary, model.n_vocab)
    with _tokenizers_lock:
        if len(per_model) >= 64:
            per_model.pop(next(iter(per_model)))
        per_model[key] = compiled
    return compiled


def precheck(constraint: Constraint) -> Constraint:
    """What can be checked before any model loads (the JSON, the grammar's syntax and rules,
    the schema's keywords and the limits): a CLI refuses a bad flag without loading the pair.
    Compiling against the vocabulary (compile_constraint) still decides."""
    import llguidance

    if constraint.kind in ("json_schema", "json_object", "grammar") and not constraint.after_reasoning:
        grammar = _grammar_text(constraint, Vocabulary(None, {}))
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None, limits=_limits())
        if is_error:
            raise ConstraintError(constraint.field, "a constraint that compiles within the limits",
                                  messages[0] if messages else "an error")
    return constraint


def _cache_key(c: Constraint) -> str:
    try:
        # not sorted: two schemas that differ only in property order compile to different grammars
        source = json.dumps(c.source)
    except (TypeError, ValueError, RecursionError):
        source = repr(c.source)
    return json.dumps([c.kind, source, c.strict, c.field, c.after_reasoning])


def _limits():
    import llguidance

    return llguidance.LLParserLimits(**LIMITS, verbose_errors=False)


def _json_options(strict: bool) -> dict:
    return {**JSON_LAYOUT, "lenient": not strict}


def _load_schema(schema: Any, field_name: str) -> dict:
    if isinstance(schema, (bytes, str)):
        if len(schema) > MAX_SOURCE_BYTES:
            raise ConstraintError(field_name, f"a schema of at most {MAX_SOURCE_BYTES} bytes", f"{len(schema)} bytes")
        try:
            schema = json.loads(schema)
        except (ValueError, RecursionError) as e:
            raise ConstraintError(field_name, "a JSON schema (JSON text)", f"invalid JSON: {e}") from None
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise ConstraintError(field_name, "a JSON schema (an object)", type(schema).__name__)
    try:
        size = len(json.dumps(schema))
    except (ValueError, TypeError, RecursionError) as e:
        raise ConstraintError(field_name, "a JSON schema", f"a value that is not JSON: {e}") from None
    if size > MAX_SOURCE_BYTES:
        raise ConstraintError(field_name, f"a schema of at most {MAX_SOURCE_BYTES} bytes", f"{size} bytes")
    return schema


def closed_objects(schema: Any) -> Any:
    """A copy of ``schema`` where an object that lists its ``properties`` and says nothing about
    others gets ``additionalProperties: false``: llama.cpp's rule for generation (and what
    OpenAI's strict mode demands), since JSON Schema's own default (any other property) lets a
    model append properties until it runs out of tokens. A schema that says otherwise keeps it."""
    if isinstance(schema, list):
        return [closed_objects(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k in ("enum", "const", "default", "examples"):
            out[k] = v  # values, not schemas
        elif k in ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas") \
                and isinstance(v, dict):
            out[k] = {name: closed_objects(sub) for name, sub in v.items()}  # a map of schemas
        else:
            out[k] = closed_objects(v)
    if isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema \
            and "patternProperties" not in schema and "unevaluatedProperties" not in schema:
        out["additionalProperties"] = False
    return out


def _special(tok, text: str) -> str | None:
    """``<[id]>`` when ``text`` is one special token of this vocabulary, else None."""
    t = tok.special.get(text)
    return None if t is None else f"<[{t}]>"


def _lark_literal(text: str) -> str:
    return json.dumps(text)


def _reasoning_prefix(tok, field_name: str) -> str:
    close = _special(tok, "</think>")
    if close is None:
        raise ConstraintError(field_name, "a vocabulary with a </think> token (after_reasoning)", "none")
    return f"/(?s:.*)/ {close}"


def _grammar_text(c: Constraint, tok) -> str:
    import llguidance

    if c.kind in ("json_schema", "json_object"):
        schema = {"type": "object"} if c.kind == "json_object" else closed_objects(_load_schema(c.source, c.field))
        if c.after_reasoning:
            body = f"start: {_reasoning_prefix(tok, c.field)} answer\nanswer: {_inline_json(schema, c.strict)}\n"
            return _lark_grammar(body, c.field)
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=_json_options(c.strict))
        except (ValueError, RecursionError) as e:
            raise ConstraintError(c.field, "a JSON schema", str(e)) from None
    if c.kind == "grammar":
        text = c.source
        if not isinstance(text, str) or not text.strip():
            raise ConstraintError(c.field, "a GBNF or Lark grammar (non-empty text)", repr(text)[:40])
        if len(text.encode("utf-8", "replace")) > MAX_SOURCE_BYTES:
            raise ConstraintError(c.field, f"a grammar of at most {MAX_SOURCE_BYTES} bytes", f"{len(text)} characters")
        from llguidance.gbnf_to_lark import any_to_lark

        try:
            lark = any_to_lark(text)
        except RecursionError:
            raise ConstraintError(c.field, "a GBNF or Lark grammar", "nesting too deep to parse") from None
        except Exception as e:  # the converter raises its own error types and ValueError alike
            raise ConstraintError(c.field, "a GBNF or Lark grammar", f"{type(e).__name__}: {e}") from None
        if c.after_reasoning:
            lark = _prefix_start(lark, _reasoning_prefix(tok, c.field))
        return _lark_grammar(lark, c.field)
    if c.kind == "tool_calls":
        tools, choice, parallel = c.source
        lark = tool_call_grammar([json.loads(t) for t in tools], json.loads(choice), tok, c.field, parallel)
        if c.after_reasoning:
            lark = _prefix_start(lark, _reasoning_prefix(tok, c.field))
        return _lark_grammar(lark, c.field)
    raise ConstraintError(c.field, "json_schema, json_object, grammar or tool_calls", c.kind)


def _prefix_start(lark: str, prefix: str) -> str:
    """A Lark grammar whose start rule is ``prefix`` then the original start rule."""
    renamed, n = re.subn(r"(?m)^(\s*)start(\s*:)", r"\1laguna_inner_start\2", lark, count=1)
    if n == 0:
        raise ConstraintError("grammar", "a start rule", "none")
    return renamed + f"\nstart: {prefix} laguna_inner_start\n"


def _inline_json(schema: dict, strict: bool) -> str:
    """``%json {...}`` for a Lark grammar, with the same options as a whole-output schema."""
    return "%json " + json.dumps({**schema, "x-guidance": _json_options(strict)})


def _lark_grammar(lark: str, field_name: str) -> str:
    import llguidance

    try:
        return llguidance.LLMatcher.grammar_from_lark(lark)
    except (ValueError, RecursionError) as e:
        raise ConstraintError(field_name, "a Lark grammar", str(e)) from None


# ---------------------------------------------------------------------------------------- tool calls


def tool_call_grammar(tools: Sequence[dict], choice: str | dict, tok, field_name: str = "tools",
                      parallel: bool = True) -> str:
    """The Lark grammar of Laguna tool calls (reference: laguna-chat-tools-reasoning §3.1, the
    2.1 family's tight form): ``<tool_call>`` and ``</tool_call>`` as their special tokens when
    the vocabulary has them, as text otherwise; arguments in the schema's order, required ones
    present, optional ones optional; a string-typed value raw up to ``</arg_value>``, any other
    value JSON valid under its schema."""
    if not isinstance(tools, (list, tuple)) or not tools:
        raise ConstraintError(field_name, "a non-empty list of tools", tools)
    functions: dict[str, dict] = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name.strip() or any(ch in name for ch in "<>\n"):
            raise ConstraintError(f"{field_name}[{i}].function.name", "a name without <, > or newlines", name)
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ConstraintError(f"{field_name}[{i}].function.parameters", "a JSON schema object", params)
        functions[name] = params
    if choice == "required":
        names, repeat = list(functions), "+" if parallel else ""
    else:
        wanted = choice
        if isinstance(choice, dict):
            wanted = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
        if not isinstance(wanted, str) or wanted not in functions:
            raise ConstraintError("tool_choice", f"'required' or a function among {sorted(functions)}", choice)
        names, repeat = [wanted], ""
    open_tag = _special(tok, "<tool_call>") or _lark_literal("<tool_call>")
    close_tag = _special(tok, "</tool_call>") or _lark_literal("</tool_call>")
    rules = [f"start: ({' | '.join(f'call_{i}' for i in range(len(names)))}){repeat}",
             'raw_value[lazy]: /(?s:.*)<\\/arg_value>/']
    for i, name in enumerate(names):
        params = functions[name]
        props = params.get("properties") or {}
        if not isinstance(props, dict):
            raise ConstraintError(f"{field_name}.{name}.parameters.properties", "an object", props)
        required = set(params.get("required") or ())
        parts = []
        for j, (key, sub) in enumerate(props.items()):
            if any(ch in key for ch in "<>"):
                raise ConstraintError(f"{field_name}.{name}.parameters.properties", "keys without < or >", key)
            if not isinstance(sub, dict):
                sub = {}
            if sub.get("type") == "string":
                value = _raw_string_rule(sub, f"RAW_{i}_{j}", rules)
            else:
                rules.append(f"value_{i}_{j}: {_inline_json(closed_objects(sub), True)}")
                value = f'value_{i}_{j} "</arg_value>"'
            arg = f'"<arg_key>" {_lark_literal(key)} "</arg_key><arg_value>" {value}'
            parts.append(f"({arg})" if key in required else f"({arg})?")
        rules.append(f"call_{i}: {open_tag} {_lark_literal(name)} {' '.join(parts)} {close_tag}")
    return "\n".join(rules) + "\n"


def _raw_string_rule(schema: dict, name: str, rules: list[str]) -> str:
    """A string-typed argument: its raw text, then ``</arg_value>``. ``enum`` and the length
    bounds are enforced (a bound also keeps a model from writing one value forever); ``format``
    and ``pattern`` are not (they are hints in most tool schemas)."""
    if isinstance(schema.get("enum"), list) and all(isinstance(v, str) for v in schema["enum"]) and schema["enum"]:
        return "(" + " | ".join(_lark_literal(v) for v in schema["enum"]) + ') "</arg_value>"'
    lo, hi = schema.get("minLength", 0), schema.get("maxLength")
    if not isinstance(lo, int) or isinstance(lo, bool) or lo < 0:
        lo = 0
    if hi is None or not isinstance(hi, int) or isinstance(hi, bool) or hi < lo:
        return "raw_value"
    # any text of that length that does not contain the closing tag
    rules.append(f"{name}: /(?s:.){{{lo},{hi}}}/ & ~/(?s:.*)<\\/arg_value>(?s:.*)/")
    return f'{name} "</arg_value>"'


# ---------------------------------------------------------------------------------------- matching


class Matcher:
    """One generation's position in a compiled constraint (CompiledConstraint.matcher())."""

    def __init__(self, llg_matcher, n_vocab: int, eog: frozenset[int] = frozenset()) -> None:
        self.n_vocab = n_vocab
        self._m = llg_matcher
        self._eog = eog
        # an end token consumed where the output was complete: the generation is over (kept
        # here, since llguidance consumes no token once it has stopped)
        self._ended = False
        self._check()
        self._bits = np.zeros((self.n_vocab + 31) // 32, dtype=np.int32)
        self.n_mask = 0  # full masks computed (for the stats and the benchmark)

    def _check(self) -> None:
        if self._m.is_error():
            raise RuntimeError(f"constraint matcher: {self._m.get_error()}")

    def allowed(self) -> np.ndarray:
        """Boolean mask [n_vocab] of the tokens the grammar allows next (end tokens only where
        the output is complete; nothing after an end token)."""
        if self._ended:
            return np.zeros(self.n_vocab, dtype=bool)
        self._m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        self.n_mask += 1
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")
        return bits[:self.n_vocab].astype(bool)

    def masked(self, logits: np.ndarray) -> np.ndarray:
        """A copy of ``logits`` with -inf at every forbidden token."""
        return np.where(self.allowed(), logits, -np.inf).astype(np.float32, copy=False)

    def admissible(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar allows from here (no mask computed, no
        state changed)."""
        if self._ended or not len(tokens):
            return 0
        toks = [int(t) for t in tokens]
        cut = next((i for i, t in enumerate(toks) if t in self._eog), len(toks))
        n = self._m.validate_tokens(toks[:cut]) if cut else 0
        if n < cut or cut == len(toks):
            return n
        # an end token: allowed where the output before it is complete (asked of the state
        # after the prefix, since llguidance refuses end tokens once it has stopped)
        k = self._m.try_consume_tokens(toks[:cut]) if cut else 0
        try:
            return n + 1 if self._m.is_accepting() else n
        finally:
            if k:
                self._m.rollback(k)

    def draft(self, logits: np.ndarray) -> list[int]:
        """The drafter's proposals under the grammar: row ``i`` of the drafter's block logits
        [k, n_vocab] read in the state after the proposals before it, its masked argmax (a mask
        only where the plain argmax is forbidden). Stops early where the grammar allows
        nothing more. No state changes."""
        drafts: list[int] = []
        try:
            for row in logits:
                tok = int(np.argmax(row))
                if not self.try_consume([tok]):
                    allowed = self.allowed()
                    if not allowed.any():
                        break
                    tok = int(np.argmax(np.where(allowed, row, -np.inf)))
                    if not self.try_consume([tok]):
                        break
                drafts.append(tok)
                if self._ended:
                    break
        finally:
            self.rollback(len(drafts))
        return drafts

    def is_allowed(self, token: int) -> bool:
        return self.admissible([token]) == 1

    def try_consume(self, tokens: Sequence[int]) -> int:
        """Consume the longest allowed prefix of ``tokens``; returns its length."""
        n = 0
        for i, t in enumerate(tokens):
            if int(t) in self._eog:
                done = self._m.try_consume_tokens([int(x) for x in tokens[n:i]]) if i > n else 0
                n += done
                if n < i or self._ended or not self._m.is_accepting():
                    return n
                self._ended = True
                return n + 1
        if n < len(tokens) and not self._ended:
            n += self._m.try_consume_tokens([int(x) for x in tokens[n:]])
        return n

    def consume(self, tokens: Sequence[int]) -> None:
        """Consume ``tokens``, every one of which must be allowed (ValueError otherwise, the
        matcher unchanged)."""
        n = self.try_consume(tokens)
        if n != len(tokens):
            self.rollback(n)
            raise ValueError(f"token {int(tokens[n])} is not allowed by the constraint here")

    def rollback(self, n: int) -> None:
        """Forget the last ``n`` consumed tokens."""
        if n and self._ended:
            self._ended, n = False, n - 1
        if n and not self._m.rollback(n):
            raise RuntimeError(f"constraint matcher: cannot roll back {n} tokens: {self._m.get_error()}")

    @property
    def accepting(self) -> bool:
        """The output so far is complete: end of generation is allowed here."""
        return self._m.is_accepting()

    @property
    def ended(self) -> bool:
        """An end token was consumed: nothing follows."""
        return self._ended

    @property
    def end_token(self) -> int:
        return min(self._eog) if self._eog else 0

    @property
    def stopped(self) -> bool:
        """The output is complete: nothing but an end token is allowed, or one was consumed."""
        return self._ended or self._m.is_stopped()


class ConstrainedSampler(Sampler):
    """The user's sampler on the target's logits with the forbidden tokens removed. It consumes
    every token it returns, so the engine calls ``sample`` once per emitted token and
    ``accept`` once per verify (drafts cut first with ``matcher.admissible``)."""

    def __init__(self, params: SamplingParams, matcher: Matcher) -> None:
        super().__init__(params)
        self.matcher = matcher

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        if self.matcher.ended:
            # the row after an accepted end token: generation stops at that token, this one is
            # never emitted
            return self.matcher.end_token
        if self.params.greedy and not self.history_len:
            tok = int(np.argmax(logits))
            if self.matcher.try_consume([tok]):
                return tok
        tok = super().sample(self.matcher.masked(logits), history)
        self.matcher.consume([tok])
        return tok

    def accept(self, logits: np.ndarray, drafts: list[int], history: Sequence[int] = ()) -> tuple[int, int]:
        if self.params.greedy and not self.history_len:
            # rows whose argmax equals an allowed draft need no mask: that argmax is the masked one
            choice = logits.argmax(axis=1).tolist()
            n = 0
            while n < len(drafts) and choice[n] == drafts[n]:
                n += 1
            n = self.matcher.try_consume(drafts[:n])
            return n, self.sample(logits[n])
        # one row at a time: self.sample masks each row for the state after the drafts before it
        return super().accept(logits, drafts, history)

    @property
    def finished(self) -> bool:
        return self.matcher.stopped


# ---------------------------------------------------------------------------------------- front ends


def constraint_from_request(response_format: dict | None = None, grammar: str | None = None,
                            json_schema: Any = None, *, forced_call: Constraint | None = None,
                            after_reasoning: bool = False) -> Constraint | None:
    """The constraint of an OpenAI-style request: ``response_format`` (``text``, ``json_object``,
    ``json_schema`` with ``schema`` and ``strict``; llama-server also reads ``schema`` beside
    ``json_object``) or llama-server's top-level ``grammar`` (GBNF) and ``json_schema`` fields.
    None when the request asks for none; ConstraintError naming the field for a bad one, or for
    two at once.

    ``forced_call`` is a chat request's ``tool_choice`` constraint (:func:`tool_choice_constraint`):
    it decides the whole output. ``response_format`` shapes a text answer, which a forced call
    leaves none of, so it is not applied (vLLM's rule: a client may send both, as OpenAI accepts
    them); ``grammar`` and ``json_schema`` constrain the whole output and are refused beside it
    (llama-server's rule for a grammar with tools)."""
    if forced_call is not None:
        clash = next((name for name, value in (("grammar", grammar), ("json_schema", json_schema))
                      if value is not None), None)
        if clash is not None:
            raise ConstraintError(clash, "none beside tool_choice 'required' or a named function", f"a {clash}")
        return forced_call
    if response_format is not None and not isinstance(response_format, dict):
        raise ConstraintError("response_format", "an object", type(response_format).__name__)
    if response_format is not None and response_format.get("type", "text") == "text":
        response_format = None
    given = [name for name, value in (("response_format", response_format), ("grammar", grammar),
                                      ("json_schema", json_schema)) if value is not None]
    if len(given) > 1:
        raise ConstraintError(given[1], f"one constraint per request (not {' and '.join(given)})", "both")
    if grammar is not None:
        if not isinstance(grammar, str):
            raise ConstraintError("grammar", "a GBNF grammar (a string)", type(grammar).__name__)
        return Constraint.grammar(grammar, field="grammar", after_reasoning=after_reasoning)
    if json_schema is not None:
        return Constraint.json_schema(json_schema, strict=True, field="json_schema", after_reasoning=after_reasoning)
    if response_format is None:
        return None
    kind = response_format.get("type", "text")
    if kind == "json_object":
        schema = response_format.get("schema")
        if schema is not None:
            return Constraint.json_schema(schema, strict=True, field="response_format.schema",
                                          after_reasoning=after_reasoning)
        return Constraint.json_object(field="response_format", after_reasoning=after_reasoning)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict):
            raise ConstraintError("response_format.json_schema", "an object with a schema", spec)
        schema = spec.get("schema")
        if schema is None:
            raise ConstraintError("response_format.json_schema.schema", "a JSON schema", "none")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ConstraintError("response_format.json_schema.strict", "true or false", strict)
        return Constraint.json_schema(schema, strict=bool(strict), field="response_format.json_schema.schema",
                                      after_reasoning=after_reasoning)
    raise ConstraintError("response_format.type", "text, json_object or json_schema", kind)


def tool_choice_constraint(tools: Sequence[dict] | None, tool_choice: Any, *, parallel_tool_calls: bool = True,
                           after_reasoning: bool = False) -> Constraint | None:
    """The constraint of a chat request's ``tool_choice``: None for ``auto``/``none``/absent,
    tool calls in Laguna's markup for ``required`` or a named function (one call). A chat turn
    builds it (``ChatTurn.constraint``); the server passes it to :func:`constraint_from_request`
    as ``forced_call``."""
    if tool_choice in (None, "auto", "none"):
        return None
    if not tools:
        raise ConstraintError("tool_choice", "tools to choose from", "no tools")
    if tool_choice == "required":
        return Constraint.tool_calls(tools, "required", parallel=parallel_tool_calls, field="tools",
                                     after_reasoning=after_reasoning)
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        return Constraint.tool_calls(tools, tool_choice, parallel=False, field="tools", after_reasoning=after_reasoning)
    raise ConstraintError("tool_choice", "'auto', 'none', 'required' or {'type': 'function', ...}", tool_choice)


def constraint_from_flags(grammar: str | None = None, grammar_file=None, json_schema: str | None = None,
                          json_schema_file=None) -> Constraint | None:
    """llama.cpp's flags: ``--grammar TEXT``, ``--grammar-file FILE``, ``--json-schema TEXT``
    (``-j``), ``--json-schema-file FILE``; ConstraintError naming the flag. Files are read as
    UTF-8 and size-checked before anything parses them."""
    given = [n for n, v in (("--grammar", grammar), ("--grammar-file", grammar_file), ("--json-schema", json_schema),
                            ("--json-schema-file", json_schema_file)) if v is not None]
    if len(given) > 1:
        raise ConstraintError(given[1], f"one of {', '.join(given)}", "several")
    if grammar is not None:
        return Constraint.grammar(grammar, field="--grammar")
    if json_schema is not None:
        return Constraint.json_schema(json_schema, field="--json-schema")
    for flag, path in (("--grammar-file", grammar_file), ("--json-schema-file", json_schema_file)):
        if path is None:
            continue
        text = _read_text(flag, path)
        if flag == "--grammar-file":
            return Constraint.grammar(text, field=f"--grammar-file {path}")
        return Constraint.json_schema(text, field=f"--json-schema-file {path}")
    return None


def _read_text(flag: str, path) -> str:
    from pathlib import Path

    p = Path(path)
    try:
        if not p.is_file():
            raise ConstraintError(flag, "a readable file", f"{p}: not a file")
        if p.stat().st_size > MAX_SOURCE_BYTES:
            raise ConstraintError(flag, f"a file of at most {MAX_SOURCE_BYTES} bytes", f"{p}: {p.stat().st_size} bytes")
        data = p.read_bytes()
    except OSError as e:
        raise ConstraintError(flag, "a readable file", f"{p}: {e.strerror}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConstraintError(flag, "UTF-8 text", f"{p}: invalid byte at offset {e.start}") from None
