"""OpenAI's Responses API on laguna-run serve, through the official ``openai`` client's
``responses`` (bundled pair, Laguna 2.1's template, loopback, speculation on): a function_call,
its function_call_output, then an answer; a streamed response equals the whole one (the
client's own accumulation, and the deltas rebuild it); tools OpenAI's servers run are left out,
not refused; previous_response_id is a 400 (nothing is stored).

The bundled target never writes a tool call: a scripted sampler (scripts/scripted_model.py)
picks each reply's tokens while the engine, the drafter and the server run as always."""

from __future__ import annotations

import json

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from laguna_chat import TEMPLATE_TEXT  # noqa: E402
from helpers.scripted_model import scripted  # noqa: E402
from server_harness import LiveServer, make_pool, openai_client as client  # noqa: E402

WEATHER = {"type": "function", "name": "get_weather", "description": "Get weather for a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                          "required": ["city"]}}
CALL = ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>"
        "<arg_value>2</arg_value></tool_call>")


@pytest.fixture(scope="module")
def srv(models):
    target, path, drafter = models
    with LiveServer(make_pool(target, path, drafter, parallel=1), chat_template=TEMPLATE_TEXT,
                    chat_template_source="laguna-2.1-chat-template.jinja") as s:
        yield s


def plain(response) -> list[dict]:
    """The output items without their random ids (items and calls)."""
    return [{k: v for k, v in item.model_dump(exclude_none=True).items() if k not in ("id", "call_id")}
            for item in response.output]


def create(s, stream: bool = False, **kw):
    body = {"model": "laguna", "input": "Weather in Paris?", "tools": [WEATHER], "max_output_tokens": 200,
            "temperature": 0, **kw}
    c = client(s)
    if not stream:
        return c.responses.create(**body)
    with c.responses.stream(**body) as events:
        seen = list(events)
        final = events.get_final_response()
    kinds = [e.type for e in seen]
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert kinds[-1] == "response.completed", kinds
    # the deltas rebuild the final items
    text = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
    assert text == "".join(p.text for item in final.output if item.type == "message" for p in item.content)
    args = [e.arguments for e in seen if e.type == "response.function_call_arguments.done"]
    assert args == [item.arguments for item in final.output if item.type == "function_call"]
    return final


def test_a_function_call_then_its_output_then_an_answer(srv, models):
    with scripted(models[0]) as script:
        script.say("Let me check.</think>" + CALL, "Done.</think>It is 18 C in Paris.")
        first = create(srv, reasoning={"effort": "medium"})
        [reasoning, call] = first.output
        assert reasoning.type == "reasoning" and reasoning.content[0].text == "Let me check."
        assert call.type == "function_call" and call.name == "get_weather"
        assert json.loads(call.arguments) == {"city": "Paris", "days": 2} and first.status == "completed"
        history = [{"role": "user", "content": "Weather in Paris?"},
                   *[item.model_dump(exclude_none=True) for item in first.output],
                   {"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}]
        second = create(srv, input=history, reasoning={"effort": "medium"})
    assert [item.type for item in second.output] == ["reasoning", "message"]
    assert second.output_text == "It is 18 C in Paris." and second.status == "completed"
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0  # the first turn's prompt, from the cache


@pytest.mark.parametrize("script, kw", [
    ("Let me check.</think>Calling." + CALL, {"reasoning": {"effort": "high"}}),
    ("It is sunny.", {"instructions": "Be brief."}),
    (CALL + CALL, {}),
    ("cut " + CALL, {"max_output_tokens": 8}),
], ids=["reasoning-text-call", "text", "two-calls", "cut"])
def test_streamed_equals_not_streamed(srv, models, script, kw):
    with scripted(models[0]) as s:
        s.say(script, script)
        whole = create(srv, **kw)
        streamed = create(srv, stream=True, **kw)
    assert plain(whole) == plain(streamed)
    assert (whole.status, whole.usage.output_tokens) == (streamed.status, streamed.usage.output_tokens)
    if "max_output_tokens" in kw:  # a cut call is no call: its text, and the budget named
        assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
        assert [item.type for item in whole.output] == ["message"]


def test_tools_it_cannot_run_are_left_out_and_stored_responses_refused(srv, models):
    c = client(srv)
    with scripted(models[0]) as s:
        s.say("Hi.")
        r = c.responses.create(model="m", input=[{"role": "developer", "content": "Be brief."},
                                                 {"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Hi"}]}],
                               tools=[WEATHER, {"type": "web_search"}, {"type": "local_shell"}], store=True)
    assert r.output_text == "Hi." and r.store is False
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="m", input="Hi", previous_response_id=r.id)
    assert e.value.status_code == 400 and "previous_response_id" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="m", input="Hi", max_output_tokens=0)
    assert "max_output_tokens" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="m", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}])
    assert "input_text" in e.value.message
