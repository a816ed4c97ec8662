"""A target's vocabulary as llguidance reads it, built once per model."""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any


class _LlamaVocab:
    """A target's vocabulary as llguidance's TokenizerWrapper reads it: each token's bytes,
    the special tokens (matched by name in grammars, never inside text), and a tokenize
    function that goes through the checked Model (a closed model raises, never crashes)."""

    def __init__(self, model) -> None:
        from llama_cpp import llama_cpp as ll

        self._model = weakref.ref(model)
        n = model.n_vocab
        self.tokens = [model.token_bytes(t, special=True) for t in range(n)]
        # llama.cpp's control tokens, and user-defined ones written like tags (<tool_call>)
        attrs = [ll.llama_vocab_get_attr(model.vocab, t) for t in range(n)]
        self.special_token_ids = [t for t in range(n) if attrs[t] & ll.LLAMA_TOKEN_ATTR_CONTROL
                                  or (attrs[t] & ll.LLAMA_TOKEN_ATTR_USER_DEFINED
                                      and self.tokens[t].startswith(b"<") and self.tokens[t].endswith(b">"))]
        self.eog_ids = [t for t in range(n) if model.is_eog(t)]
        self.eos_token_id = self.eog_ids[0] if self.eog_ids else ll.llama_vocab_eos(model.vocab)
        bos = ll.llama_vocab_bos(model.vocab)
        self.bos_token_id = bos if bos >= 0 else None

    def __call__(self, text: bytes | str) -> list[int]:
        model = self._model()
        if model is None:
            raise RuntimeError("the target model is gone")
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return model.tokenize(text, add_special=False, parse_special=False)


@dataclass(frozen=True, eq=False)
class Vocabulary:
    """llguidance's tokenizer of one target and the ids of its special tokens by text."""

    llg: Any
    special: dict[str, int]
    eog: frozenset[int] = frozenset()  # the end-of-generation tokens


_tokenizers: "weakref.WeakKeyDictionary[Any, Vocabulary]" = weakref.WeakKeyDictionary()
_tokenizers_lock = threading.Lock()


def tokenizer_for(model) -> Vocabulary:
    """The vocabulary of a target Model for llguidance, built once per model (about 1 s for 100k
    tokens, most of it reading each token's bytes through llama.cpp)."""
    import llguidance

    with _tokenizers_lock:
        tok = _tokenizers.get(model)
        if tok is None:
            vocab = _LlamaVocab(model)
            llg = llguidance.LLTokenizer(llguidance.TokenizerWrapper(vocab), n_vocab=model.n_vocab,
                                         eos_token=vocab.eog_ids or None)
            tok = Vocabulary(llg, {vocab.tokens[t].decode("utf-8", "replace"): t for t in vocab.special_token_ids},
                             frozenset(vocab.eog_ids))
            _tokenizers[model] = tok
        return tok
