"""The errors every layer raises, under the name convert/ and runtime/ import them by; they are
defined in the GGUF contract layer (convert/gguf/errors.py), which imports nothing above it."""

from .gguf.errors import USER_ERROR_EXIT, ContractError, UserError

__all__ = ["USER_ERROR_EXIT", "ContractError", "UserError"]
