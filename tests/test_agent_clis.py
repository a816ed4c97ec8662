"""The coding agents people point at a local server, against laguna-run serve on the bundled
agent pair: Claude Code (``claude -p``, Anthropic's Messages API), Codex CLI (``codex exec``, a
custom provider on OpenAI's Responses API) and opencode (``opencode run``, an OpenAI-compatible
provider on chat completions, its default ``max_tokens`` of 32000 left as it is). Each runs one
bundled-agent task in a scratch workspace with its default settings but the server's address
and the model, and must finish with an answer, every request answered 200. Claude Code's server
caps each reply (``serve -n``): the tiny pair's first replies on its prompt do not end.

The CLIs are pinned and installed by ``make agent-clis`` (npm) into ``.agent-clis/``; without
them these tests are skipped (CI does not install them: they come from npm and run for minutes,
docs/agents.md). Their telemetry, update
checks and other calls out are switched off, HOME is a scratch folder, and only 127.0.0.1 is
given to them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from helpers.scripted_model import scripted  # noqa: E402
from server_harness import LiveServer, make_pool  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".agent-clis" / "node_modules" / ".bin"
MODEL = "laguna"
KEY = "sk-local"
#: the agents' first prompts are 12-37k tokens of the tiny pair's vocabulary (docs/agents.md)
N_CTX = 65536
TASK = "What does the function add in calc.py return? Answer in one sentence."
TIMEOUT_S = 3600
#: every agent's calls home switched off (each documents these variables)
QUIET = {
    "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_NON_ESSENTIAL_MODEL_CALLS": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1", "CODEX_DISABLE_UPDATE_CHECK": "1", "NO_UPDATE_NOTIFIER": "1",
    "DO_NOT_TRACK": "1", "NO_PROXY": "127.0.0.1,localhost",
}


def cli(name: str) -> Path:
    path = BIN / name
    if not path.exists():
        pytest.skip(f"{name} is not installed (make agent-clis)")
    return path


@pytest.fixture
def claude() -> Path:
    return cli("claude")


@pytest.fixture
def codex() -> Path:
    return cli("codex")


@pytest.fixture
def opencode() -> Path:
    return cli("opencode")


def agent_server(agent_pair, **settings) -> LiveServer:
    """laguna-run serve on the bundled agent pair as the agents meet it (its model id, a key, the
    GGUF's own template). One thread: beside other work, two threads wait for each other at every
    barrier, and Claude Code's 22.6k-token prefill took over 14 minutes instead of about one."""
    target, path, drafter = agent_pair
    return LiveServer(make_pool(target, path, drafter, n_ctx=N_CTX, kv_type="f16", n_threads=1),
                      model_id=MODEL, chat_template=None, chat_template_source=None, api_key=KEY, **settings)


@pytest.fixture(scope="module")
def srv(agent_pair):
    with agent_server(agent_pair) as s:
        yield s


#: the unscripted Claude Code run's server caps a reply here (serve -n): the tiny pair's first replies
#: on Claude Code's 22.6k-token prompt do not end, and without a cap the first one runs until the
#: context is full (hours on two cores); cut here, Claude Code's own recovery takes over
REPLY_CAP = 1024


@pytest.fixture(scope="module")
def capped_srv(agent_pair):
    with agent_server(agent_pair, n_predict=REPLY_CAP) as s:
        yield s


@pytest.fixture
def workspace(tmp_path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (tmp_path / "home").mkdir()
    return ws


def run(argv: list[str], workspace: Path, **env) -> subprocess.CompletedProcess:
    home = workspace.parent / "home"
    full = {"PATH": os.environ["PATH"], "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local/share"), "XDG_CACHE_HOME": str(home / ".cache"), **QUIET, **env}
    return subprocess.run(argv, cwd=workspace, env=full, capture_output=True, text=True, timeout=TIMEOUT_S,
                          stdin=subprocess.DEVNULL)


def served(s) -> dict[str, int]:
    """Requests per endpoint and outcome so far (the server's /metrics)."""
    text = httpx.get(s.url + "/metrics", headers={"authorization": f"Bearer {KEY}"}).text
    out = {}
    for line in text.splitlines():
        if line.startswith("laguna_requests_total{"):
            labels, value = line[len("laguna_requests_total{"):].split("} ")
            out[labels] = int(float(value))
    return out


def answered_only_ok(before: dict, after: dict, endpoint: str) -> None:
    new = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert new.get(f'endpoint="{endpoint}",outcome="ok"', 0) > 0, new
    assert all('outcome="ok"' in k for k in new), new


@pytest.mark.slow
def test_claude_code_runs_a_tool_round_through_the_server(claude, srv, agent_pair, workspace):
    # the tiny pair's own replies never end on Claude Code's prompt (below): here its choices
    # are scripted, and every other part is real: Claude Code's requests, the server's
    # rendering, constraint, streaming events, tool_use and tool_result, Claude Code's Read tool
    before = served(srv)
    with scripted(agent_pair[0]) as script:
        script.say(f"Read it.</think><tool_call>Read<arg_key>file_path</arg_key><arg_value>{workspace}/calc.py"
                   "</arg_value></tool_call>",
                   "It returns a + b.</think>add returns the sum of its two arguments, a + b.")
        r = run([str(claude), "-p", TASK, "--model", MODEL, "--output-format", "json"], workspace,
                ANTHROPIC_BASE_URL=srv.url, ANTHROPIC_API_KEY=KEY)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout)
    assert result.get("is_error") is False and result["num_turns"] == 2, result
    assert result["result"].strip() == "add returns the sum of its two arguments, a + b.", result
    answered_only_ok(before, served(srv), "messages")


@pytest.mark.slow
def test_claude_code(claude, capped_srv, workspace):  # the CLI first: skipped before the server starts
    # the pair's first replies run on until the server's cap; Claude Code asks it to resume, it
    # calls one of Claude Code's tools, and after the tool's answer it ends a turn (docs/agents.md)
    before = served(capped_srv)
    r = run([str(claude), "-p", TASK, "--model", MODEL, "--output-format", "json"], workspace,
            ANTHROPIC_BASE_URL=capped_srv.url, ANTHROPIC_API_KEY=KEY)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout)
    assert result.get("is_error") is False and result.get("result", "").strip(), result
    answered_only_ok(before, served(capped_srv), "messages")


@pytest.mark.slow
def test_codex_exec(codex, srv, workspace):
    before = served(srv)
    provider = f'model_providers.laguna={{name="laguna", base_url="{srv.url}/v1", wire_api="responses", ' \
               'env_key="LAGUNA_API_KEY"}'
    codex_home = workspace.parent / "home" / ".codex"
    codex_home.mkdir()  # codex refuses a CODEX_HOME that does not exist
    r = run([str(codex), "exec", "--skip-git-repo-check", "-m", MODEL, "-c", "model_provider=laguna", "-c", provider,
             TASK], workspace, LAGUNA_API_KEY=KEY, CODEX_HOME=str(codex_home))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip()
    answered_only_ok(before, served(srv), "responses")


@pytest.mark.slow
def test_opencode_run_with_its_default_max_tokens(opencode, srv, workspace):
    (workspace / "opencode.json").write_text(json.dumps({
        "$schema": "https://opencode.ai/config.json", "autoupdate": False, "share": "disabled",
        "provider": {"laguna": {"npm": "@ai-sdk/openai-compatible", "name": "laguna-run",
                                "options": {"baseURL": srv.url + "/v1", "apiKey": KEY},
                                "models": {MODEL: {"name": "Laguna (laguna-run)"}}}}}))
    before = served(srv)
    r = run([str(opencode), "run", "-m", f"laguna/{MODEL}", TASK], workspace)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip()
    answered_only_ok(before, served(srv), "chat")


def test_the_pinned_versions_are_the_make_targets():
    text = (ROOT / "Makefile").read_text()
    assert all(pin in text for pin in ("@anthropic-ai/claude-code@2.1.328", "@openai/codex@0.169.0",
                                       "opencode-ai@1.18.33"))
