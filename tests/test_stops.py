"""Stop strings, cut in one place (runtime/stops.py, inside the engine): generate, stream, the
CLI and the server cut at the first occurrence of any stop string of any length, print none of
it, stop generating there and report "stop"; streamed text equals the whole text."""

from __future__ import annotations

import codecs
import json
import random

import pytest

from laguna_dflash.runtime import assets
from laguna_dflash.runtime.cli import main
from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions
from laguna_dflash.runtime.request import RequestError
from laguna_dflash.runtime.stops import TextCutter

N_PREDICT = 64
PROMPT = "def quicksort(xs):"


def expected_cut(chunks: list[bytes], stops) -> tuple[str, int | None]:
    """The text a generation of these byte chunks (tokens) shows when it stops at the first
    chunk that completes any stop string, cut where the earliest stop string it then holds
    begins; and how many chunks it took (None: no stop string)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = ""
    for k, chunk in enumerate(chunks, 1):
        text += decoder.decode(chunk)
        hits = [i for i in (text.find(s) for s in stops) if i >= 0]
        if hits:
            return text[:min(hits)], k
    return text + decoder.decode(b"", final=True), None


# ---------------------------------------------------------------------- the cutter alone


def test_cutter_property_random_text_random_chunks_random_stops():
    rng = random.Random(7)
    alphabet = "ab\u00e9\u4e2d\U0001f600 \n"
    for _ in range(600):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        stops = tuple(
            text[i:i + rng.randint(1, 12)] if text and rng.random() < 0.8 else rng.choice(alphabet) * rng.randint(1, 3)
            for i in (rng.randrange(max(1, len(text))) for _ in range(rng.randint(1, 3))))
        stops = tuple(s for s in stops if s) or ("zz",)
        data = text.encode()
        chunks, i = [], 0
        while i < len(data):  # byte chunks: multi-byte characters are split between tokens
            j = i + rng.randint(1, 5)
            chunks.append(data[i:j])
            i = j
        cutter = TextCutter(stops)
        out = [cutter.feed(c) for c in chunks] + [cutter.finish()]
        want, _ = expected_cut(chunks, stops)
        assert "".join(out) == want, (text, stops, out)
        assert cutter.stopped == any(s in text for s in stops)


def test_cutter_holds_back_only_what_may_start_a_stop_string():
    cutter = TextCutter(("get_r",))
    assert cutter.feed(b"self.path.") == "self.path."
    assert cutter.feed(b"get_") == ""  # may be the start of the stop string: held
    assert cutter.feed(b"re") == "" and cutter.stopped


def test_empty_stop_string_is_refused_by_the_request_itself():
    for stops in (("",), ("x", "")):
        with pytest.raises(RequestError) as e:
            GenerateOptions(stop=stops)
        assert e.value.field == "stop"
    assert GenerateOptions(stop="\n\n").stop == ("\n\n",)


# ---------------------------------------------------------------------- the engine


@pytest.fixture(scope="module")
def engine():
    target, drafter = assets.default_pair(None)
    with Engine.load(target, drafter, EngineConfig(n_ctx=1024, kv_type="f32", n_threads=1)) as eng:
        yield eng


@pytest.fixture(scope="module")
def full(engine):
    res = engine.generate(PROMPT, GenerateOptions(n_predict=N_PREDICT, n_max=4))
    assert res.stop_reason == "length"
    return res


def token_ends(engine, tokens) -> list[int]:
    """Character offsets where each token's text ends (for stops that end inside a token)."""
    ends, n = [], b""
    for t in tokens:
        n += engine.target.token_bytes(t)
        ends.append(len(n.decode("utf-8", errors="replace")))
    return ends


def check_stop_set(engine, full, stops, n_max):
    opts = GenerateOptions(n_predict=N_PREDICT, n_max=n_max, stop=stops)
    whole = engine.generate(PROMPT, opts)
    streamed = "".join(engine.stream(PROMPT, opts))
    want, k = expected_cut([engine.target.token_bytes(t) for t in full.tokens], stops)
    assert whole.text == streamed == want, stops
    assert whole.stop_reason == "stop"
    # generation stopped at the token that completes the first stop string, not later
    assert whole.tokens == full.tokens[:k]


def test_stream_equals_generate_for_random_stop_sets_from_the_text(engine, full):
    rng = random.Random(3)
    text = full.text
    ends = token_ends(engine, full.tokens)
    inside = [e - 1 for e, prev in zip(ends[1:], ends) if e - prev >= 2]  # ends inside a token
    for trial in range(24):
        stops = []
        for _ in range(rng.randint(1, 3)):
            kind = rng.choice(["short", "long", "inside"])
            if kind == "inside" and inside:
                end = rng.choice(inside)
                start = max(0, end - rng.randint(1, 6))
            elif kind == "long":  # spans many tokens (more than the 16 the old check decoded)
                start = rng.randrange(0, len(text) // 3)
                end = min(len(text), start + rng.randint(len(text) // 3, len(text) - start))
            else:
                start = rng.randrange(0, len(text) - 1)
                end = start + rng.randint(1, 4)
            if text[start:end]:
                stops.append(text[start:end])
        check_stop_set(engine, full, tuple(stops), n_max=rng.choice([0, 2, 4, "auto"]))


def test_a_stop_string_longer_than_sixteen_tokens_is_found(engine, full):
    ends = token_ends(engine, full.tokens)
    start, end = ends[2], ends[40] - 1  # 38 tokens, ending inside the 41st's text or at a boundary
    stop = full.text[start:end]
    check_stop_set(engine, full, (stop,), n_max=4)


# ---------------------------------------------------------------------- the CLI (issue 33's example)


def test_cli_stream_prints_no_byte_of_the_stop_string(capsys):
    """laguna-run -p "def quicksort(xs):" -n 64 -t 1 --stop get_r printed `...self.path.get_re`."""
    args = ["-p", PROMPT, "-n", str(N_PREDICT), "-t", "1", "--stop", "get_r"]
    assert main([*args, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["stop_reason"] == "stop"  # the bundled pair writes get_r... within 64 tokens
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert printed == PROMPT + res["text"] + "\n"
    assert "get_r" not in printed
