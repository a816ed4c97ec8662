"""What a generation must match, as the user gives it: :class:`Constraint` (a JSON schema, any
JSON object, a GBNF or Lark grammar, Laguna tool calls), the bounds on compiling one, and
:class:`ConstraintError`, which names the field the user gave it by."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import RequestError

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

    @property
    def declared_calls(self) -> bool:
        """The constraint of ``tool_choice: "auto"``: free text, calls held to the tools."""
        return self.kind == "tool_calls" and self.source[1] == '"auto"'

    @classmethod
    def tool_calls(cls, tools: Sequence[dict], choice: str | dict = "required", *, parallel: bool = True,
                   field: str = "tools", after_reasoning: bool = False) -> "Constraint":
        """One or more Laguna tool calls (``choice="required"``; exactly one with ``parallel=False``,
        OpenAI's ``parallel_tool_calls``); text, then calls only to these tools with valid
        arguments (``choice="auto"``: the text is free, a call once opened is held to the
        tools); or exactly one call of a named function
        (``choice={"type": "function", "function": {"name": NAME}}`` or ``NAME``), in
        the model's own markup: ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>
        ...</tool_call>``, string values raw, others JSON valid under the parameter's schema."""
        # key order kept: a call's arguments follow the order of the schema's properties
        return cls("tool_calls", (tuple(json.dumps(t) for t in tools),
                                  json.dumps(choice, sort_keys=True), bool(parallel)), True, field, after_reasoning)
