"""Errors that modules on both sides of an import would otherwise pull from each other: the
llama.cpp layer's (runtime/llama.py and runtime/rpc.py; llama.py re-exports them) and a request
field's (runtime/request.py re-exports it; runtime/constraint/ raises it and request.py checks
constraints)."""

from __future__ import annotations


class LlamaError(RuntimeError):
    """A llama.cpp operation failed or was refused before it could abort the process."""


class ClosedError(LlamaError):
    """A model, context or engine was used after close()."""


class RequestError(ValueError):
    """A request field out of its rules: ``field`` (the request's name for it), what was
    expected, what was found, and a machine-readable ``code`` (the server's)."""

    def __init__(self, field: str, expected: str, found: object, code: str = "invalid_value") -> None:
        self.field, self.expected, self.found, self.code = field, expected, found, code
        super().__init__(self.render(field))

    def render(self, name: str) -> str:
        """The one-line message with the field called ``name`` (a flag, a JSON parameter)."""
        return f"{name}: expected {self.expected}, found {self.found!r}"
