"""Pieces of llguidance's Lark grammar text: literals, special tokens, inline JSON schemas with
the project's JSON layout, and objects closed as llama.cpp closes them."""

from __future__ import annotations

import json
from typing import Any

from .spec import JSON_LAYOUT


def json_options(strict: bool) -> dict:
    return {**JSON_LAYOUT, "lenient": not strict}


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


def special_token(tok, text: str) -> str | None:
    """``<[id]>`` when ``text`` is one special token of this vocabulary, else None."""
    t = tok.special.get(text)
    return None if t is None else f"<[{t}]>"


def lark_literal(text: str) -> str:
    return json.dumps(text)


def inline_json(schema: dict, strict: bool) -> str:
    """``%json {...}`` for a Lark grammar, with the same options as a whole-output schema."""
    return "%json " + json.dumps({**schema, "x-guidance": json_options(strict)})
