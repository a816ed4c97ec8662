"""A :class:`~.spec.Constraint`'s whole grammar for one vocabulary (llguidance's text), within
the compile limits."""

from __future__ import annotations

import json
import re
from typing import Any

from .lark import inline_json, json_options, special_token, closed_objects
from .spec import LIMITS, MAX_SOURCE_BYTES, Constraint, ConstraintError
from .tool_calls import tool_call_grammar


def compile_limits():
    import llguidance

    return llguidance.LLParserLimits(**LIMITS, verbose_errors=False)


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


def _reasoning_prefix(tok, field_name: str) -> str:
    close = special_token(tok, "</think>")
    if close is None:
        raise ConstraintError(field_name, "a vocabulary with a </think> token (after_reasoning)", "none")
    return f"/(?s:.*)/ {close}"


def grammar_text(c: Constraint, tok) -> str:
    import llguidance

    if c.kind in ("json_schema", "json_object"):
        schema = {"type": "object"} if c.kind == "json_object" else closed_objects(_load_schema(c.source, c.field))
        if c.after_reasoning:
            body = f"start: {_reasoning_prefix(tok, c.field)} answer\nanswer: {inline_json(schema, c.strict)}\n"
            return _lark_grammar(body, c.field)
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=json_options(c.strict))
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
            # a reply with free text may also end inside its reasoning, as it could unconstrained
            lark = _prefix_start(lark, _reasoning_prefix(tok, c.field), optional=c.declared_calls)
        return _lark_grammar(lark, c.field)
    raise ConstraintError(c.field, "json_schema, json_object, grammar or tool_calls", c.kind)


def _prefix_start(lark: str, prefix: str, optional: bool = False) -> str:
    """A Lark grammar whose start rule is ``prefix`` then the original start rule (``optional``:
    the prefix's text alone, or all of it)."""
    renamed, n = re.subn(r"(?m)^(\s*)start(\s*:)", r"\1laguna_inner_start\2", lark, count=1)
    if n == 0:
        raise ConstraintError("grammar", "a start rule", "none")
    if optional:
        text, _, close = prefix.rpartition(" ")
        return renamed + f"\nstart: {text} ({close} laguna_inner_start)?\n"
    return renamed + f"\nstart: {prefix} laguna_inner_start\n"


def _lark_grammar(lark: str, field_name: str) -> str:
    import llguidance

    try:
        return llguidance.LLMatcher.grammar_from_lark(lark)
    except (ValueError, RecursionError) as e:
        raise ConstraintError(field_name, "a Lark grammar", str(e)) from None
