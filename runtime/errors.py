"""The errors of the llama.cpp layer, apart so that runtime/llama.py and runtime/rpc.py both use
them without importing each other's module first (llama.py re-exports them)."""

from __future__ import annotations


class LlamaError(RuntimeError):
    """A llama.cpp operation failed or was refused before it could abort the process."""


class ClosedError(LlamaError):
    """A model, context or engine was used after close()."""
