"""Compiling a constraint for one target, cached per model and constraint; what can be checked
before any model loads."""

from __future__ import annotations

import json
import threading
import weakref
from typing import Any

from .grammar import grammar_text, compile_limits
from .matcher import Matcher
from .spec import Constraint, ConstraintError
from .vocabulary import Vocabulary, tokenizer_for


class CompiledConstraint:
    """A constraint compiled for one target: ``matcher()`` gives a fresh :class:`Matcher` per
    generation (a copy of the compiled one: microseconds)."""

    is_output_constraint = True

    def __init__(self, constraint: Constraint, grammar: str, vocabulary: Vocabulary, n_vocab: int) -> None:
        import llguidance

        self.constraint, self.grammar, self.vocabulary, self.n_vocab = constraint, grammar, vocabulary, n_vocab
        # building the lexer is where a large grammar costs: once here, inside the limits
        self._compiled = llguidance.LLMatcher(vocabulary.llg, grammar, log_level=0, limits=compile_limits())
        if self._compiled.is_error():
            raise ConstraintError(constraint.field, "a grammar within the compile limits",
                                  self._compiled.get_error())
        first = self.matcher()
        if not first.accepting and not first.allowed().any():
            raise ConstraintError(constraint.field, "a constraint some output can satisfy", "none can")

    def matcher(self) -> "Matcher":
        return Matcher(self._compiled.deep_copy(), self.n_vocab, self.vocabulary.eog)


_compiled: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
_compiled_lock = threading.Lock()


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
    with _compiled_lock:
        per_model = _compiled.setdefault(model, {})
        hit = per_model.get(key)
    if hit is not None:
        return hit
    vocabulary = tokenizer_for(model)
    compiled = CompiledConstraint(constraint, grammar_text(constraint, vocabulary), vocabulary, model.n_vocab)
    with _compiled_lock:
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
        grammar = grammar_text(constraint, Vocabulary(None, {}))
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None, limits=compile_limits())
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
