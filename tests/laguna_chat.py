"""Laguna 2.1's chat template (the third-party fixture, whose header names its source) and the
conversations of the reference's worked renders, shared by the renderer, parser and server tests."""

from __future__ import annotations

from pathlib import Path

from laguna_dflash.runtime.chat_template import ChatTemplate

FIXTURE = Path(__file__).parent / "fixtures" / "laguna-2.1-chat-template.jinja"
TEMPLATE_TEXT = FIXTURE.read_text(encoding="utf-8")
#: S-2.1's one known difference (reference §2.3): history reasoning also shown when preserve_thinking
S21_TEMPLATE_TEXT = TEMPLATE_TEXT.replace(
    "{%- if enable_thinking -%}\n        {{- '<think>' + reasoning_content",
    "{%- if enable_thinking or preserve_thinking -%}\n        {{- '<think>' + reasoning_content")
assert S21_TEMPLATE_TEXT != TEMPLATE_TEXT

DEFAULT_SYSTEM = ("You are a helpful, conversationally-fluent assistant made by Poolside. You are here to be "
                  "helpful to users through natural language conversations.")
HEAD = f"〈|EOS|〉<system>{DEFAULT_SYSTEM}</system>\n"

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}

#: reference §2.5, the hipEngine tool_history case: reasoning under both field names, a call
#: whose arguments are JSON text (as OpenAI clients send them), a tool result
TOOL_HISTORY = [
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "reasoning": "Need current data.", "content": "",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
    {"role": "assistant", "reasoning_content": "Now answer.", "content": "It is 18 C."},
]
TOOL_HISTORY_RENDER = (
    HEAD + "<user>Weather?</user>\n<assistant><think>Need current data.</think><tool_call>get_weather"
    "<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>2</arg_value>"
    "</tool_call></assistant>\n<tool_response>18 C</tool_response>\n<assistant><think>Now answer.</think>"
    "It is 18 C.</assistant>\n")


def laguna_template(text: str = TEMPLATE_TEXT) -> ChatTemplate:
    return ChatTemplate(text, source=FIXTURE.name)
