"""runtime/chat_session.py: multi-turn chat on the bundled pair with Laguna 2.1's template;
replies scripted (tests/helpers/scripted_model.py), the engine and drafter real."""

from __future__ import annotations

import io
import json

import pytest

from laguna_chat import laguna_template
from laguna_dflash.runtime.drafter_cache import native_drafter_path
from laguna_dflash.runtime import assets
from laguna_dflash.runtime.chat_session import ChatSession, run_session
from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions
from laguna_dflash.runtime.llama import Model
from helpers.scripted_model import scripted


@pytest.fixture(scope="module")
def engine():
    target = Model(assets.TINY_TARGET)
    drafter = native_drafter_path(assets.converted_tiny_drafter(), target.path)
    with Engine(target, drafter, EngineConfig(n_ctx=2048, kv_type="f32", n_threads=1)) as e:
        yield e
    target.close()


def test_turns_keep_the_history_and_the_prompt_cache(engine):
    session = ChatSession(engine, laguna_template(), system="Be brief.", template_kwargs={"enable_thinking": True})
    out, err = io.StringIO(), io.StringIO()
    with scripted(engine.target) as script:
        script.say("greet</think>Hello!", "count</think>1 2 3")
        n = run_session(session, GenerateOptions(n_predict=32, n_max=4), ["hi\n", "\n", "count\n"], out=out, err=err)
    assert n == 2
    assert out.getvalue() == "Hello!\n1 2 3\n"  # answers only
    assert "thinking: greet" in err.getvalue() and "thinking: count" in err.getvalue()
    summaries = [ln for ln in err.getvalue().splitlines() if ln.startswith("[")]
    assert len(summaries) == 2 and all("tok/s" in s and "accepted" in s for s in summaries)
    assert session.messages[1:] == [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"},
        {"role": "user", "content": "count"}, {"role": "assistant", "content": "1 2 3", "reasoning_content": "count"}]
    # the second turn's prompt begins with the first turn's prompt and reply: the cache held them
    second_cached = int(summaries[1].split(" cached")[0].rsplit(" ", 1)[1])
    first_prompt = int(summaries[0].split("prompt ")[1].split(" ")[0])
    assert second_cached >= first_prompt


def test_json_lines_carry_reasoning_and_tool_calls(engine):
    session = ChatSession(engine, laguna_template(), template_kwargs={"enable_thinking": True})
    out = io.StringIO()
    call = "<tool_call>ls<arg_key>path</arg_key><arg_value>/tmp</arg_value></tool_call>"
    with scripted(engine.target) as script:
        script.say("look</think>" + call, "ok</think>done")
        run_session(session, GenerateOptions(n_predict=64, n_max=4), ["files?", "/reset", "again"],
                    json_lines=True, out=out, err=io.StringIO())
    first, second = (json.loads(ln) for ln in out.getvalue().splitlines())
    assert first["message"]["reasoning_content"] == "look" and first["finish_reason"] == "tool_calls"
    assert first["message"]["tool_calls"][0]["function"] == {"name": "ls", "arguments": '{"path": "/tmp"}'}
    assert first["stats"]["drafted"] > 0
    assert second["message"]["content"] == "done"
    assert [m["role"] for m in session.messages] == ["user", "assistant"]  # /reset forgot the first turn
