"""The constraint a request or a command line asks for: OpenAI's and llama-server's request
fields, a chat request's ``tool_choice``, llama.cpp's flags; ConstraintError naming the field
or flag."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .spec import MAX_SOURCE_BYTES, Constraint, ConstraintError


def constraint_from_request(response_format: dict | None = None, grammar: str | None = None,
                            json_schema: Any = None, *, forced_call: Constraint | None = None,
                            declared_calls: Constraint | None = None,
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
    (llama-server's rule for a grammar with tools).

    ``declared_calls`` is a chat request's ``tool_choice: "auto"`` constraint
    (:func:`declared_calls_constraint`): it applies when the request asks for nothing else,
    since a ``response_format`` or a grammar already decides what the output may be."""
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
        return declared_calls
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


def declared_calls_constraint(tools: Sequence[dict] | None, *, parallel_tool_calls: bool = True,
                              after_reasoning: bool = False) -> Constraint | None:
    """``tool_choice: "auto"``: the text is free, but a call, once the model writes its
    ``<tool_call>`` token, is held to a declared tool's name and its parameters' schema (a lazy
    grammar: nothing is constrained until the call opens). None without tools."""
    if not tools:
        return None
    return Constraint.tool_calls(tools, "auto", parallel=parallel_tool_calls, field="tools",
                                 after_reasoning=after_reasoning)


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
