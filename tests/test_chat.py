"""laguna_dflash.runtime.chat: Laguna's reasoning and tool calls out of generated text.

Every rule is checked through :func:`outcome`, which parses the text whole and streamed under
many random splits (fixed seeds) and requires the same message from both: the streamed and
the non-streamed readings of each rule are tested together."""

from __future__ import annotations

import json
import random
import time

import pytest

from laguna_chat import TOOL_HISTORY, WEATHER_TOOL, laguna_template
from laguna_dflash.runtime.chat import (ReasoningMarkers, ResponseParser, decode_value, message_from_deltas,
                                        parse_response, starts_in_reasoning)

FILE_TOOL = {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "content": {"type": ["string", "null"]}, "mode": {"enum": ["w", "a"]},
    "lines": {"type": "integer"}, "flags": {"type": "array"}, "opts": {"anyOf": [{"type": "string"}]}}}}}
TOOLS = [WEATHER_TOOL, FILE_TOOL]
SPLITS = 120


def summary(message: dict) -> tuple:
    """What must agree between streaming and not: text fields, names and exact argument text."""
    calls = []
    for call in message["tool_calls"]:
        assert call["id"].startswith("call_") and call["type"] == "function"
        json.loads(call["function"]["arguments"])  # always valid JSON
        calls.append((call["function"]["name"], call["function"]["arguments"]))
    return message["content"], message["reasoning_content"], calls


def streamed(text: str, cuts: list[int], **kw) -> dict:
    parser = ResponseParser(kw.get("tools"), kw.get("reasoning", False),
                            tool_calls=kw.get("tool_calls", True),
                            parallel_tool_calls=kw.get("parallel_tool_calls", True))
    deltas, start = [], 0
    for cut in [*cuts, len(text)]:
        deltas += parser.feed(text[start:cut])
        start = cut
    deltas += parser.finish()
    return message_from_deltas(deltas)


def random_cuts(rng: random.Random, n: int) -> list[int]:
    if n < 2:
        return []
    return sorted(rng.sample(range(1, n), rng.randint(1, min(n - 1, 40))))


def outcome(text: str, **kw) -> dict:
    """The message of ``text``, after checking that every split of it streams to the same one
    (one character at a time, and ``SPLITS`` random splits)."""
    whole = parse_response(text, **kw)
    expected = summary(whole)
    rng = random.Random(hash(text) & 0xFFFF)
    splits = [list(range(1, len(text)))] + [random_cuts(rng, len(text)) for _ in range(SPLITS)]
    for cuts in splits:
        assert summary(streamed(text, cuts, **kw)) == expected, cuts
    return whole


def args(message: dict, i: int = 0):
    return json.loads(message["tool_calls"][i]["function"]["arguments"])


def names(message: dict) -> list[str]:
    return [c["function"]["name"] for c in message["tool_calls"]]


# ---------------------------------------------------------------------- §3.1 surface forms

TIGHT = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>" \
        "<arg_value>2</arg_value></tool_call>"
NEWLINE = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>" \
          "\n<arg_value>2</arg_value>\n</tool_call>"


@pytest.mark.parametrize("text", [TIGHT, NEWLINE, f"\n{NEWLINE}\n"], ids=["tight-2.1", "newline-XS.2", "padded"])
def test_both_surface_forms(text):
    m = outcome(text, tools=TOOLS)
    assert names(m) == ["get_weather"] and args(m) == {"city": "Paris", "days": 2}
    assert m["content"] is None and m["reasoning_content"] is None
    assert m["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris", "days": 2}'  # json.dumps' separators


@pytest.mark.parametrize("text", ["<tool_call>now</tool_call>", "<tool_call>now\n</tool_call>",
                                  "<tool_call> now </tool_call>"])
def test_zero_argument_calls(text):
    m = outcome(text)
    assert names(m) == ["now"] and m["tool_calls"][0]["function"]["arguments"] == "{}"


@pytest.mark.parametrize("sep", ["", "\n", "\n\n  "])
def test_several_calls_back_to_back(sep):
    m = outcome(TIGHT + sep + "<tool_call>now</tool_call>" + sep + NEWLINE, tools=TOOLS)
    assert names(m) == ["get_weather", "now", "get_weather"] and args(m, 2) == {"city": "Paris", "days": 2}


def test_names_and_keys_are_trimmed_inner_spaces_kept():
    m = outcome("<tool_call>  get weather  <arg_key> city </arg_key><arg_value>x</arg_value></tool_call>")
    assert names(m) == ["get weather"] and args(m) == {"city": "x"}


def test_values_are_raw_text_between_the_tags():
    code = 'if a < b and "q" in s:\n    print(\'<tag>\')\n'
    m = outcome(f"<tool_call>write_file<arg_key>path</arg_key><arg_value>a.py</arg_value><arg_key>content"
                f"</arg_key><arg_value>{code}</arg_value></tool_call>", tools=TOOLS)
    assert args(m) == {"path": "a.py", "content": code}


# ---------------------------------------------------------------------- §3.2 reference behaviour


def test_content_before_the_first_call_is_kept_as_written():
    m = outcome("Let me check.\n\n" + TIGHT, tools=TOOLS)
    assert m["content"] == "Let me check.\n\n" and names(m) == ["get_weather"]


def test_whitespace_only_content_before_a_call_is_null():
    assert outcome(" \n\n" + TIGHT, tools=TOOLS)["content"] is None


def test_text_without_calls_is_content_unchanged():
    assert outcome("  plain answer\n")["content"] == "  plain answer\n"
    assert outcome(" \n ")["content"] == " \n "
    assert outcome("")["content"] is None


def test_text_between_and_after_calls_is_dropped():
    m = outcome("before" + TIGHT + " between " + TIGHT + " after <b>", tools=TOOLS)
    assert m["content"] == "before" and len(m["tool_calls"]) == 2


def test_string_typed_values_are_verbatim():
    m = outcome("<tool_call>get_weather<arg_key>city</arg_key><arg_value>\n  Paris \n</arg_value>"
                "<arg_key>days</arg_key><arg_value> 3 </arg_value></tool_call>", tools=TOOLS)
    assert args(m) == {"city": "\n  Paris \n", "days": 3}


def test_other_values_are_stripped_and_decoded():
    m = outcome("<tool_call>write_file<arg_key>lines</arg_key><arg_value> 12\n</arg_value><arg_key>flags</arg_key>"
                "<arg_value>['a', 'b']</arg_value><arg_key>opts</arg_key><arg_value>{\"k\": [1, true, null]}"
                "</arg_value><arg_key>path</arg_key><arg_value>42</arg_value></tool_call>", tools=TOOLS)
    assert args(m) == {"lines": 12, "flags": ["a", "b"], "opts": {"k": [1, True, None]}, "path": "42"}


def test_nullable_strings_and_string_enums_count_as_strings():
    m = outcome("<tool_call>write_file<arg_key>content</arg_key><arg_value> 1 </arg_value><arg_key>mode</arg_key>"
                "<arg_value>w</arg_value></tool_call>", tools=TOOLS)
    assert args(m) == {"content": " 1 ", "mode": "w"}


def test_values_without_a_schema_are_decoded():
    m = outcome("<tool_call>f<arg_key>n</arg_key><arg_value>42</arg_value><arg_key>b</arg_key><arg_value>true"
                "</arg_value><arg_key>s</arg_key><arg_value> hello </arg_value><arg_key>p</arg_key><arg_value>True"
                "</arg_value><arg_key>q</arg_key><arg_value>\"quoted\"</arg_value></tool_call>")
    assert args(m) == {"n": 42, "b": True, "s": "hello", "p": True, "q": "quoted"}


def test_a_known_tool_with_an_unknown_key_decodes_that_key():
    m = outcome("<tool_call>get_weather<arg_key>unit</arg_key><arg_value>3</arg_value></tool_call>", tools=TOOLS)
    assert args(m) == {"unit": 3}


@pytest.mark.parametrize("text, value", [
    ("NaN", "NaN"), ("1e999", "1e999"), ("{1, 2}", "{1, 2}"), ("[" * 5000, "[" * 5000), ("(1, 2)", "(1, 2)"),
    ("b'x'", "b'x'"), ("[1, 2,]", [1, 2]), ("None", None), ("", ""),
])
def test_decoding_never_fails_and_gives_json_data(text, value):
    assert decode_value(text) == value


def test_pairs_that_are_not_complete_are_skipped():
    m = outcome("<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value><arg_value>orphan</arg_value>"
                "<arg_key>novalue</arg_key> junk <arg_key>b</arg_key>\n<arg_value>2</arg_value></tool_call>")
    assert args(m) == {"a": 1, "b": 2}


def test_calls_to_tools_the_request_did_not_list_are_returned():
    m = outcome("<tool_call>rm_rf<arg_key>path</arg_key><arg_value>/</arg_value></tool_call>", tools=TOOLS)
    assert names(m) == ["rm_rf"] and args(m) == {"path": "/"}


@pytest.mark.parametrize("block", ["<tool_call></tool_call>", "<tool_call>   \n</tool_call>",
                                   "<tool_call><arg_key>a</arg_key><arg_value>1</arg_value></tool_call>",
                                   "<tool_call>f <x>junk</tool_call>", "<tool_call>f\nnot a tag</tool_call>"])
def test_a_block_that_is_not_a_call_is_text(block):
    m = outcome("A " + block + " B")
    assert m["tool_calls"] == [] and m["content"] == "A " + block + " B"
    # after a call, it is dropped as any text after a call
    m = outcome(TIGHT + block, tools=TOOLS)
    assert names(m) == ["get_weather"] and m["content"] is None


@pytest.mark.parametrize("text", [
    "<tool_call>write_file<arg_key>path</arg_key><arg_value>a.py</arg_value><arg_key>content</arg_key>"
    "<arg_value>line 1\nline",
    "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Par",  # max_tokens reached mid-call
    "<tool_call>f<arg_key>n</arg_key><arg_value>12", "<tool_call>f<arg_key>n</arg_key>", "<tool_call>f<arg_key>",
    "<tool_call>f<arg_key>n</arg_key><arg_value>1</arg_value>", "<tool_call>f<arg_key>n</arg_key><arg_value>1</arg_"])
def test_a_call_cut_by_the_end_is_no_call_but_its_text_verbatim(text):
    for prefix in ("", "Let me look. ", "  \n"):
        m = outcome(prefix + text, tools=TOOLS)
        assert m["tool_calls"] == [] and m["content"] == prefix + text
        deltas = [d for step in feed_all(ResponseParser(TOOLS), list(prefix + text)) for d in step]
        assert not any("tool_calls" in d for d in deltas), deltas
    # after a complete call it is dropped, as any text after a call: the complete one stands
    m = outcome(TIGHT + text, tools=TOOLS)
    assert names(m) == ["get_weather"] and m["content"] is None


@pytest.mark.parametrize("text", ["<tool_call>", "<tool_call>get_wea", "<tool_call>get_weather\n",
                                  "<tool_call>get_weather<arg_ke", "ok <tool_"])
def test_a_block_cut_before_its_name_ends_is_text(text):
    m = outcome(text)
    assert m["tool_calls"] == [] and m["content"] == text


def test_a_value_cut_by_the_end_of_the_call_is_kept():
    m = outcome("<tool_call>write_file<arg_key>path</arg_key><arg_value>a</tool_call>", tools=TOOLS)
    assert args(m) == {"path": "a"}


def test_a_repeated_key_keeps_its_first_value():
    m = outcome("<tool_call>write_file<arg_key>path</arg_key><arg_value>first</arg_value><arg_key>path</arg_key>"
                "<arg_value>second</arg_value><arg_key>lines</arg_key><arg_value>1</arg_value><arg_key>lines"
                "</arg_key><arg_value>2</arg_value></tool_call>", tools=TOOLS)
    assert args(m) == {"path": "first", "lines": 1}
    assert m["tool_calls"][0]["function"]["arguments"].count('"path"') == 1


def test_tool_calls_off_reads_the_markup_as_text():
    m = outcome(TIGHT, tools=TOOLS, tool_calls=False)
    assert m["tool_calls"] == [] and m["content"] == TIGHT


def test_parallel_tool_calls_off_keeps_the_first_call():
    m = outcome(TIGHT + "<tool_call>now</tool_call>" + TIGHT, tools=TOOLS, parallel_tool_calls=False)
    assert names(m) == ["get_weather"]


# ---------------------------------------------------------------------- linear time (§3.2 rule 8)


def parse_seconds(text: str, chunk: int) -> float:
    parser = ResponseParser(TOOLS)
    t0 = time.perf_counter()
    for i in range(0, len(text), chunk):
        parser.feed(text[i:i + chunk])
    parser.finish()
    return time.perf_counter() - t0


ADVERSARIAL = {
    "vllm-regression": "<tool_call>" + " " * 4096 + "<x",  # >100 s in vLLM's parser before its fix
    "closed-junk-blocks": "<tool_call>" + " " * 100 + "<x</tool_call>",
    "open-key": "<tool_call>f<arg_key>" + "<" * 50,
    "near-closers": "<tool_call>f<arg_key>k</arg_key><arg_value>" + "</arg_valu" * 20,
    "reasoning-markers": "</think><think><" * 10,
    "string-value": "<tool_call>write_file<arg_key>content</arg_key><arg_value>" + "<" * 30 + "</arg_value></tool_call>",
}


@pytest.mark.parametrize("unit", ADVERSARIAL.values(), ids=ADVERSARIAL.keys())
def test_adversarial_input_parses_in_linear_time(unit):
    # whole (100k characters) and in 7-character pieces (25k): the time grows about 4x from n
    # to 4n (quadratic: 16x); the bounds are loose so that a busy machine cannot fail them
    for n, chunk in ((100_000, None), (25_000, 7)):
        text = (unit * (n // len(unit) + 1))[:n]
        small = min(parse_seconds(text, chunk or n) for _ in range(2))
        large = min(parse_seconds(text * 4, chunk or 4 * n) for _ in range(2))
        assert small < 5.0 and large < 12 * small + 0.5, (small, large)


# ---------------------------------------------------------------------- §3.4 streaming deltas


def feed_all(parser: ResponseParser, pieces: list[str]) -> list[list[dict]]:
    return [parser.feed(p) for p in pieces] + [parser.finish()]


def test_a_call_is_sent_whole_when_it_closes():
    steps = feed_all(ResponseParser(TOOLS), ["Hi <", "tool_call>write_", "file<arg_key>path</arg_key><arg_value>a",
                                             ".p", "y</arg_", "value><arg_key>lines</arg_key><arg_value>1",
                                             "2</arg_value></tool_call>", "after"])
    assert steps[0] == [{"content": "Hi "}]  # "<" held back: it may open a tag
    assert steps[1:6] == [[]] * 5  # nothing of the call until its </tool_call>: it may never close
    [delta] = steps[6]
    head = delta["tool_calls"][0]
    assert head["index"] == 0 and head["type"] == "function" and head["id"].startswith("call_")
    assert head["function"] == {"name": "write_file", "arguments": '{"path": "a.py", "lines": 12}'}
    assert steps[7] == [] and steps[8] == []  # text after a call is dropped


def test_string_values_are_json_escaped():
    steps = feed_all(ResponseParser(TOOLS), ["<tool_call>write_file<arg_key>content</arg_key><arg_value>",
                                             'a "q"\n', "\\ é\t", "</arg_value></tool_call>"])
    [piece] = [d["tool_calls"][0]["function"]["arguments"] for step in steps for d in step]
    assert piece == '{"content": "a \\"q\\"\\n\\\\ é\\t"}'


def test_a_second_call_has_the_next_index():
    deltas = [d for step in feed_all(ResponseParser(), [TIGHT, TIGHT]) for d in step]
    heads = [d["tool_calls"][0] for d in deltas if "id" in d["tool_calls"][0]]
    assert [h["index"] for h in heads] == [0, 1] and heads[0]["id"] != heads[1]["id"]


def test_empty_pieces_and_a_finished_parser():
    parser = ResponseParser()
    assert parser.feed("") == [] and parser.feed("x") == [{"content": "x"}] and parser.finish() == []
    assert parser.finish() == []
    with pytest.raises(RuntimeError):
        parser.feed("more")


# ---------------------------------------------------------------------- §4 reasoning


def test_reasoning_then_answer_then_calls():
    m = outcome("Need data.</think>Checking.\n" + TIGHT, tools=TOOLS, reasoning=True)
    assert (m["reasoning_content"], m["content"], names(m)) == ("Need data.", "Checking.\n", ["get_weather"])


def test_no_end_of_reasoning_means_all_reasoning():
    m = outcome("still thinking <tool_", reasoning=True)
    assert (m["reasoning_content"], m["content"]) == ("still thinking <tool_", None)


def test_reasoning_with_nothing_after_has_null_content():
    m = outcome("plan</think>", reasoning=True)
    assert (m["reasoning_content"], m["content"]) == ("plan", None)


def test_a_repeated_opening_think_is_dropped():
    m = outcome("<think>plan</think>answer", reasoning=True)
    assert (m["reasoning_content"], m["content"]) == ("plan", "answer")
    m = outcome("a<think>b</think>c", reasoning=True)
    assert (m["reasoning_content"], m["content"]) == ("ab", "c")


def test_whitespace_around_reasoning_is_verbatim():  # the newline layout
    m = outcome("\nplan\n</think>\n\nanswer", reasoning=True)
    assert (m["reasoning_content"], m["content"]) == ("\nplan\n", "\n\nanswer")


def test_a_stray_end_of_reasoning_with_thinking_off_is_dropped():
    m = outcome("</think>answer</think> more")
    assert (m["reasoning_content"], m["content"]) == (None, "answer more")


def test_think_in_the_answer_starts_reasoning_again():
    m = outcome("answer<think>second thoughts</think> done")
    assert (m["reasoning_content"], m["content"]) == ("second thoughts", "answer done")


def test_a_tool_call_inside_reasoning_ends_it():
    m = outcome("I will call." + TIGHT, tools=TOOLS, reasoning=True)
    assert (m["reasoning_content"], m["content"], names(m)) == ("I will call.", None, ["get_weather"])


def test_a_split_end_of_reasoning_is_found():
    parser = ResponseParser(reasoning=True)
    assert parser.feed("plan</th") == [{"reasoning_content": "plan"}]
    assert parser.feed("ink>ans") == [{"content": "ans"}]


@pytest.mark.parametrize("thinking", [True, False])
def test_the_reasoning_state_comes_from_the_rendered_prompt(thinking):
    prompt = laguna_template().render(TOOL_HISTORY + [{"role": "user", "content": "And tomorrow?"}],
                                      template_kwargs={"enable_thinking": thinking})
    assert "</think>" in prompt  # earlier turns closed their reasoning: the scan stops at <assistant>
    assert starts_in_reasoning(prompt) is thinking


@pytest.mark.parametrize("prompt, inside", [
    ("<assistant>\n<think>", True), ("<assistant>\n</think>", False),  # the XS.2 generation prompts
    ("<think>x</think><assistant>", False),  # a turn opened with nothing after it
    ("<system>tools: </think></system><user>q</user><assistant><think>", True),
    ("<user>say <think></user><assistant>", False), ("no markers at all", False), ("", False),
])
def test_reasoning_state_on_text(prompt, inside):
    assert starts_in_reasoning(prompt) is inside


def test_reasoning_state_on_token_ids():
    laguna = ReasoningMarkers(think=18, end_think=19, assistant=23)
    assert starts_in_reasoning([2, 97, 19, 24, 23, 18], laguna) is True
    assert starts_in_reasoning([2, 18, 5, 23, 19], laguna) is False
    assert starts_in_reasoning([2, 18, 5, 23], laguna) is False  # <assistant> stops the scan
    assert starts_in_reasoning([2, 18, 5], laguna) is True
    assert starts_in_reasoning([], laguna) is False
    with pytest.raises(TypeError):
        starts_in_reasoning([18])


# ---------------------------------------------------------------------- chunking invariance, broadly

CASES = [
    TIGHT, NEWLINE, "Let me look.\n" + TIGHT + TIGHT,
    "Need data.</think>" + TIGHT, "\nplan\n</think>\nok\n" + NEWLINE + "\n",
    "<tool_call>write_file<arg_key>content</arg_key><arg_value>a</arg_valu</arg_value>b</arg_value></tool_call>",
    "<tool_call>write_file<arg_key>content</arg_key><arg_value><<</</arg</arg_value></tool_call>",
    "x <tool_ca <tool_call> <tool_call>f</tool_call> </tool_call> y",
    "<think><think></think></think><tool_call>a</tool_call>",
    "é😀 <tool_call>get_weather<arg_key>city</arg_key><arg_value>Zürich 😀</arg_value></tool_call>",
    "<tool_call>f<arg_key>a</arg_key>   \n <arg_value>[1,\n 2]</arg_value></tool_call>",
]


@pytest.mark.parametrize("reasoning", [False, True])
@pytest.mark.parametrize("text", CASES)
def test_every_split_streams_to_the_whole_message(text, reasoning):
    outcome(text, tools=TOOLS, reasoning=reasoning)
    outcome(text, reasoning=reasoning)


FRAGMENTS = ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<think>",
             "</think>", "<", "</", "<tool_", "</arg_", " ", "\n", "get_weather", "city", "path", "days", "Paris",
             "12", "true", '"q"', "[1]", "x", "é"]


def test_random_markup_streams_to_the_whole_message():
    rng = random.Random(1234)
    for _ in range(200):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 30)))
        kw = {"tools": TOOLS if rng.random() < 0.5 else None, "reasoning": rng.random() < 0.5}
        expected = summary(parse_response(text, **kw))
        for _ in range(20):
            assert summary(streamed(text, random_cuts(rng, len(text)), **kw)) == expected, text
