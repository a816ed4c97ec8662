"""``tool_choice`` ``required`` and a named function through laguna-run serve (bundled pair,
Laguna 2.1's template, F32 cache, loopback) and the official ``openai`` client.

The bundled target never calls a tool by itself (tests/test_server_chat.py scripts its calls),
so a call here is the constraint's doing: every one is parsed by the same reader as a free call
and validates against its tool's schema; greedy speculative output equals plain greedy output;
the stream rebuilds the whole reply; a function that is not among the tools is a 400 naming
``tool_choice`` and the server goes on."""

from __future__ import annotations

import json

import jsonschema
import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from helpers.scripted_model import scripted  # noqa: E402
from server_harness import laguna_chat_server, openai_client as client  # noqa: E402

# string arguments are bounded: the target, forced into an unbounded one, writes until max_tokens
TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {
        "type": "object", "properties": {"path": {"type": "string", "maxLength": 30},
                                           "limit": {"type": "integer", "minimum": 1, "maximum": 999}},
        "required": ["path"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the code.", "parameters": {
        "type": "object", "properties": {"query": {"type": "string", "maxLength": 20}, "regex": {"type": "boolean"}},
        "required": ["query", "regex"]}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [{"role": "user", "content": "def find(pattern):\n    # look it up\n    "}]
NAMED = {"type": "function", "function": {"name": "search"}}
MAX_TOKENS = 200


@pytest.fixture(scope="module")
def srv(models):
    with laguna_chat_server(models) as s:
        yield s



def calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or ()]


def ask(s, tool_choice, n_max: int = 4, **kwargs):
    return client(s).chat.completions.create(model="laguna-tiny", messages=MESSAGES, tools=TOOLS,
                                             tool_choice=tool_choice, max_tokens=MAX_TOKENS, temperature=0,
                                             extra_body={"n_max": n_max, **kwargs.pop("extra_body", {})}, **kwargs)


@pytest.mark.parametrize("tool_choice, kwargs", [("required", {"parallel_tool_calls": False}), (NAMED, {})],
                         ids=["required", "named"])
def test_a_forced_call_is_parsed_valid_exact_under_speculation_and_streams_alike(srv, tool_choice, kwargs):
    spec = ask(srv, tool_choice, 4, **kwargs)
    plain = ask(srv, tool_choice, 0, **kwargs)
    choice = spec.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    made = calls(choice.message)
    assert len(made) == 1, made
    name, arguments = made[0]
    jsonschema.validate(arguments, SCHEMAS[name])
    if tool_choice is NAMED:
        assert name == "search"
    assert choice.message.tool_calls[0].id.startswith("call_")
    # greedy speculative output is plain greedy output, token for token
    assert spec.model_extra["timings"]["draft_n"] > 0 and plain.model_extra["timings"]["draft_n"] == 0
    assert calls(plain.choices[0].message) == made and plain.choices[0].finish_reason == "tool_calls"
    assert plain.usage.completion_tokens == spec.usage.completion_tokens < MAX_TOKENS
    # streamed, through the client's own accumulation: the same reply
    c = client(srv)
    with c.chat.completions.stream(model="laguna-tiny", messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice,
                                   max_tokens=MAX_TOKENS, temperature=0, extra_body={"n_max": 4}, **kwargs) as stream:
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls" and calls(final.message) == made and not final.message.content


def test_parallel_tool_calls_false_makes_the_grammar_stop_after_one_call(srv):
    several = ask(srv, "required").choices[0]  # the target writes call after call when it may
    assert several.finish_reason == "length" and len(several.message.tool_calls) > 1
    for name, arguments in calls(several.message)[:-1]:  # the last one is cut by max_tokens
        jsonschema.validate(arguments, SCHEMAS[name])
    one = ask(srv, "required", parallel_tool_calls=False)
    assert one.choices[0].finish_reason == "tool_calls" and len(one.choices[0].message.tool_calls) == 1
    assert one.usage.completion_tokens < MAX_TOKENS  # it ended there, not cut by the parser


def test_with_thinking_on_the_reasoning_runs_free_then_the_call(srv, models):
    with scripted(models[0]) as script:
        # the script's tokens must pass the constraint: reasoning first, so a constraint that
        # forced the call at once would refuse them
        script.say("Look it up in the code.</think>")
        r = ask(srv, NAMED, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    choice = r.choices[0]
    assert choice.message.model_extra["reasoning_content"] == "Look it up in the code."
    assert choice.finish_reason == "tool_calls" and [name for name, _ in calls(choice.message)] == ["search"]
    jsonschema.validate(calls(choice.message)[0][1], SCHEMAS["search"])


def test_response_format_gives_way_to_a_forced_call(srv):
    with_format = ask(srv, NAMED, response_format={"type": "json_object"}).choices[0]
    without = ask(srv, NAMED).choices[0]
    assert with_format.finish_reason == "tool_calls" and calls(with_format.message) == calls(without.message)


@pytest.mark.parametrize("body, param", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "delete_everything"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "grammar": 'root ::= "x"'}, "grammar"),
    ({"tools": TOOLS, "tool_choice": NAMED, "json_schema": {"type": "object"}}, "json_schema"),
], ids=["unknown-function", "no-tools", "grammar", "json-schema"])
def test_a_forced_call_that_cannot_be_made_is_a_400_and_the_server_goes_on(srv, body, param):
    with httpx.Client(base_url=srv.url, timeout=120) as h:
        r = h.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 8, **body})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and err["message"].startswith(f"{param}: expected "), err
        assert err["type"] == "invalid_request_error" and "\n" not in err["message"]
        if param == "tool_choice" and "tools" in body:
            assert "delete_everything" in err["message"] and "search" in err["message"]
    assert calls(ask(srv, NAMED).choices[0].message)[0][0] == "search"
