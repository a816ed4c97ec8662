"""Anthropic's Messages API on laguna-run serve, through the official ``anthropic`` client (bundled
pair, Laguna 2.1's template, loopback, speculation on): a tool_use, its tool_result, then an
answer; a streamed reply equals the whole one (the client's own accumulation); count_tokens
equals the prompt the reply's usage reports; Claude Code's per-request billing header does not
defeat the prompt cache; errors in Anthropic's shape; x-api-key and Bearer.

The bundled target never writes a tool call: a scripted sampler (scripts/scripted_model.py)
picks each reply's tokens while the engine, the drafter and the server run as always."""

from __future__ import annotations

import pytest

httpx = pytest.importorskip("httpx")
anthropic = pytest.importorskip("anthropic")
pytest.importorskip("fastapi")

from laguna_chat import TEMPLATE_TEXT  # noqa: E402
from helpers.scripted_model import scripted  # noqa: E402
from server_harness import LiveServer, make_pool  # noqa: E402

KEY = "k-anthropic"
WEATHER = {"name": "get_weather", "description": "Get weather for a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                            "required": ["city"]}}
CALL = ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>"
        "<arg_value>2</arg_value></tool_call>")
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def srv(models):
    target, path, drafter = models
    with LiveServer(make_pool(target, path, drafter, parallel=1), chat_template=TEMPLATE_TEXT,
                    chat_template_source="laguna-2.1-chat-template.jinja", api_key=KEY) as s:
        yield s


def client(s, **kw) -> "anthropic.Anthropic":
    return anthropic.Anthropic(base_url=s.url, api_key=KEY, max_retries=0, timeout=120, **kw)


def create(s, stream: bool = False, **kw):
    c = client(s)
    body = {"model": "laguna", "max_tokens": 200, "messages": ASK, **kw}  # greedy: the server's default
    if not stream:
        return c.messages.create(**body)
    with c.messages.stream(**body) as events:
        kinds = [e.type for e in events]
        final = events.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds, kinds
    return final


def same(a, b) -> bool:
    def plain(m):
        blocks = [{k: v for k, v in blk.model_dump().items() if k not in ("id", "citations")} for blk in m.content]
        return blocks, m.stop_reason, m.stop_sequence, m.usage.output_tokens
    return plain(a) == plain(b)


def test_a_tool_use_then_its_result_then_an_answer(srv, models):
    with scripted(models[0]) as script:
        script.say("Let me check.</think>" + CALL, "It is 18 C in Paris.")
        first = create(srv, tools=[WEATHER], thinking={"type": "enabled", "budget_tokens": 1024})
        [thinking, use] = first.content
        assert thinking.type == "thinking" and thinking.thinking == "Let me check."
        assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris", "days": 2}
        assert first.stop_reason == "tool_use" and use.id.startswith("toolu_")
        history = ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                       "content": "18 C"}]}]
        second = create(srv, tools=[WEATHER], messages=history)
    assert [b.type for b in second.content] == ["text"] and second.content[0].text == "It is 18 C in Paris."
    assert second.stop_reason == "end_turn"
    # the history the model saw: the call in its own markup, the result as a tool response
    with httpx.Client(base_url=srv.url, headers={"x-api-key": KEY}) as h:
        prompt = h.post("/apply-template", json={"messages": [
            *ASK, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                "name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
            {"role": "tool", "content": "18 C"}]}).json()["prompt"]
    assert CALL in prompt and "<tool_response>18 C</tool_response>" in prompt


@pytest.mark.parametrize("script, kw", [
    ("Let me check.</think>Calling." + CALL, {"thinking": {"type": "enabled", "budget_tokens": 1024}}),
    ("It is sunny.", {}),
    (CALL + CALL, {}),
    ("cut " + CALL, {"max_tokens": 8}),
    ("one two STOP three", {"stop_sequences": ["STOP"]}),
], ids=["thinking-text-call", "text", "two-calls", "cut", "stop-sequence"])
def test_streamed_equals_not_streamed(srv, models, script, kw):
    with scripted(models[0]) as s:
        s.say(script, script)
        whole = create(srv, tools=[WEATHER], **kw)
        streamed = create(srv, stream=True, tools=[WEATHER], **kw)
    assert same(whole, streamed), (whole, streamed)
    if "max_tokens" in kw:  # a cut call is no call: its text, and the budget named
        assert whole.stop_reason == "max_tokens" and [b.type for b in whole.content] == ["text"]
    if "stop_sequences" in kw:
        assert whole.stop_reason == "stop_sequence" and whole.stop_sequence == "STOP"
        assert whole.content[0].text == "one two "


def test_count_tokens_equals_the_prompt_of_the_reply(srv, models):
    c = client(srv)
    kw = {"model": "laguna", "messages": ASK, "tools": [WEATHER], "system": "Be brief."}
    counted = c.messages.count_tokens(**kw).input_tokens
    with scripted(models[0]) as s:
        s.say("Sunny.")
        reply = c.messages.create(max_tokens=20, **kw)
    assert counted == reply.usage.input_tokens + reply.usage.cache_read_input_tokens
    assert counted > 20


def claude_code_request(cch: str, question: str) -> dict:
    system = [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.328; cc_entrypoint=cli; cch={cch};"},
              {"type": "text", "text": "You are Claude Code, a coding agent. " * 20, "cache_control": {"type": "ephemeral"}}]
    return {"model": "laguna", "max_tokens": 16, "system": system, "tools": [WEATHER],
            "messages": [{"role": "user", "content": question}], "metadata": {"user_id": "u"}}


def test_the_billing_header_does_not_defeat_the_prompt_cache(srv, models):
    c = client(srv)
    with scripted(models[0]) as s:
        s.say("A.", "B.")
        first = c.messages.create(**claude_code_request("a1b2c", "What does main do?"))
        second = c.messages.create(**claude_code_request("f9e8d", "What does main do? And test?"))
    total = second.usage.input_tokens + second.usage.cache_read_input_tokens
    assert second.usage.cache_read_input_tokens >= total / 2, second.usage
    assert first.usage.input_tokens + first.usage.cache_read_input_tokens < total
    with httpx.Client(base_url=srv.url, headers={"x-api-key": KEY}) as h:
        r = h.post("/v1/messages/count_tokens", json=claude_code_request("x", "q"))
        assert r.status_code == 200 and r.json()["input_tokens"] > 0


@pytest.mark.parametrize("body, words", [
    ({"model": "m", "messages": ASK}, "max_tokens"),
    ({"model": "m", "max_tokens": 0, "messages": ASK}, "max_tokens"),
    ({"model": "m", "max_tokens": 5, "messages": []}, "messages"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}, "image"),
    ({"model": "m", "max_tokens": 5, "messages": ASK, "tool_choice": {"type": "tool", "name": "nope"},
      "tools": [WEATHER]}, "tool_choice"),
    ({"model": "m", "max_tokens": 5, "messages": ASK, "extra_body": {"temperature": -1}}, "temperature"),
], ids=["no-max-tokens", "zero-max-tokens", "no-messages", "image", "unknown-tool", "temperature"])
def test_a_bad_request_is_a_400_in_anthropics_shape(srv, body, words):
    payload = dict(body)
    payload.update(payload.pop("extra_body", {}))
    with httpx.Client(base_url=srv.url, headers={"x-api-key": KEY}) as h:
        r = h.post("/v1/messages", json=payload)
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    assert r.json()["error"]["type"] == "invalid_request_error" and words in r.json()["error"]["message"]


def test_the_client_reads_the_errors(srv):
    with pytest.raises(anthropic.BadRequestError) as e:
        client(srv).messages.create(model="m", max_tokens=0, messages=ASK)
    assert e.value.status_code == 400 and "max_tokens" in e.value.message
    assert e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError):
        client(srv).models.retrieve("nope")


def test_the_key_as_x_api_key_or_bearer(srv, models):
    body = {"model": "m", "max_tokens": 5, "messages": ASK}
    with httpx.Client(base_url=srv.url) as h:
        r = h.post("/v1/messages", json=body, headers={"x-api-key": "wrong"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert r.json()["type"] == "error"
        with scripted(models[0]) as s:
            s.say("Hi.", "Hi.")
            assert h.post("/v1/messages", json=body, headers={"x-api-key": KEY}).status_code == 200
            assert h.post("/v1/messages", json=body, headers={"authorization": f"Bearer {KEY}"}).status_code == 200
        # the OpenAI paths keep OpenAI's shape
        r = h.post("/v1/chat/completions", json={"messages": ASK}, headers={"x-api-key": "wrong"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_the_system_prompt_renders_without_the_billing_header():
    from laguna_dflash.runtime.server import anthropic as api

    body = api.CountTokensRequest(**claude_code_request("zz", "q"))
    messages = api.chat_messages(body)
    assert messages[0]["role"] == "system" and "billing" not in messages[0]["content"]
    assert messages[0]["content"].startswith("You are Claude Code")


def test_claude_codes_system_messages_between_turns_render_in_place():
    from laguna_dflash.runtime.server import anthropic as api

    body = api.CountTokensRequest(model="m", system="S", messages=[
        {"role": "user", "content": [{"type": "text", "text": "Q"}]},
        {"role": "system", "content": [{"type": "text", "text": "# Environment\ncwd: /w"}]}])
    assert api.chat_messages(body) == [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                                       {"role": "system", "content": "# Environment\ncwd: /w"}]
