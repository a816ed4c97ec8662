"""A chat template is bounded in time and in what it builds (runtime/template_limits.py): a
hostile one fails with one line naming the file and the key, and does not hang or take memory."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from laguna_dflash.convert.errors import UserError
from laguna_dflash.runtime import template_limits
from laguna_dflash.runtime.chat_template import ChatTemplate, render_chat

USER = [{"role": "user", "content": "hi"}]
PREFIX = "evil.gguf: tokenizer.chat_template: "

SLOW = {
    "nested range loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "loops over a repeated list": "{% for i in [0] * 100000 %}{% for j in [0] * 100000 %}{% endfor %}{% endfor %}",
    "a recursive macro": "{% macro f(n) %}{% for i in range(10) %}{{ f(n + 1) if n < 9 else '' }}{% endfor %}{% endmacro %}"
                         "{% for k in range(100000) %}{{ f(0) }}{% endfor %}",
    "a recursive loop": "{% for x in range(100000) recursive %}{% if loop.depth < 3 %}{{ loop(range(100000)) }}"
                        "{% endif %}{% endfor %}",
    "filters over ranges": "{% for i in range(100000) %}{{ range(100000) | map('string') | join | length }}"
                           "{% endfor %}",
}

LARGE = {
    "a repeated string": '{{ "x" * 300000000 }}',
    "a repeated list": "{{ ([0] * 300000000) | length }}",
    "a string doubled by ~": '{% set ns = namespace(s="xxxxxxxx") %}{% for i in range(40) %}'
                             '{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}',
    "a string doubled by +": '{% set ns = namespace(s="xxxxxxxx") %}{% for i in range(40) %}'
                             '{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s | length }}',
    "a doubled join": '{% set ns = namespace(s="xxxxxxxx") %}{% for i in range(40) %}'
                      '{% set ns.s = [ns.s, ns.s] | join %}{% endfor %}{{ ns.s | length }}',
    "output in pieces": '{% for i in range(100000) %}{{ "y" * 3000 }}{% endfor %}',
    "a format width": '{{ "{:>300000000}".format(1) }}',
    "a printf width": '{{ "%300000000s" % "x" }}',
    "a format filter width": '{{ "%300000000s" | format("x") }}',
    "a padding method": '{{ "x".ljust(300000000) }}',
    "a center filter": '{{ "x" | center(300000000) }}',
    "an indent": '{{ ("x\\n" * 100000) | indent(3000) | length }}',
    "a power": "{{ 10 ** 100000000 }}",
}


def render_within(text: str, seconds: float = 60.0) -> BaseException | str:
    """Render in a thread: a template that hangs fails the test instead of hanging it."""
    result: dict = {}

    def go():
        try:
            result["out"] = render_chat(text, USER, source="evil.gguf")
        except BaseException as e:  # noqa: BLE001 (reported to the test)
            result["out"] = e

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "the render did not stop"
    return result["out"]


@pytest.mark.parametrize("case", SLOW)
def test_a_template_that_runs_forever_is_stopped_at_the_deadline(case, monkeypatch):
    monkeypatch.setattr(template_limits, "RENDER_SECONDS", 0.3)
    e = render_within(SLOW[case])
    assert isinstance(e, UserError), e
    assert str(e) == PREFIX + "the template ran longer than 0.3 s (refused)"


@pytest.mark.parametrize("case", LARGE)
def test_a_template_that_builds_too_much_is_refused(case):
    e = render_within(LARGE[case])
    assert isinstance(e, UserError), e
    assert str(e).startswith(PREFIX + "the template ") and str(e).endswith("(refused)") and "\n" not in str(e)
    assert "more than" in str(e)


def test_refused_before_the_memory_is_taken():
    """The 300-million-character values are refused before they exist: peak RSS stays far
    below one of them."""
    code = textwrap.dedent(f"""
        import resource
        from laguna_dflash.convert.errors import UserError
        from laguna_dflash.runtime.chat_template import render_chat
        cases = {list(LARGE.values())!r}
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for text in cases:
            try:
                render_chat(text, [{{"role": "user", "content": "hi"}}], source="evil.gguf")
            except UserError:
                pass
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // 1024)
    """)
    grown_mb = int(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                                  timeout=300).stdout)
    assert grown_mb < 150, f"rendering the refused templates grew the peak RSS by {grown_mb} MB"


def test_the_bounds_are_per_render_and_leave_real_templates_alone():
    t = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}{% endfor %}"
                     "{{ '%-5s|' % 'ab' }}{{ 'x'.center(7) }}{{ ['a', 'b'] | join(',') }}{{ 2 ** 10 }}", source="t")
    messages = [{"role": "user", "content": " hi "}] * 1000
    out = t.render(messages)
    assert out.startswith("<user>hi<user>hi") and out.endswith("ab   |   x   a,b1024")
    assert len(out) == 8 * 1000 + 6 + 7 + 3 + 4
    for _ in range(3):  # one render's deadline does not leak into the next
        assert t.render(USER).startswith("<user>hi")


def test_the_output_bound_can_be_set_per_render():
    t = ChatTemplate("{{ messages[0].content }}", source="t")
    variables = {"messages": [{"content": "x" * 12}]}
    assert template_limits.render_bounded(t._template, variables, max_chars=12) == "x" * 12
    with pytest.raises(template_limits.TemplateTooLarge, match="of 12 characters or items, more than 10"):
        template_limits.render_bounded(t._template, variables, max_chars=10)


def test_a_caller_sizes_the_bound_for_its_context():
    assert template_limits.chars_for_context(2048) == 1 << 20  # the floor
    assert template_limits.chars_for_context(131072) == 64 * 131072
    assert template_limits.chars_for_context(10**9) == template_limits.RENDER_MAX_CHARS
    t = ChatTemplate("{{ 'y' * 2000 }}", source="t")
    assert len(t.render(USER)) == 2000
    with template_limits.bounded(max_chars=1000):  # what the server and the CLI wrap a render in
        with pytest.raises(UserError, match="a repeated value of 2000 characters or items, more than 1000"):
            t.render(USER)
    assert len(t.render(USER)) == 2000  # outside the block, the module's bound again


def test_lipsum_is_not_offered():
    e = render_within("{{ lipsum(n=1000000) }}")
    assert isinstance(e, UserError) and "lipsum" in str(e)
