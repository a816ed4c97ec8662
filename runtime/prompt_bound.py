"""A cheap lower bound on the tokens a text needs, so that a prompt far longer than the context
is refused before it is tokenized (tokenizing 20 MB of text takes seconds and gigabytes).

Each token's text is at most the longest entry of the vocabulary (in the GGUF's spelling, which
is never shorter than the bytes it stands for: ``▁`` for a space, ``<0x0A>`` for a byte), and a
character is at least one byte, so a text of ``n`` characters needs at least
``n / longest`` tokens. This holds for the BPE and SentencePiece tokenizers, which never drop
text; for the others (whose normalizers may collapse whitespace) no bound is claimed.

    longest = longest_token_bytes(model_path)
    if fits_at_most(len(text), longest) > n_ctx: refuse before tokenizing
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from ..convert.gguf import keys as K

#: tokenizer.ggml.model values whose tokenizers keep every byte of the text
_LOSSLESS_TOKENIZERS = ("gpt2", "llama")


@lru_cache(maxsize=8)
def longest_token_bytes(model_path: str | Path) -> int | None:
    """The longest vocabulary entry of a GGUF (bytes), or None when no bound holds."""
    from ..convert.gguf.rules import read_header_cached

    header = read_header_cached(model_path)
    if header.get(K.TOKENIZER_MODEL) not in _LOSSLESS_TOKENIZERS:
        return None
    tokens = header.fields.get(K.TOKENS)
    if tokens is None or not tokens.is_array or not len(tokens.value):
        return None
    return max(1, max(len(t) for t in tokens.value))


def min_tokens(n_chars: int, longest: int | None) -> int:
    """The fewest tokens ``n_chars`` characters can take (0 when no bound holds)."""
    return 0 if longest is None else -(-n_chars // longest)


def too_long(n_chars: int, longest: int | None, n_ctx: int) -> bool:
    """Whether a text of ``n_chars`` characters certainly does not fit ``n_ctx`` tokens."""
    return min_tokens(n_chars, longest) > n_ctx


def check_prompt_length(text: str, engine, n_ctx: int, flag: str) -> None:
    """A CLI prompt that certainly does not fit the context: one line, before tokenizing it."""
    from ..convert.errors import UserError

    least = min_tokens(len(text), longest_token_bytes(engine.target.path))
    if least > n_ctx:
        raise UserError(f"{flag}: the prompt has {len(text)} characters, at least {least} tokens; the context "
                        f"(-c/--ctx-size) holds {n_ctx}")
