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
