"""The agent-session benchmark's Messages replay sends the recorded turn, not another one: the
same system text, replies, calls and tool results, in Anthropic's shape."""

from __future__ import annotations

import json

from scripts.bench.bench_agent_server import anthropic_request

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
RECORDING = {"tools": TOOLS, "max_tokens": 256, "chat_template_kwargs": {"enable_thinking": True}}
CALLS = [{"id": f"call_{i}", "type": "function",
          "function": {"name": "read_file", "arguments": json.dumps({"path": name})}} for i, name in enumerate("ab")]
HISTORY = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Read a and b."},
    {"role": "assistant", "content": None, "reasoning_content": "Both files.", "tool_calls": CALLS},
    {"role": "tool", "tool_call_id": "call_0", "content": "A"},
    {"role": "tool", "tool_call_id": "call_1", "content": "B"},
    {"role": "assistant", "content": "Done.", "reasoning_content": ""},
    {"role": "user", "content": "Thanks."},
]


def test_a_recorded_turn_as_a_messages_request():
    request = anthropic_request(RECORDING, HISTORY)
    assert request["system"] == "You are an agent."
    assert [m["role"] for m in request["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert request["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "Both files.", "signature": ""},
        {"type": "tool_use", "id": "call_0", "name": "read_file", "input": {"path": "a"}},
        {"type": "tool_use", "id": "call_1", "name": "read_file", "input": {"path": "b"}}]
    assert request["messages"][2]["content"] == [  # both results in one user turn
        {"type": "tool_result", "tool_use_id": "call_0", "content": "A"},
        {"type": "tool_result", "tool_use_id": "call_1", "content": "B"}]
    assert request["messages"][3]["content"] == [{"type": "text", "text": "Done."}]
    assert request["tools"] == [{"name": "read_file", "description": "Read a file.",
                                 "input_schema": TOOLS[0]["function"]["parameters"]}]
    assert request["thinking"]["type"] == "enabled" and request["max_tokens"] == 256
    assert request["extra_body"] == {"temperature": 0}


def test_thinking_off_in_the_recording_is_off_in_the_request():
    request = anthropic_request({**RECORDING, "chat_template_kwargs": {"enable_thinking": False}}, HISTORY[1:2])
    assert request["thinking"] == {"type": "disabled"} and "system" not in request
