"""laguna-run serve with Laguna's chat contract, on 127.0.0.1 with the bundled pair and Laguna
2.1's own template (the fixture): /apply-template renders the reference's worked examples byte
for byte; tools in, tool_calls out, tool results in, an answer out, through the official
``openai`` client with speculation on; streamed replies rebuild the non-streamed message, by
the client's own streaming helper; /tokenize and /detokenize; the request errors.

The bundled target never writes a tool call: a scripted sampler (tests/helpers/scripted_model.py)
picks the tokens of each reply while the engine, the drafter and the server run as always."""

from __future__ import annotations

import json

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from laguna_chat import (HEAD, TEMPLATE_TEXT, TOOL_HISTORY, TOOL_HISTORY_RENDER, WEATHER_TOOL,  # noqa: E402
                         laguna_template)
from laguna_dflash.runtime.chat import message_from_deltas  # noqa: E402
from helpers.scripted_model import scripted  # noqa: E402
from server_harness import LiveServer, laguna_chat_server, make_pool, openai_client as client  # noqa: E402

OK = [{"role": "user", "content": "Reply with OK."}]
CALL = ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>"
        "<arg_value>2</arg_value></tool_call>")
THINKING = {"enable_thinking": True}


@pytest.fixture(scope="module")
def srv(models):
    with laguna_chat_server(models) as s:
        yield s



def post(s, path: str, body: dict) -> httpx.Response:
    with httpx.Client(base_url=s.url, timeout=60) as h:
        return h.post(path, json=body)


def calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or ()]


# ---------------------------------------------------------------------------- /apply-template


@pytest.mark.parametrize("body, expected", [
    ({"messages": OK, "chat_template_kwargs": {"enable_thinking": False}},
     HEAD + "<user>Reply with OK.</user>\n<assistant></think>"),
    ({"messages": OK, "chat_template_kwargs": THINKING}, HEAD + "<user>Reply with OK.</user>\n<assistant><think>"),
    ({"messages": TOOL_HISTORY, "chat_template_kwargs": THINKING, "add_generation_prompt": False},
     TOOL_HISTORY_RENDER),
    ({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "reasoning": "Hidden plan.",
                                                      "content": "\nAnswer\n"}], "add_generation_prompt": False},
     HEAD + "<user>Q</user>\n<assistant></think>\nAnswer\n</assistant>\n"),
], ids=["thinking-off", "thinking-on", "tool-history", "reasoning-dropped"])
def test_apply_template_renders_the_worked_examples_byte_for_byte(srv, body, expected):
    r = post(srv, "/apply-template", body)
    assert r.status_code == 200 and r.json() == {"prompt": expected}


def test_apply_template_renders_tools_as_the_renderer_does(srv):
    r = post(srv, "/apply-template", {"messages": OK, "tools": [WEATHER_TOOL]})
    assert r.json()["prompt"] == laguna_template().render(OK, tools=[WEATHER_TOOL])


@pytest.mark.parametrize("body, param, words", [
    ({"messages": OK, "chat_template_kwargs": {"messages": []}}, "chat_template_kwargs",
     "chat_template_kwargs.messages"),
    ({"messages": [{"role": "user", "content": None}]}, "messages", "messages[0].content: expected a string"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}, "messages",
     "messages[0].tool_calls[0].function.arguments: expected a JSON object"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages.0.content", "valid string"),
])
def test_request_errors_name_the_field(srv, body, param, words):
    for path in ("/apply-template", "/v1/chat/completions"):
        r = post(srv, path, body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and words in err["message"] and "\n" not in err["message"], err
        assert "content.str" not in err["message"]


def test_the_server_default_template_kwargs_and_the_request_override(models):
    target, path, drafter = models
    with LiveServer(make_pool(target, path, drafter, parallel=1), chat_template=TEMPLATE_TEXT,
                    chat_template_kwargs=THINKING) as s:
        assert post(s, "/apply-template", {"messages": OK}).json()["prompt"].endswith("<assistant><think>")
        assert post(s, "/apply-template", {"messages": OK, "chat_template_kwargs": {"enable_thinking": False}}
                    ).json()["prompt"].endswith("<assistant></think>")


# ---------------------------------------------------------------------------- /tokenize, /detokenize


def test_tokenize_and_detokenize(srv, models):
    target = models[0]
    text = "<think>def f(x):\n    return x</think>"
    tokens = post(srv, "/tokenize", {"content": text}).json()["tokens"]
    assert tokens == target.tokenize(text, add_special=False, parse_special=True)
    assert tokens[0] == target.tokenize("<think>", add_special=False)[0]  # a special token, parsed
    assert post(srv, "/detokenize", {"tokens": tokens}).json() == {"content": text}
    with_bos = post(srv, "/tokenize", {"content": "x", "add_special": True}).json()["tokens"]
    assert with_bos == target.tokenize("x", add_special=True)
    pieces = post(srv, "/tokenize", {"content": "é<think>", "with_pieces": True}).json()["tokens"]
    assert "".join(p["piece"] if isinstance(p["piece"], str) else bytes(p["piece"]).decode("latin-1")
                   for p in pieces).endswith("<think>")
    assert all(set(p) == {"id", "piece"} for p in pieces)
    r = post(srv, "/detokenize", {"tokens": [1, 10 ** 9]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens" and "tokens[1]" in r.json()["error"]["message"]


# ---------------------------------------------------------------------------- tools and reasoning


def test_an_agent_round_trip_through_the_openai_client(srv, models):
    c = client(srv)
    messages = [{"role": "developer", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"}]
    with scripted(models[0]) as script:
        script.say("The user wants the weather.</think>" + CALL, "I have it.</think>It is 18 C in Paris.")
        first = c.chat.completions.create(model="laguna-tiny", messages=messages, tools=[WEATHER_TOOL],
                                          extra_body={"chat_template_kwargs": THINKING, "n_max": 4})
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert calls(choice.message) == [("get_weather", {"city": "Paris", "days": 2})]
        assert choice.message.content is None
        assert choice.message.model_extra["reasoning_content"] == "The user wants the weather."
        timings = first.model_extra["timings"]
        assert timings["n_max"] == 4 and timings["draft_n"] > 0  # speculation ran
        call = choice.message.tool_calls[0]
        messages += [choice.message, {"role": "tool", "tool_call_id": call.id, "content": "18 C"}]
        second = c.chat.completions.create(model="laguna-tiny", messages=messages, tools=[WEATHER_TOOL],
                                           extra_body={"chat_template_kwargs": THINKING, "n_max": 4})
    answer = second.choices[0]
    assert answer.finish_reason == "stop" and answer.message.content == "It is 18 C in Paris."
    assert answer.message.model_extra["reasoning_content"] == "I have it." and not answer.message.tool_calls
    # the second prompt is the first one, its reply as the template renders it, and the tool result
    prompt = post(srv, "/apply-template", {"messages": [m if isinstance(m, dict) else m.model_dump(exclude_unset=True)
                                                        for m in messages],
                                           "tools": [WEATHER_TOOL], "chat_template_kwargs": THINKING}).json()["prompt"]
    assert prompt.endswith("<assistant><think>The user wants the weather.</think>" + CALL + "</assistant>\n"
                           "<tool_response>18 C</tool_response>\n<assistant><think>")
    # ... so the prompt cache held all of the first turn's prompt
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1


MIXED = ("Plan: look it up.\n</think>Checking now.\n" + CALL.replace("Paris", "Zürich \"old town\"\n")
         + "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Bern</arg_value>\n</tool_call>")


def test_streaming_rebuilds_the_non_streamed_message(srv, models):
    c = client(srv)
    kwargs = dict(model="laguna-tiny", messages=OK, tools=[WEATHER_TOOL],
                  extra_body={"chat_template_kwargs": THINKING, "n_max": 4})
    with scripted(models[0]) as script:
        script.say(MIXED, MIXED, MIXED)
        whole = c.chat.completions.create(**kwargs).choices[0]
        with c.chat.completions.stream(**kwargs) as stream:  # the client's own accumulation
            final = stream.get_final_completion().choices[0]
        chunks = list(c.chat.completions.create(stream=True, **kwargs))
    assert whole.finish_reason == final.finish_reason == "tool_calls"
    assert calls(whole.message) == [("get_weather", {"city": 'Zürich "old town"\n', "days": 2}),
                                    ("get_weather", {"city": "Bern"})]
    for message in (final.message,):
        assert message.content == whole.message.content == "Checking now.\n"
        assert message.model_extra["reasoning_content"] == whole.message.model_extra["reasoning_content"] \
            == "Plan: look it up.\n"
        assert calls(message) == calls(whole.message)
    # the raw chunks, accumulated: the same message again
    rebuilt = message_from_deltas(ch.choices[0].delta.model_dump(exclude_none=True) for ch in chunks if ch.choices)
    assert (rebuilt["content"], rebuilt["reasoning_content"]) == (
        whole.message.content, whole.message.model_extra["reasoning_content"])
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in rebuilt["tool_calls"]] \
        == calls(whole.message)
    # ... role first, reasoning and content deltas, each call's id and name once
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert deltas[0].role == "assistant"
    assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == "Plan: look it up.\n"
    heads = [tc for d in deltas for tc in d.tool_calls or () if tc.id]
    assert [(h.index, h.function.name) for h in heads] == [(0, "get_weather"), (1, "get_weather")]
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"


def test_tool_choice_none_and_parallel_tool_calls_false(srv, models):
    c = client(srv)
    with scripted(models[0]) as script:
        script.say(CALL, CALL + CALL)
        none = c.chat.completions.create(model="m", messages=OK, tools=[WEATHER_TOOL], tool_choice="none").choices[0]
        one = c.chat.completions.create(model="m", messages=OK, tools=[WEATHER_TOOL],
                                        parallel_tool_calls=False).choices[0]
    assert none.finish_reason == "stop" and none.message.content == CALL and not none.message.tool_calls
    assert one.finish_reason == "tool_calls" and len(one.message.tool_calls) == 1


def test_a_request_without_tools_gets_call_markup_as_text(srv, models):
    # no tool is declared, so a call would name an undeclared one (as llama-server, the text)
    c = client(srv)
    with scripted(models[0]) as script:
        script.say(CALL)
        reply = c.chat.completions.create(model="m", messages=OK).choices[0]
    assert reply.finish_reason == "stop" and reply.message.content == CALL and not reply.message.tool_calls


def test_a_call_cut_by_max_tokens_is_no_call_but_its_text(srv, models):
    # an agent would run the truncated call {"city": "Par"}: it gets the text and "length"
    c = client(srv)
    cut = len(models[0].tokenize(CALL[:CALL.index("Paris") + 3], add_special=False))
    with scripted(models[0]) as script:
        script.say(CALL, CALL)
        r = c.chat.completions.create(model="m", messages=OK, tools=[WEATHER_TOOL], max_tokens=cut).choices[0]
        chunks = list(c.chat.completions.create(model="m", messages=OK, tools=[WEATHER_TOOL], max_tokens=cut,
                                                stream=True))
    assert r.finish_reason == "length" and not r.message.tool_calls
    assert "<arg_value>Par" in r.message.content and CALL.startswith(r.message.content)
    assert not any(ch.choices[0].delta.tool_calls for ch in chunks if ch.choices)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == r.message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_thinking_off_answers_in_content(srv, models):
    c = client(srv)
    with scripted(models[0]) as script:
        script.say("</think>OK")  # a stray end of reasoning, as models write with thinking off
        r = c.chat.completions.create(model="m", messages=OK).choices[0]
    assert r.message.content == "OK" and "reasoning_content" not in (r.message.model_extra or {})


def test_a_reply_sent_back_otherwise_early_is_served_from_a_context_checkpoint(models):
    """The agent-session case: the second request sends the first reply back with its reasoning
    changed at its start, further back than the sliding-window ring (256 cells) still holds. The
    slot restores the checkpoint taken after the first prompt and prefills only from there
    (usage, timings and /metrics say so); with --ctx-checkpoints 0 it prefills all of it."""
    target, path, drafter = models
    reasoning = " ".join(f"step {i}." for i in range(120))
    seen = {}
    for n in (8, 0):
        pool = make_pool(target, path, drafter, parallel=1, ctx_checkpoints=n)
        with LiveServer(pool, chat_template=TEMPLATE_TEXT, chat_template_source="laguna") as s:
            c = client(s)
            messages = [{"role": "user", "content": "Plan the work."}]
            with scripted(target) as script:
                script.say(reasoning + "</think>Done.", "</think>Ok.")
                first = c.chat.completions.create(model="m", messages=messages, max_tokens=1024,
                                                  extra_body={"chat_template_kwargs": THINKING})
                assert first.choices[0].message.model_extra["reasoning_content"] == reasoning
                assert first.usage.completion_tokens > 300, "precondition: the reply outruns the ring"
                messages += [{"role": "assistant", "reasoning": "Step zero." + reasoning[len("step 0."):],
                              "content": "Done."}, {"role": "user", "content": "Go on."}]
                second = c.chat.completions.create(model="m", messages=messages, max_tokens=64,
                                                   extra_body={"chat_template_kwargs": THINKING})
            assert second.choices[0].message.content == "Ok."
            seen[n] = (first.usage.prompt_tokens, second.usage.prompt_tokens_details.cached_tokens,
                       second.model_extra["timings"]["cache_checkpoint"],
                       s.pool.metrics.get("laguna_prompt_checkpoints_restored_total"))
    n_first = seen[8][0]
    assert seen[8] == (n_first, n_first, True, 1)
    assert seen[0] == (n_first, 0, False, 0)
