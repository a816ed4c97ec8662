"""runtime/conversation.py: a chat turn's prompt, its end, its reading (renderer and parser
glue shared by the server and the CLI)."""

from __future__ import annotations

import pytest

from laguna_chat import WEATHER_TOOL, laguna_template
from laguna_dflash.convert.errors import UserError
from laguna_dflash.runtime import assets
from laguna_dflash.runtime.conversation import ChatTurn, end_of_turn_tokens, finish_reason, response_message
from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions
from laguna_dflash.runtime.llama import Model
from helpers.scripted_model import scripted

OK = [{"role": "user", "content": "Reply with OK."}]


def without_eot(src, dst):
    """A copy of the GGUF ``src`` whose metadata does not name an end-of-turn token."""
    import gguf
    from gguf.scripts.gguf_new_metadata import copy_with_new_metadata

    reader = gguf.GGUFReader(str(src), "r")
    writer = gguf.GGUFWriter(str(dst), arch=reader.fields[gguf.Keys.General.ARCHITECTURE].contents(),
                             endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, {}, [gguf.Keys.Tokenizer.EOT_ID])
    return dst


def eog_ids(model: Model) -> set[int]:
    return {t for t in range(model.n_vocab) if model.is_eog(t)}


def test_the_bundled_gguf_ends_turns_at_both_tokens():
    with Model(assets.TINY_TARGET) as m:
        end = end_of_turn_tokens(m)
        assert [m.token_text(t) for t in end] == ["</assistant>", "〈|EOS|〉"]
        assert eog_ids(m) == set(end)  # llama.cpp marks both: </assistant> is the GGUF's eot token


def test_a_gguf_that_does_not_mark_the_end_of_turn_still_ends_there(tmp_path, capsys):
    path = without_eot(assets.TINY_TARGET, tmp_path / "no-eot.gguf")
    capsys.readouterr()
    with Model(path) as m:
        end = end_of_turn_tokens(m)
        assert m.token_text(end[0]) == "</assistant>" and end[0] not in eog_ids(m)
        with Engine(m, None, EngineConfig(n_ctx=512, kv_type="f32", n_threads=1)) as engine, \
                scripted(m) as script:
            script.say("OK", "OK")  # then </assistant>, again and again
            ended = engine.generate("<user>hi</user>", GenerateOptions(n_predict=8, n_max=0, end_tokens=end,
                                                                        special_text=True))
            runs_on = engine.generate("<user>hi</user>", GenerateOptions(n_predict=8, n_max=0, special_text=True))
    assert (ended.text, ended.stop_reason) == ("OK", "eog")
    assert runs_on.stop_reason == "length" and runs_on.text.startswith("OK</assistant></assistant>")


@pytest.mark.parametrize("kwargs, reasoning", [({}, False), ({"enable_thinking": True}, True),
                                               ({"enable_thinking": False}, False)])
def test_the_turn_reads_its_reasoning_state_off_the_prompt(kwargs, reasoning):
    turn = ChatTurn.render(laguna_template(), OK, template_kwargs=kwargs)
    assert turn.reasoning is reasoning
    text = "plan</think>OK"
    assert turn.message(text)["content"] == ("OK" if reasoning else "planOK")


def test_tool_choice_and_parallel_calls_reach_the_parser():
    call = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
    auto = ChatTurn.render(laguna_template(), OK, tools=[WEATHER_TOOL])
    assert auto.message(call)["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    none = ChatTurn.render(laguna_template(), OK, tools=[WEATHER_TOOL], tool_choice="none")
    assert none.message(call) == {"role": "assistant", "content": call, "reasoning_content": None, "tool_calls": []}
    assert "<available_tools>" in none.prompt  # the tools are still shown, as vLLM does
    single = ChatTurn.render(laguna_template(), OK, parallel_tool_calls=False)
    assert len(single.message(call + call)["tool_calls"]) == 1
    assert auto.constraint() is None and none.constraint() is None
    for choice, parallel in (("required", True), ({"type": "function", "function": {"name": "get_weather"}}, False)):
        for thinking in (False, True):
            forced = ChatTurn.render(laguna_template(), OK, tools=[WEATHER_TOOL], tool_choice=choice,
                                     template_kwargs={"enable_thinking": thinking})
            assert forced.tool_choice == choice and forced.message(call)["tool_calls"]
            c = forced.constraint()  # Laguna's call markup, after the reasoning when the prompt opens it
            assert (c.kind, c.after_reasoning, c.source[2]) == ("tool_calls", thinking, parallel)
    for choice in ("always", 3, {"type": "function"}, {"type": "function", "function": {"name": 3}}):
        with pytest.raises(UserError, match="^tool_choice: expected 'auto', 'none', 'required' or "):
            ChatTurn.render(laguna_template(), OK, tool_choice=choice)


def test_finish_reasons_and_the_response_message():
    assert finish_reason("eog", True) == "tool_calls" and finish_reason("stop", False) == "stop"
    assert finish_reason("length", True) == "length"
    parsed = {"role": "assistant", "content": "x", "reasoning_content": None, "tool_calls": []}
    assert response_message(parsed) == {"role": "assistant", "content": "x"}
