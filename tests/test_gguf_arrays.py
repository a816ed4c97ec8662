"""GGUF metadata arrays are untrusted sizes (issue 31): a tokenizer's per-token arrays are
bounded by the vocabulary, any other long array is read from the file only when used, so a 40 MB
array costs megabytes, not the gigabyte its Python objects would."""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from gguf import GGUFValueType as T

from laguna_dflash.convert.errors import UserError
from laguna_dflash.convert.gguf.header import EAGER_ARRAY_MAX, MAX_VOCAB, LazyArray, read_header
from laguna_dflash.runtime import assets
from gguf_mutate import Source

REPO = Path(__file__).resolve().parent.parent
TOKENS = "tokenizer.ggml.tokens"


@pytest.fixture(scope="module")
def target() -> Source:
    return Source.of(assets.TINY_TARGET)


def array(sub: T, payload: bytes, n: int) -> bytes:
    return struct.pack("<IIQ", int(T.ARRAY), int(sub), n) + payload


def strings(n: int, s: bytes = b"x") -> bytes:
    one = struct.pack("<Q", len(s)) + s
    return one * n


def peak_rss_mb(code: str) -> float:
    """Peak RSS growth (MiB) of running ``code`` in a fresh interpreter after the imports."""
    script = "\n".join([
        "import resource",
        "from laguna_dflash.convert.gguf.header import read_header",
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss",
        textwrap.dedent(code),
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)",
    ])
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return float(out.stdout.split()[-1])


@pytest.mark.parametrize("sub", [T.UINT8, T.INT32, T.STRING])
def test_a_40_mb_array_is_read_lazily_and_costs_little(tmp_path, target, sub):
    out = tmp_path / "big.gguf"
    size = 40 << 20
    if sub == T.STRING:  # a million short strings: 60 MiB of bytes objects if decoded
        n = size // 40
        payload = strings(n, b"x" * 32)
    else:
        width = 1 if sub == T.UINT8 else 4
        n = size // width
        payload = bytes(size)
    target.write_record(out, "laguna.unused_big_array", array(sub, payload, n), replace=False)
    grown = peak_rss_mb(f"""
h = read_header({str(out)!r})
v = h.fields["laguna.unused_big_array"].value
assert len(v) == {n} and h.fields["{TOKENS}"].value == read_header({str(assets.TINY_TARGET)!r}).fields["{TOKENS}"].value
""")
    # the file is memory-mapped while it is read: its pages count once, the array's objects never
    assert grown < 120, f"reading the header grew the peak RSS by {grown:.0f} MiB"
    h = read_header(out)
    v = h.fields["laguna.unused_big_array"].value
    assert isinstance(v, LazyArray) and len(v) == n
    assert v[3] == (b"x" * 32 if sub == T.STRING else 0)
    if sub != T.STRING:
        assert v[-1] == v[0] == 0
    assert "read on use" in repr(v)


def test_short_arrays_stay_lists(tmp_path, target):
    out = tmp_path / "short.gguf"
    n = EAGER_ARRAY_MAX
    target.write_record(out, "laguna.short_array", array(T.UINT8, bytes(range(256)) * (n // 256), n), replace=False)
    v = read_header(out).fields["laguna.short_array"].value
    assert isinstance(v, list) and len(v) == n and v[:3] == [0, 1, 2]


def test_tokenizer_arrays_are_bounded_by_the_vocabulary(tmp_path, target):
    n_vocab = len(target.fields[TOKENS].value)
    cases = {
        "tokenizer.ggml.scores": array(T.FLOAT32, bytes(4 * (n_vocab + 1)), n_vocab + 1),
        "tokenizer.ggml.token_type": array(T.INT32, bytes(4 * (n_vocab * 50)), n_vocab * 50),
        "tokenizer.ggml.merges": array(T.STRING, strings(n_vocab + 1, b"a b"), n_vocab + 1),
    }
    for key, encoded in cases.items():
        out = tmp_path / f"{key}.gguf"
        target.write_record(out, key, encoded)
        with pytest.raises(UserError) as e:
            read_header(out)
        assert str(e.value).startswith(f"{out}: not a readable GGUF file ({key}: ")
        assert f"expected at most {n_vocab} (one per token of {TOKENS})" in str(e.value)
    out = tmp_path / "tokens.gguf"
    target.write_record(out, TOKENS, array(T.STRING, strings(MAX_VOCAB + 1), MAX_VOCAB + 1))
    with pytest.raises(UserError, match=rf"{TOKENS}: {MAX_VOCAB + 1} elements, expected at most {MAX_VOCAB}"):
        read_header(out)


def test_the_cli_refuses_an_oversized_vocabulary_in_one_line(tmp_path, target):
    out = tmp_path / "tokens.gguf"
    target.write_record(out, "tokenizer.ggml.token_type", array(T.INT32, bytes(40 << 20), 10 << 20))
    r = subprocess.run([sys.executable, "-m", "laguna_dflash.runtime.cli", "-m", str(out), "-p", "x", "-n", "1"],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "tokenizer.ggml.token_type" in lines[0] and "one per token" in lines[0], lines
