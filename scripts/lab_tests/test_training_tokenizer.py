"""The training scripts' tokenizer with ``isolate_spaces`` (tests/helpers/tiny_target.py): a word
is the same tokens after a space as anywhere else, and llama.cpp, told that the vocabulary
pre-tokenizes like GPT-2, splits text into exactly the tokens transformers trained on."""

from __future__ import annotations

import pytest

pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

from scripts.training import agent_pair, demo_pair  # noqa: E402
from tests.helpers import tiny_target  # noqa: E402

TEXTS = [
    "Find the definition of `yiq_to_rgb`.",
    "<tool_call>grep<arg_key>text</arg_key><arg_value>def yiq_to_rgb(</arg_value></tool_call>",
    "Compute 194 * 335 - 224. <arg_value>print(194 * 335 - 224)</arg_value>",
    # contractions: the GPT-2 regex's first alternatives, where splitting spaces first went wrong
    "x = 'super' if y == 'store_true' else 'decode'  # it's 'red', we'd 'multipart/form'",
    "def f(a, b):\n    return {'s': a,\n\n        'd': b}\t# tabs\tand  two  spaces\n",
]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    d = tmp_path_factory.mktemp("isolated")
    tiny_target.build_tokenizer(d, 1024, demo_pair.training_files()[:6], specials=agent_pair.SPECIALS,
                                texts=TEXTS * 3, isolate_spaces=True)
    transformers.LagunaConfig(**agent_pair.target_config(8), architectures=["LagunaForCausalLM"]).save_pretrained(d)
    out = tiny_target.convert_to_gguf(d, d / "vocab.gguf", vocab_only=True)
    return d, out


def test_a_word_is_the_same_tokens_after_a_space_as_after_a_backtick(vocab):
    tok = transformers.AutoTokenizer.from_pretrained(vocab[0])

    def ids(s):
        return tok(s, add_special_tokens=False)["input_ids"]

    for word in ("yiq_to_rgb", "textwrap", "194"):
        assert ids(" " + word) == ids(" ") + ids(word)
        assert ids("`" + word + "`")[1:-1] == ids(word)
    assert not [t for t in tok.get_vocab() if "Ġ" in t and set(t) != {"Ġ"}]


def test_llama_cpp_tokenizes_like_transformers(vocab):
    llama_cpp = pytest.importorskip("llama_cpp")
    tok = transformers.AutoTokenizer.from_pretrained(vocab[0])
    model = llama_cpp.Llama(str(vocab[1]), vocab_only=True, verbose=False)
    texts = TEXTS + [p.read_text(encoding="utf-8", errors="replace")[:6000] for p in demo_pair.training_files()[6:12]]
    for text in texts:
        assert model.tokenize(text.encode(), add_bos=False, special=True) == tok(text, add_special_tokens=False)["input_ids"]
