"""laguna-run --chat and laguna-run chat (-cnv) on the bundled pair with Laguna 2.1's template
(--chat-template-file: the bundled GGUF has none): messages piped on standard input, answers on
stdout, reasoning and per-turn stats on stderr, --json with reasoning and tool calls."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from laguna_chat import FIXTURE
from laguna_dflash.runtime import assets
from laguna_dflash.runtime.cli import main
from helpers.scripted_model import scripted

CHAT = ["--chat-template-file", str(FIXTURE), "-n", "24", "-t", "1"]


def laguna_run(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "laguna_dflash.runtime.cli", *args], input=stdin, text=True,
                          capture_output=True, timeout=600)


def test_a_chat_session_piped_through_stdin():
    r = laguna_run("chat", *CHAT, "--no-think", stdin="def add(a, b):\n/help\nwrite mul too\n")
    assert r.returncode == 0, r.stderr
    stats = [ln for ln in r.stderr.splitlines() if ln.startswith("[")]
    assert len(stats) == 2 and all("tok/s" in ln and "accepted" in ln for ln in stats), r.stderr
    # the second turn's prompt starts with the first turn's prompt and reply: the cache holds them
    first_prompt = int(stats[0].split("prompt ")[1].split(" ")[0])
    second_cached = int(stats[1].split(" cached")[0].rsplit(" ", 1)[1])
    assert second_cached >= first_prompt
    assert "/reset" in r.stderr  # /help listed the commands
    assert r.stdout.count("\n") >= 2


def test_a_chat_session_as_json_lines():
    r = laguna_run("chat", *CHAT, "--json", "-sys", "You write Python.", stdin="def add(a, b):\nagain\n")
    assert r.returncode == 0, r.stderr
    turns = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert len(turns) == 2
    for t in turns:
        assert set(t["message"]) == {"role", "content", "reasoning_content", "tool_calls"}
        assert t["stats"]["n_generated"] > 0 and t["finish_reason"] in ("stop", "length")
    assert turns[1]["stats"]["n_cached"] > turns[0]["stats"]["n_prompt"]


def test_reasoning_and_tool_calls_in_one_chat_turn(capsys):
    call = "<tool_call>ls<arg_key>path</arg_key><arg_value>/tmp</arg_value></tool_call>"
    from laguna_dflash.runtime.llama import Model

    with Model(assets.TINY_TARGET) as target, scripted(target) as script:
        script.say("list it</think>Listing." + call)
        assert main(["-p", "files?", "--chat", "--think", "--json", *CHAT, "-n", "64"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["message"]["reasoning_content"] == "list it" and out["message"]["content"] == "Listing."
    assert out["message"]["tool_calls"][0]["function"] == {"name": "ls", "arguments": '{"path": "/tmp"}'}
    assert out["finish_reason"] == "tool_calls" and out["text"] == "list it</think>Listing." + call


def test_reasoning_goes_to_stderr_and_the_answer_to_stdout(capsys):
    from laguna_dflash.runtime.llama import Model

    with Model(assets.TINY_TARGET) as target, scripted(target) as script:
        script.say("plan</think>the answer")
        assert main(["-p", "q", "--chat", "--think", *CHAT]) == 0
    captured = capsys.readouterr()
    assert captured.out == "the answer\n"
    assert "thinking: plan" in captured.err


@pytest.mark.parametrize("args, needle", [
    (["--chat-template-kwargs", "[1]"], "--chat-template-kwargs: expected a JSON object, found list"),
    (["--chat-template-kwargs", "{oops"], "--chat-template-kwargs: expected a JSON object"),
    (["--chat-template-kwargs", '{"messages": 1}'], "--chat-template-kwargs.messages"),
])
def test_chat_flag_mistakes_exit_2_with_one_line(capsys, args, needle):
    assert main(["-p", "q", "--chat", *CHAT, *args]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and needle in err[0], err


def test_chat_flags_need_chat(capsys):
    assert main(["-p", "q", "--think"]) == 2
    assert "--think: needs --chat" in capsys.readouterr().err
    assert main(["chat", "-p", "q", *CHAT]) == 2
    assert "standard input" in capsys.readouterr().err


def test_serve_checks_its_template_kwargs_before_loading(capsys):
    pytest.importorskip("fastapi")
    assert main(["serve", "--chat-template-kwargs", '{"enable_thinking": tru}']) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: --chat-template-kwargs: expected a JSON object"), err


def test_a_conversation_that_outgrows_the_context_ends_in_one_line():
    r = laguna_run("chat", *CHAT, "-c", "160", "-n", "64", stdin="def add(a, b):\n" * 3)
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: -n/--n-predict: expected at most") and "Traceback" not in r.stderr
