"""laguna-run serve against what one client can do to it (issue 31): bodies over the limit, a
prompt far over the context, a hostile chat template, lone surrogates, every documented error
code; and the serve command's exposure rule and its shutdown on SIGTERM/SIGINT."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from laguna_dflash.runtime import template_limits  # noqa: E402
from laguna_dflash.runtime.cli import main as cli_main  # noqa: E402
from laguna_dflash.runtime.engine import Engine, EngineConfig  # noqa: E402
from laguna_dflash.runtime.server.guards import PreparePool, exposure_problem, lone_surrogate  # noqa: E402
from server_harness import TEMPLATE, LiveServer, completion_request, make_pool  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOOPING = "def fib(n):\n"  # the bundled target's greedy answer runs 1500 tokens without an end
SLOW_TEMPLATE = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


def post(s, path, body, **headers):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    with httpx.Client(base_url=s.url, timeout=60) as h:
        return h.post(path, content=data, headers={"content-type": "application/json", **headers})


def error_of(r, status) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"] and "\n" not in err["message"]
    return err


def raw_request(url: str, head: str, chunks=(), timeout=30.0) -> tuple[int, dict]:
    """Send a request head and body chunks on a socket; the status and JSON body of the answer,
    which may come before the body was sent (a refusal does not wait for it)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head.encode())
        try:
            for c in chunks:
                sock.sendall(c)
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered and closed before the body was all sent: what a refusal does
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
            part = sock.recv(65536)
            if not part:
                break
            data += part
    head_bytes, _, body = data.partition(b"\r\n\r\n")
    return int(head_bytes.split()[1]), json.loads(body[:_length(data)] or b"null")


def _length(data: bytes) -> int:
    m = re.search(rb"content-length: (\d+)", data.split(b"\r\n\r\n", 1)[0], re.I)
    return int(m.group(1)) if m else 1 << 30


def chunked(payload: bytes, size: int = 1 << 16):
    for i in range(0, len(payload), size):
        part = payload[i:i + size]
        yield f"{len(part):x}\r\n".encode() + part + b"\r\n"
    yield b"0\r\n\r\n"


# ---------------------------------------------------------------------------- request bounds


def test_a_body_over_the_limit_is_413_before_it_is_read(models):
    target, path, drafter = models
    with LiveServer(make_pool(target, path, drafter), max_body_bytes=64 << 10) as s:
        head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Content-Length: 50000000\r\n\r\n")
        status, body = raw_request(s.url, head)  # nothing of the 50 MB is sent: the length is enough
        assert status == 413 and body["error"]["code"] == "request_too_large"
        assert "50000000 bytes" in body["error"]["message"] and "--max-body-bytes" in body["error"]["message"]
        big = json.dumps({"prompt": "x" * (1 << 20)}).encode()
        head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n\r\n")
        status, body = raw_request(s.url, head, chunked(big))  # no length given: the bytes are counted
        assert status == 413 and body["error"]["code"] == "request_too_large"
        assert body["error"]["type"] == "invalid_request_error"
        r = post(s, "/v1/completions", {"prompt": "x" * 1000, "max_tokens": 2})  # under the limit: served
        assert r.status_code == 200, r.text


def test_the_body_limit_defaults_to_the_context(models):
    from laguna_dflash.runtime.server.guards import default_max_body_bytes

    target, path, drafter = models
    with LiveServer(make_pool(target, path, drafter)) as s:
        limit = s.app.state.server.max_body_bytes
        assert limit == default_max_body_bytes(2048) < 2 << 20
        err = error_of(post(s, "/v1/completions", {"prompt": "x" * limit}), 413)
        assert err["code"] == "request_too_large"


def test_a_prompt_far_over_the_context_is_refused_before_tokenizing(models, monkeypatch):
    target, path, drafter = models
    with LiveServer(make_pool(target, path, drafter), max_body_bytes=16 << 20) as s:
        server = s.app.state.server
        calls = []
        real = server.target.tokenize
        monkeypatch.setattr(server.target, "tokenize", lambda text, *a, **k: calls.append(len(text)) or real(text, *a, **k))
        for path_, body in (("/v1/completions", {"prompt": "x" * (8 << 20)}),
                            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "y" * (8 << 20)}]}),
                            ("/v1/completions", {"prompt": [1] * 3000})):
            err = error_of(post(s, path_, body), 400)
            assert err["code"] == "context_length_exceeded" and "needs at least" in err["message"], err
        assert calls == []
        r = post(s, "/v1/completions", {"prompt": "x" * 300, "max_tokens": 2})
        assert r.status_code == 200 and calls == [300]


def test_a_template_that_hangs_is_refused_and_cannot_starve_the_server(models, monkeypatch):
    monkeypatch.setattr(template_limits, "RENDER_SECONDS", 0.5)
    target, path, drafter = models
    with LiveServer(make_pool(target, path, drafter, parallel=1, max_queue=16), chat_template=SLOW_TEMPLATE,
                    chat_template_source="slow.gguf") as s:
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        results: list = []
        threads = [threading.Thread(target=lambda: results.append(post(s, "/v1/chat/completions", chat)))
                   for _ in range(8)]
        for t in threads:
            t.start()
        with httpx.Client(base_url=s.url, timeout=10) as h:  # meanwhile the loop and the slots answer
            r = h.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert r.status_code in (200, 503), r.text
            assert h.get("/health").status_code in (200, 503)
        for t in threads:
            t.join(60)
        assert len(results) == 8
        for r in results:
            if r.status_code == 503:  # the preparers' queue was full: told to retry
                assert r.json()["error"]["code"] == "queue_full"
                continue
            err = error_of(r, 400)
            assert err["code"] == "template_error" and err["param"] == "messages"
            assert err["message"] == "slow.gguf: tokenizer.chat_template: the template ran longer than 0.5 s (refused)"
        assert sum(r.status_code == 400 for r in results) >= 4
        with httpx.Client(base_url=s.url, timeout=10) as h:
            health = h.get("/health").json()
            assert health["status"] == "ok" and health["prepare_busy"] == 0, health
            assert h.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200


def test_health_reports_a_stuck_preparer(models, monkeypatch):
    monkeypatch.setattr(template_limits, "RENDER_SECONDS", 3.0)
    target, path, drafter = models
    with LiveServer(make_pool(target, path, drafter), chat_template=SLOW_TEMPLATE, prepare_workers=2) as s:
        s.app.state.server.preparing.stuck_after_s = 0.2
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        worker = threading.Thread(target=lambda: post(s, "/v1/chat/completions", chat))
        worker.start()
        with httpx.Client(base_url=s.url, timeout=10) as h:
            deadline = time.monotonic() + 10
            while (health := h.get("/health")).json()["prepare_stuck"] == 0:
                assert time.monotonic() < deadline, health.json()
                time.sleep(0.05)
            assert health.status_code == 200 and health.json()["status"] == "degraded"
            worker.join(30)
            assert h.get("/health").json()["status"] == "ok"


def test_the_prepare_pool_is_bounded_and_reports_stuck_workers():
    import asyncio

    release = threading.Event()
    p = PreparePool(workers=1, max_waiting=1, stuck_after_s=0.05)

    async def main():
        first = asyncio.ensure_future(p.run(release.wait))
        second = asyncio.ensure_future(p.run(lambda: 7))
        await asyncio.sleep(0.2)
        with pytest.raises(PreparePool.Full):
            await p.run(lambda: 1)
        status = p.status()
        release.set()
        return status, await first, await second

    status, first, second = asyncio.run(main())
    assert status == {"prepare_workers": 1, "prepare_busy": 1, "prepare_stuck": 1}
    assert first is True and second == 7
    p.close()


# ---------------------------------------------------------------------------- unicode and error codes


@pytest.mark.parametrize("path,raw,param", [
    ("/v1/completions", '{"prompt": "ab\\ud800"}', "prompt"),
    ("/v1/completions", '{"prompt": "x", "stop": ["\\udfff"]}', "stop.0"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi \\ud83d"}]}', "messages.0.content"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}',
     "messages.0.content.0.text"),
])
def test_a_lone_surrogate_is_400(models, path, raw, param):
    target, path_, drafter = models
    with LiveServer(make_pool(target, path_, drafter)) as s:
        err = error_of(post(s, path, raw), 400)
        assert err["code"] == "invalid_value" and err["param"] == param
        assert "lone surrogate U+D" in err["message"]
        ok = post(s, "/v1/completions", '{"prompt": "caf\\u00e9 \\ud83d\\ude00", "max_tokens": 1}')  # a pair is fine
        assert ok.status_code == 200, ok.text


def test_a_lone_surrogate_is_a_value_error_in_the_python_api(models):
    target, path, drafter = models
    with Engine(target, path, EngineConfig(n_ctx=512, n_threads=1), drafter_model=drafter) as e:
        with pytest.raises(ValueError, match=r"lone surrogate U\+D800 at character 2") as info:
            e.generate("ab\ud800")
        assert type(info.value) is ValueError
    assert lone_surrogate({"a": ["ok", {"b": "x\udc80"}]}) == ("a.1.b", 1, "\udc80")


def documented_codes() -> dict[str, int]:
    text = (ROOT / "docs" / "server.md").read_text()
    table = text[text.index("| status | when | `code` |"):]
    rows = {}
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        code = cells[-1].strip("`")
        assert code, f"a documented error without a code: {line}"
        rows[code] = int(cells[0])
    return rows


def codes_in_source() -> set[str]:
    found = set()
    for f in [*(ROOT / "runtime" / "server").glob("*.py"), ROOT / "runtime" / "request.py"]:
        found |= set(re.findall(r'code(?:: str)? ?= ?"([a-z_]+)"', f.read_text()))
        found |= set(re.findall(r'\d{3}: "([a-z_]+)"', f.read_text()))
    return found


def test_every_error_code_the_server_sends_is_documented():
    assert codes_in_source() - set(documented_codes()) == set()


def test_the_documented_error_table(models, monkeypatch):
    """Each row of docs/server.md's error table, triggered, answers its status and code."""
    target, path, drafter = models
    documented = documented_codes()
    seen: dict[str, int] = {}

    def check(r, code):
        err = error_of(r, documented[code])
        assert err["code"] == code, err
        seen[code] = r.status_code

    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    key = "k-for-the-table"
    with LiveServer(make_pool(target, path, drafter, parallel=1, max_queue=0), api_key=key,
                    max_body_bytes=64 << 10) as s:
        auth = {"authorization": f"Bearer {key}"}
        check(post(s, "/v1/completions", "{nope", **auth), "invalid_json")
        check(post(s, "/v1/completions", {"prompt": "x", "logprobs": 1}, **auth), "unknown_parameter")
        check(post(s, "/v1/completions", {}, **auth), "missing_parameter")
        for bad in ({"prompt": "x", "temperature": -1}, {"prompt": "x", "n": 2}, {"prompt": "x", "stop": [""]},
                    {"prompt": [1, 10**9]}, {"prompt": "x", "frequency_penalty": 1}, {"prompt": "\ud800"}):
            check(post(s, "/v1/completions", json.dumps(bad), **auth), "invalid_value")
        check(post(s, "/v1/completions", {"prompt": "x " * 2100, "max_tokens": 1}, **auth), "context_length_exceeded")
        check(post(s, "/v1/completions", "x" * (100 << 10), **auth), "request_too_large")
        check(post(s, "/v1/completions", {"prompt": "x"}), "invalid_api_key")
        check(post(s, "/v1/completions", {"prompt": "x", "grammar": "root ::= ("}, **auth), "invalid_constraint")
        with httpx.Client(base_url=s.url, headers=auth) as h:
            check(h.get("/v1/nothing"), "not_found")
            check(h.get("/v1/completions"), "method_not_allowed")
            with h.stream("POST", "/v1/completions", json={"prompt": LOOPING, "max_tokens": 1500,
                                                          "stream": True}) as busy:
                lines = busy.iter_lines()  # kept: a dropped iterator closes the connection
                assert next(lines).startswith("data: {")  # the one slot is taken and the queue holds 0
                check(post(s, "/v1/completions", {"prompt": "x", "max_tokens": 2}, **auth), "queue_full")
        server = s.app.state.server
        monkeypatch.setattr(server, "prepare", lambda body: 1 / 0)
        check(post(s, "/v1/completions", {"prompt": "x"}, **auth), "internal_error")
        monkeypatch.undo()
        server.draining = True
        check(post(s, "/v1/completions", {"prompt": "x"}, **auth), "shutting_down")
        server.draining = False
        s.pool.backend_lost = "rpc server 10.0.0.2:50052 lost (test)"
        check(post(s, "/v1/completions", {"prompt": "x", "max_tokens": 2}, **auth), "backend_lost")
        s.pool.backend_lost = None
    with LiveServer(make_pool(target, path, drafter), chat_template=None) as s:
        s.app.state.server.template = None
        check(post(s, "/v1/chat/completions", chat), "no_chat_template")
    with LiveServer(make_pool(target, path, drafter), chat_template="{{ raise_exception('no') }}") as s:
        check(post(s, "/v1/chat/completions", chat), "template_error")
    assert seen == documented


# ---------------------------------------------------------------------------- the serve command


def test_a_non_loopback_host_without_a_key_needs_expose(capsys, monkeypatch):
    monkeypatch.delenv("LAGUNA_API_KEY", raising=False)
    for host in ("0.0.0.0", "::", "192.0.2.1"):
        code = cli_main(["serve", "--host", host, "--port", "0"])
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
        assert code == 2 and len(err) == 1 and f"--host {host}" in err[0] and "--expose" in err[0], err
    assert exposure_problem("127.0.0.1", None, False) == (None, None)
    assert exposure_problem("localhost", None, False) == (None, None)
    assert exposure_problem("::1", None, False) == (None, None)
    assert exposure_problem("0.0.0.0", "key", False) == (None, None)
    refusal, warning = exposure_problem("0.0.0.0", None, True)
    assert refusal is None and "warning" in warning and "without an API key" in warning


def test_the_readme_passes_the_key_in_the_environment():
    readme = (ROOT / "README.md").read_text()
    serve_lines = [ln for ln in readme.splitlines() if "laguna-run serve" in ln]
    assert serve_lines and not any("--api-key" in ln for ln in serve_lines), serve_lines
    assert any("LAGUNA_API_KEY" in ln for ln in serve_lines)


class ServeProcess:
    """laguna-run serve in a child process on an ephemeral port; its stderr lines collected."""

    def __init__(self, tmp_path, *args: str, template: str = TEMPLATE) -> None:
        chat = tmp_path / "chat.jinja"
        chat.write_text(template)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "laguna_dflash.runtime.cli", "serve", "--port", "0", "-c", "2048", "-t", "1",
             "--chat-template-file", str(chat), *args], stderr=subprocess.PIPE, text=True, cwd=ROOT)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=lambda: [self.lines.put(ln) for ln in self.proc.stderr], daemon=True).start()
        self.url = self.wait_for(r"listening on (http://127\.0\.0\.1:\d+)").group(1)

    def wait_for(self, pattern: str, timeout: float = 120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                assert self.proc.poll() is None or not self.lines.empty(), "".join(self.seen)
                continue
            self.seen.append(line)
            m = re.search(pattern, line)
            if m:
                return m
        raise AssertionError(f"no line matched {pattern!r}: {''.join(self.seen)}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def sse_events(lines) -> list:
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_stream_ends_it_with_a_finish_reason_an_error_and_done(tmp_path, sig):
    # the stream must outlast the shutdown timeout: its 1,900 tokens took 1.5-1.6 s after the
    # first chunk on a 2-core VM whose pace doubles at times (a 1 s timeout then let it finish)
    srv = ServeProcess(tmp_path, "--shutdown-timeout", "0.2")
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as h:
            with h.stream("POST", "/v1/completions", json={"prompt": LOOPING, "max_tokens": 1900,
                                                          "stream": True}) as r:
                lines = r.iter_lines()
                first = next(line for line in lines if line.startswith("data: "))
                srv.proc.send_signal(sig)
                events = sse_events([first, *lines])  # reads to the end: the chunked body is terminated
        assert events[-1] == "[DONE]"
        finish, error = events[-3], events[-2]
        assert finish["choices"][0]["finish_reason"] == "length" and "usage" in finish
        assert error["error"]["code"] == "shutting_down" and "cut short" in error["error"]["message"]
        assert all(e["choices"][0]["finish_reason"] is None for e in events[:-3])
        assert srv.proc.wait(30) == 128 + sig
        srv.wait_for(r"1 request\(s\) cut")
    finally:
        srv.stop()


def test_the_official_client_is_told_why_the_stream_ended(tmp_path):
    srv = ServeProcess(tmp_path, "--shutdown-timeout", "0.5")
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
        stream = c.completions.create(model="m", prompt=LOOPING, max_tokens=1900, stream=True)
        finish = []
        with pytest.raises(openai.APIError) as e:
            for i, chunk in enumerate(stream):
                if i == 0:
                    srv.proc.send_signal(signal.SIGTERM)
                finish.append(chunk.choices[0].finish_reason)
        assert not isinstance(e.value, openai.APIConnectionError)
        assert "shutting down" in e.value.message and finish[-1] == "length"
        assert srv.proc.wait(30) == 143
    finally:
        srv.stop()


def test_running_requests_finish_within_the_shutdown_timeout(tmp_path):
    srv = ServeProcess(tmp_path, "--shutdown-timeout", "60")
    try:
        result = {}

        def ask():
            with httpx.Client(base_url=srv.url, timeout=60) as h:
                result["r"] = h.post("/v1/completions", json={"prompt": LOOPING, "max_tokens": 600})

        t = threading.Thread(target=ask)
        t.start()
        # running (the slot busy) when the signal comes, whatever the machine's pace (a fixed
        # 0.3 s wait outlasted a short job on a fast CPU); 600 tokens take longer than a poll
        deadline = time.monotonic() + 60
        with httpx.Client(base_url=srv.url, timeout=10) as h:
            while (health := h.get("/health").json())["slots_idle"] == health["slots"]:
                assert t.is_alive() and time.monotonic() < deadline, \
                    "the request ended, or never ran, before the signal"
                time.sleep(0.005)
        srv.proc.send_signal(signal.SIGTERM)
        t.join(60)
        assert result["r"].status_code == 200 and result["r"].json()["usage"]["completion_tokens"] == 600
        assert srv.proc.wait(60) == 143
        with pytest.raises(httpx.ConnectError):  # not listening any more
            httpx.get(srv.url + "/health", timeout=2)
    finally:
        srv.stop()


def test_a_second_signal_exits_at_once(tmp_path):
    srv = ServeProcess(tmp_path, "--shutdown-timeout", "600")
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as h:
            with h.stream("POST", "/v1/completions", json={"prompt": LOOPING, "max_tokens": 1900,
                                                          "stream": True}) as r:
                lines = r.iter_lines()
                next(lines)
                srv.proc.send_signal(signal.SIGTERM)
                srv.wait_for("stopping: no new requests")
                t0 = time.monotonic()
                srv.proc.send_signal(signal.SIGTERM)
                assert srv.proc.wait(20) == 143
                assert time.monotonic() - t0 < 20
    finally:
        srv.stop()


def test_a_signal_stops_a_server_whose_templates_hang(tmp_path):
    srv = ServeProcess(tmp_path, "--shutdown-timeout", "5", template=SLOW_TEMPLATE)
    try:
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        answers: list = []

        def ask():
            try:
                r = httpx.post(srv.url + "/v1/chat/completions", json=chat, timeout=60)
                answers.append(r.json()["error"]["code"])
            except httpx.HTTPError as e:  # sent after the server stopped listening
                answers.append(type(e).__name__)

        threads = [threading.Thread(target=ask, daemon=True) for _ in range(8)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while httpx.get(srv.url + "/health", timeout=10).json()["prepare_busy"] < 2:  # both preparers rendering
            assert time.monotonic() < deadline
            time.sleep(0.05)
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(30) == 143
        for t in threads:
            t.join(10)
        assert len(answers) == 8 and set(answers) <= {"template_error", "queue_full", "shutting_down", "ConnectError"}
        assert "template_error" in answers, answers
    finally:
        srv.stop()


def read_response(sock: socket.socket) -> tuple[int, dict | None]:
    """The status and JSON body of one complete HTTP/1.1 answer on ``sock`` (by its
    Content-Length); a connection that ends before that raises ConnectionError."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
        part = sock.recv(65536)
        if not part:
            raise ConnectionError(f"the connection ended after {len(data)} bytes of the answer")
        data += part
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body[:_length(data)])


def stop_in_its_idle_wait(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGSTOP ``proc`` while its main thread is blocked in the system call it idles in (an event
    loop's poll), so that when it runs on it polls before it runs anything else."""
    def syscall() -> str:  # its number, "-1" between system calls, "running"
        with open(f"/proc/{proc.pid}/syscall") as f:
            return f.read().split()[0]

    samples = []
    for _ in range(30):
        samples.append(syscall())
        time.sleep(0.01)
    idle = max(set(samples), key=samples.count)
    assert idle not in ("-1", "running"), samples
    deadline = time.monotonic() + timeout
    while True:
        proc.send_signal(signal.SIGSTOP)
        while _state(proc.pid) != "T":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        if syscall() == idle:
            return
        proc.send_signal(signal.SIGCONT)
        assert time.monotonic() < deadline, f"the server never stopped in system call {idle}"
        time.sleep(0.03)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def answer_of(sock: socket.socket):
    """(status, error code) of the answer on ``sock``, (200, "served"), or the name of the error
    a reset or an early close raised."""
    try:
        status, answer = read_response(sock)
    except OSError as e:
        return type(e).__name__
    return status, answer["error"]["code"] if status != 200 else "served"


@pytest.mark.skipif(not os.path.exists("/proc/self/syscall"), reason="needs /proc/PID/syscall and SIGSTOP")
def test_connections_waiting_in_the_backlog_when_the_signal_comes_are_answered_not_reset(tmp_path):
    """The server is stopped (SIGSTOP) while clients connect and send: the kernel accepts them
    into the listening socket's backlog, unread. SIGTERM, then SIGCONT once the server's 0.1 s tick
    has passed, so it sees the signal before it takes any of them (the order a loaded machine hits
    by chance): each reads a complete answer, 503 shutting_down, never a reset."""
    srv = ServeProcess(tmp_path, "--shutdown-timeout", "3")
    host, port = srv.url.removeprefix("http://").split(":")
    clients: list[socket.socket] = []
    try:
        assert httpx.get(srv.url + "/health", timeout=60).status_code == 200  # serving: its handlers are set
        stop_in_its_idle_wait(srv.proc)
        try:
            for _ in range(8):
                clients.append(socket.create_connection((host, int(port)), timeout=60))
                clients[-1].sendall(completion_request({"prompt": LOOPING, "max_tokens": 1900}))
            srv.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
        finally:
            srv.proc.send_signal(signal.SIGCONT)
        answers = [answer_of(c) for c in clients]
        # served is an answer too: a request taken before the signal was seen (were the server run
        # on by something else while stopped, or stopped in another system call than its poll)
        assert set(answers) <= {(503, "shutting_down"), (200, "served")}, answers
        assert (503, "shutting_down") in answers, answers
        assert srv.proc.wait(30) == 143
    finally:
        for c in clients:
            c.close()
        srv.stop()


def test_requests_during_the_drain_are_answered_503_on_kept_and_new_connections(tmp_path):
    """While a running stream holds the drain open, a request on a kept-alive connection and one on
    a new connection each get 503 shutting_down with Connection: close, even when the server takes
    them only after the stream ended."""
    srv = ServeProcess(tmp_path, "--shutdown-timeout", "3")
    host, port = srv.url.removeprefix("http://").split(":")
    try:
        kept = socket.create_connection((host, int(port)), timeout=60)
        kept.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(kept)[0] == 200  # and the connection stays open
        with httpx.Client(base_url=srv.url, timeout=60) as h:
            with h.stream("POST", "/v1/completions", json={"prompt": LOOPING, "max_tokens": 1900,
                                                          "stream": True}) as r:
                lines = r.iter_lines()
                next(line for line in lines if line.startswith("data: "))
                srv.proc.send_signal(signal.SIGTERM)
                srv.wait_for("stopping: no new requests")
                srv.proc.send_signal(signal.SIGSTOP)  # the stream cannot end while the requests are sent
                try:
                    late = socket.create_connection((host, int(port)), timeout=60)
                    for sock in (kept, late):
                        sock.sendall(completion_request({"prompt": "x", "max_tokens": 2}))
                finally:
                    srv.proc.send_signal(signal.SIGCONT)
                for sock in (kept, late):
                    assert answer_of(sock) == (503, "shutting_down")
                    assert sock.recv(1) == b""  # Connection: close, and closed
                    sock.close()
                assert sse_events(lines)[-1] == "[DONE]"
        assert srv.proc.wait(30) == 143
    finally:
        srv.stop()
