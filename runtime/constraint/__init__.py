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

The package by concern: ``spec`` (the constraint and its errors), ``vocabulary`` (a target's
tokens for llguidance), ``lark`` and ``grammar`` (the grammar text), ``tool_calls`` (Laguna's
call grammar), ``compiled`` (compiling and its cache), ``matcher`` (one generation's state and
the sampler) and ``requests`` (the front ends' fields and flags).
"""

from __future__ import annotations

from .compiled import CompiledConstraint, compile_constraint, precheck
from .lark import closed_objects
from .matcher import ConstrainedSampler, ConstraintFailed, Matcher
from .requests import (constraint_from_flags, constraint_from_request, declared_calls_constraint,
                       tool_choice_constraint)
from .spec import JSON_LAYOUT, LIMITS, MAX_SOURCE_BYTES, Constraint, ConstraintError
from .tool_calls import tool_call_grammar
from .vocabulary import Vocabulary, tokenizer_for

__all__ = ["JSON_LAYOUT", "LIMITS", "MAX_SOURCE_BYTES", "CompiledConstraint", "ConstrainedSampler", "Constraint",
           "ConstraintError", "ConstraintFailed", "Matcher", "Vocabulary", "closed_objects", "compile_constraint",
           "constraint_from_flags", "constraint_from_request", "declared_calls_constraint", "precheck",
           "tool_call_grammar", "tool_choice_constraint", "tokenizer_for"]
