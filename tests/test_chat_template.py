"""Chat templates come from downloaded GGUFs: they render in a sandbox, with Hugging Face's
helpers, and every failure is one line naming the file and the key (exit code 2)."""

from __future__ import annotations

import json

import pytest

from laguna_dflash.convert.errors import UserError
from laguna_dflash.runtime.chat_template import ChatTemplate, render_chat
from laguna_dflash.runtime.cli import main

USER = [{"role": "user", "content": "hi"}]


def escapes(marker) -> list[str]:
    """Templates that run `touch marker` when rendered outside a sandbox."""
    cmd = f"touch {marker}"
    return [
        "{{ cycler.__init__.__globals__.os.system('" + cmd + "') }}",
        "{{ lipsum.__globals__['os'].popen('" + cmd + "').read() }}",
        "{% for c in ''.__class__.__mro__[1].__subclasses__() %}{% if c.__name__ == 'catch_warnings' %}"
        "{{ c()._module.__builtins__['__import__']('os').system('" + cmd + "') }}{% endif %}{% endfor %}",
    ]


@pytest.mark.parametrize("which", range(3))
def test_a_template_cannot_run_commands(tmp_path, which):
    marker = tmp_path / "pwned"
    with pytest.raises(UserError) as e:
        render_chat(escapes(marker)[which], USER, source="evil.gguf")
    assert not marker.exists()
    assert str(e.value).startswith("evil.gguf: tokenizer.chat_template: ") and "\n" not in str(e.value)


def test_a_template_cannot_mutate_what_it_is_given():
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(UserError, match="unsafe"):
        render_chat("{{ messages.append({'role': 'system', 'content': 'x'}) }}", messages, source="t.gguf")
    assert messages == [{"role": "user", "content": "hi"}]


def test_raise_exception_is_a_one_line_refusal():
    template = ("{% if messages[0].role != 'system' %}"
                "{{ raise_exception('Conversations must start with a system message') }}{% endif %}")
    with pytest.raises(UserError) as e:
        render_chat(template, USER, source="m.gguf")
    assert str(e.value) == ("m.gguf: tokenizer.chat_template: the template refused the conversation: "
                            "Conversations must start with a system message")


def test_syntax_error_is_one_line_naming_file_key_and_line():
    with pytest.raises(UserError) as e:
        ChatTemplate("{% for m in messages %}\n{{ m.content }\n{% endfor %}", source="m.gguf")
    msg = str(e.value)
    assert msg.startswith("m.gguf: tokenizer.chat_template: template syntax error at line 2") and "\n" not in msg


def test_a_hugging_face_template_renders_as_transformers_would():
    # the shape of a ChatML template as shipped on the Hub, with the helpers they rely on
    template = (
        "{{ bos_token }}{% for m in messages %}\n"
        "{% if m.role == 'tool' %}{{ raise_exception('no tools') }}{% endif %}\n"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% if loop.index == 3 %}{% break %}{% endif %}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        "{{ {'q': '<é>', 'n': [1, 2]} | tojson }} {{ [1] | tojson(indent=2) }} "
        "{{ {'a': 1} | tojson(separators=(',', ':')) }} {{ strftime_now('%Y') | length }}"
    )
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"}, {"role": "user", "content": "cut by break"}]
    out = render_chat(template, messages, source="m.gguf", bos_token="<s>")
    assert out == ("<s><|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                   "<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>assistant\n"
                   '{"q": "<é>", "n": [1, 2]} [\n  1\n] {"a":1} 4')


def test_messages_need_a_known_role_and_text():
    with pytest.raises(UserError, match=r"messages\[0\].role: expected one of system, user, assistant"):
        render_chat("{{ messages }}", [{"role": "wizard", "content": "x"}], source="m.gguf")
    with pytest.raises(UserError, match=r"messages\[0\].content: expected a string"):
        render_chat("{{ messages }}", [{"role": "user", "content": None}], source="m.gguf")


# ------------------------------------------------------------------ through laguna-run --chat


def with_template(src, dst, template: str):
    """A copy of the GGUF ``src`` whose tokenizer.chat_template is ``template``."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(str(src), "r")
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(str(dst), arch=arch, endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, {gguf.Keys.Tokenizer.CHAT_TEMPLATE: MetadataDetails(
        gguf.GGUFValueType.STRING, template)}, [])
    return dst


def chat(tmp_path, tiny_target, capsys, template: str, *extra: str) -> int:
    target = with_template(tiny_target["gguf"], tmp_path / "t.gguf", template)
    capsys.readouterr()  # the copy's progress bar
    return main(["-m", str(target), "-p", "hi", "-n", "2", "--n-max", "0", "-t", "2", "--chat", *extra])


def one_error_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_laguna_run_chat_refuses_a_template_that_reaches_os(tmp_path, tiny_target, capsys):
    marker = tmp_path / "pwned"
    assert chat(tmp_path, tiny_target, capsys, escapes(marker)[0]) == 2
    assert not marker.exists()
    assert "tokenizer.chat_template" in one_error_line(capsys)


def test_laguna_run_chat_raise_exception_exits_2(tmp_path, tiny_target, capsys):
    assert chat(tmp_path, tiny_target, capsys, "{{ raise_exception('system message required') }}") == 2
    line = one_error_line(capsys)
    assert "t.gguf: tokenizer.chat_template" in line and "system message required" in line


def test_laguna_run_chat_syntax_error_exits_2(tmp_path, tiny_target, capsys):
    assert chat(tmp_path, tiny_target, capsys, "{% if add_generation_prompt %}oops") == 2
    assert "tokenizer.chat_template: template syntax error" in one_error_line(capsys)


def test_laguna_run_chat_renders_the_prompt(tmp_path, tiny_target, capsys):
    from laguna_dflash.runtime.llama import Model

    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %} {{ strftime_now('%Y') | length }}"
    assert chat(tmp_path, tiny_target, capsys, template, "--json") == 0
    n_prompt = json.loads(capsys.readouterr().out)["stats"]["n_prompt"]
    with Model(tmp_path / "t.gguf") as m:
        assert n_prompt == len(m.tokenize("[user] hi 4"))


# ------------------------------------------------------------------ Laguna 2.1's own template

from laguna_chat import (DEFAULT_SYSTEM, HEAD, S21_TEMPLATE_TEXT, TOOL_HISTORY, TOOL_HISTORY_RENDER,  # noqa: E402
                         WEATHER_TOOL, laguna_template)

OK = [{"role": "user", "content": "Reply with OK."}]


def laguna(messages, *, tools=None, add_generation_prompt=True, **kwargs) -> str:
    return laguna_template().render(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                    template_kwargs=kwargs)


def test_worked_renders_thinking_off_and_on():  # reference §2.5, hipEngine no_thinking / thinking
    assert laguna(OK, enable_thinking=False) == HEAD + "<user>Reply with OK.</user>\n<assistant></think>"
    assert laguna(OK, enable_thinking=True) == HEAD + "<user>Reply with OK.</user>\n<assistant><think>"
    assert laguna(OK) == laguna(OK, enable_thinking=False)  # XS-2.1's default: off


def test_worked_render_tool_history():  # reference §2.5, hipEngine tool_history
    assert laguna(TOOL_HISTORY, add_generation_prompt=False, enable_thinking=True) == TOOL_HISTORY_RENDER


def test_tool_call_arguments_as_an_object_render_as_json_text_does():
    as_object = [dict(m) for m in TOOL_HISTORY]
    as_object[1] = {**as_object[1], "tool_calls": [{"type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]}
    assert laguna(as_object, add_generation_prompt=False, enable_thinking=True) == TOOL_HISTORY_RENDER


def test_worked_renders_thinking_off_history():  # reference §2.5, ollama v8 expectations
    reasoning_dropped = [{"role": "user", "content": "Q"},
                         {"role": "assistant", "reasoning": "Hidden plan.", "content": "Answer"}]
    assert laguna(reasoning_dropped, add_generation_prompt=False) == \
        HEAD + "<user>Q</user>\n<assistant></think>Answer</assistant>\n"
    verbatim = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "\nAnswer\n"}]
    assert laguna(verbatim, add_generation_prompt=False) == \
        HEAD + "<user>Q</user>\n<assistant></think>\nAnswer\n</assistant>\n"


def test_system_block_rules():  # reference §2.2, prefix and system block
    assert laguna([{"role": "system", "content": "Be terse.  \n"}, *OK]) == \
        "〈|EOS|〉<system>Be terse.</system>\n<user>Reply with OK.</user>\n<assistant></think>"
    # an empty or blank leading system message opts out of the default
    assert laguna([{"role": "system", "content": "  "}, *OK]) == \
        "〈|EOS|〉<user>Reply with OK.</user>\n<assistant></think>"
    # ... unless thinking is on (or tools are given): then an empty block
    assert laguna([{"role": "system", "content": ""}, *OK], enable_thinking=True) == \
        "〈|EOS|〉<system></system>\n<user>Reply with OK.</user>\n<assistant><think>"
    # later system messages render in place, not stripped
    assert laguna([*OK, {"role": "system", "content": " later "}], add_generation_prompt=False) == \
        HEAD + "<user>Reply with OK.</user>\n<system> later </system>\n"


def test_tools_section_rules():  # reference §2.2, tools section: whole tool objects, tojson, caller's key order
    tools_block = ("### Tools\n\nYou may call functions to assist with the user query.\n"
                   "All available function signatures are listed below:\n<available_tools>\n"
                   '{"type": "function", "function": {"name": "get_weather", "description": "Get weather for a city.", '
                   '"parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": '
                   '"integer"}}, "required": ["city"]}}}\n'
                   '{"type": "function", "function": {"name": "é<&>", "parameters": {}}}\n'
                   "</available_tools>")
    tools = [WEATHER_TOOL, {"type": "function", "function": {"name": "é<&>", "parameters": {}}}]
    assert laguna(OK, tools=tools) == (f"〈|EOS|〉<system>{DEFAULT_SYSTEM}\n\n{tools_block}</system>\n"
                                       "<user>Reply with OK.</user>\n<assistant></think>")
    assert laguna([{"role": "system", "content": ""}, *OK], tools=tools).startswith(
        "〈|EOS|〉<system>### Tools\n\n")
    assert laguna(OK, tools=[]) == laguna(OK)  # an empty list is no tools


def test_message_rules():  # reference §2.2, messages
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "two "}, {"type": "text", "text": "parts"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "a", "arguments": '{"n": 2, "b": true, "o": {"mode": "fast"}, '
                                                                       '"z": null, "s": "x y"}'}},
            {"type": "function", "function": {"name": "b", "arguments": ""}}]},
        {"role": "tool", "content": "</tool_response> kept"},
        {"role": "tool", "content": [{"type": "text", "text": "second"}]},
        {"role": "assistant", "content": "done"},
    ]
    assert laguna(messages, enable_thinking=True) == (
        "〈|EOS|〉<system>" + DEFAULT_SYSTEM + "</system>\n<user>two parts</user>\n"
        "<assistant><think></think><tool_call>a<arg_key>n</arg_key><arg_value>2</arg_value><arg_key>b</arg_key>"
        '<arg_value>true</arg_value><arg_key>o</arg_key><arg_value>{"mode": "fast"}</arg_value><arg_key>z</arg_key>'
        "<arg_value>null</arg_value><arg_key>s</arg_key><arg_value>x y</arg_value></tool_call><tool_call>b"
        "</tool_call></assistant>\n<tool_response></tool_response> kept</tool_response>\n"
        "<tool_response>second</tool_response>\n<assistant><think></think>done</assistant>\n<assistant><think>")


def test_reasoning_field_names_and_the_gate():
    both = [{"role": "user", "content": "Q"},
            {"role": "assistant", "reasoning": "first", "reasoning_content": "second", "content": "A"}]
    assert "<assistant><think>first</think>A</assistant>" in laguna(both, enable_thinking=True)
    assert "<assistant></think>A</assistant>" in laguna(both, enable_thinking=False)


def test_preserve_thinking_reaches_the_template():  # reference §2.3, S-2.1's history gate
    s21 = laguna_template(S21_TEMPLATE_TEXT)
    history = [{"role": "user", "content": "Q"}, {"role": "assistant", "reasoning_content": "plan", "content": "A"},
               {"role": "user", "content": "Q2"}]
    assert s21.render(history, template_kwargs={"preserve_thinking": True}).endswith(
        "<assistant><think>plan</think>A</assistant>\n<user>Q2</user>\n<assistant></think>")
    assert s21.render(history).endswith("<assistant></think>A</assistant>\n<user>Q2</user>\n<assistant></think>")


def test_developer_messages_render_as_system():
    assert laguna([{"role": "developer", "content": "Be terse."}, *OK]) == \
        laguna([{"role": "system", "content": "Be terse."}, *OK])
    assert "<system>mid</system>\n" in laguna([*OK, {"role": "developer", "content": "mid"}])


def test_a_final_assistant_message_is_closed_before_the_generation_prompt():
    assert laguna([*OK, {"role": "assistant", "content": "OK"}]).endswith(
        "<assistant></think>OK</assistant>\n<assistant></think>")


def test_the_generation_block_renders_its_body_and_stays_sandboxed(tmp_path):
    template = "{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}"
    assert render_chat(template, USER, source="t.gguf") == "[hi]"
    marker = tmp_path / "pwned"
    with pytest.raises(UserError, match="unsafe|failed"):
        render_chat("{% generation %}" + escapes(marker)[0] + "{% endgeneration %}", USER, source="t.gguf")
    assert not marker.exists()
    with pytest.raises(UserError, match="syntax error"):
        ChatTemplate("{% generation %}unclosed", source="t.gguf")


@pytest.mark.parametrize("name", ["messages", "tools", "add_generation_prompt", "bos_token", "eos_token"])
def test_template_kwargs_may_not_replace_what_the_renderer_sets(name):
    with pytest.raises(UserError) as e:
        laguna_template().render(OK, template_kwargs={name: []})
    assert str(e.value).startswith(f"chat_template_kwargs.{name}: ") and "\n" not in str(e.value)


def test_any_other_template_variable_passes_through():
    template = "{{ enable_thinking }} {{ custom | default('unset') }} {{ nested.k }}"
    assert ChatTemplate(template, "t").render(USER, template_kwargs={
        "enable_thinking": True, "custom": "set", "nested": {"k": 1}}) == "True set 1"


@pytest.mark.parametrize("messages, field, expected", [
    ([{"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {
        "name": "f", "arguments": "{not json"}}]}], "messages[0].tool_calls[0].function.arguments", "a JSON object"),
    ([{"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {
        "name": "f", "arguments": "[1]"}}]}], "messages[0].tool_calls[0].function.arguments", "a JSON object"),
    ([{"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {
        "arguments": "{}"}}]}], "messages[0].tool_calls[0].function.name", "a function name"),
    ([{"role": "user", "content": "x", "tool_calls": []}], "messages[0].tool_calls", "only an assistant"),
    ([{"role": "function", "content": "x"}], "messages[0].role", "expected one of"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages[0].content[0]",
     "text part"),
    ([{"role": "tool", "content": None}], "messages[0].content", "expected a string"),
    ([{"role": "assistant", "content": "x", "reasoning_content": 3}], "messages[0].reasoning_content",
     "expected a string"),
])
def test_malformed_messages_are_one_line_naming_the_field(messages, field, expected):
    with pytest.raises(UserError) as e:
        laguna(messages)
    assert str(e.value).startswith(f"{field}: ") and expected in str(e.value) and "\n" not in str(e.value)


def test_malformed_tools_are_one_line_naming_the_field():
    with pytest.raises(UserError, match=r"^tools\[0\]: expected"):
        laguna(OK, tools=[{"type": "function"}])
    with pytest.raises(UserError, match=r"^tools\[1\].function.name: expected a function name"):
        laguna(OK, tools=[WEATHER_TOOL, {"type": "function", "function": {"name": 3}}])
    with pytest.raises(UserError, match=r"^tools: expected a list"):
        laguna(OK, tools="get_weather")
