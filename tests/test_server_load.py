"""A bounded load test of laguna-run serve on loopback (issue 31): 16 concurrent clients send
1,000 mixed requests (completions and chats, streamed or not, streams cancelled mid-way,
malformed and oversized bodies). No 5xx, no request lost, every answer is its own prompt's
greedy output (nothing mixed between requests), the server's RSS flat within 10% after the
warm-up, and /health answering throughout. The server is ``laguna-run serve`` in a child process
(its own interpreter: the clients' threads do not compete with it for the GIL, and its RSS is
its own); max_tokens is tiny so that it runs in well under two minutes."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from laguna_dflash.runtime import assets  # noqa: E402
from laguna_dflash.runtime.chat_template import ChatTemplate  # noqa: E402
from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions  # noqa: E402
from server_harness import TEMPLATE  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

CLIENTS = 16
REQUESTS = 1000
WARM_UP = 200
MAX_TOKENS = 4
BODY_LIMIT = 64 << 10
LOOPING = "def fib(n):\n"
#: request kinds by i % 20
KINDS = (["completion"] * 6 + ["chat"] * 4 + ["completion-stream"] * 4 + ["chat-stream"] * 2
         + ["cancelled"] + ["malformed"] + ["oversized"] + ["invalid"])


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def prompts() -> tuple[list[str], list[list[dict]]]:
    code = [p[: 40 + 9 * (i % 5)] for i, p in enumerate(assets.read_prompts(assets.CODE_PROMPTS))][:12]
    chats = [[{"role": "user", "content": f"{p[:30]}"}] for p in code[:8]]
    return code, chats


@pytest.fixture(scope="module")
def reference(models):
    """Each prompt's greedy answer from the Python API: what the server must send back for it."""
    target, path, drafter = models
    code, chats = prompts()
    template = ChatTemplate(TEMPLATE, "t")
    with Engine(target, path, EngineConfig(n_ctx=2048, kv_type="f32", n_threads=1), drafter_model=drafter) as e:
        completions = [e.generate(p, GenerateOptions(n_predict=MAX_TOKENS, n_max=4)).text for p in code]
        chat_out = [e.generate(e.tokenize(template.render(m, add_generation_prompt=True)),
                               GenerateOptions(n_predict=MAX_TOKENS, n_max=4)).text for m in chats]
    return code, chats, completions, chat_out


def sse_text(lines, chat: bool) -> tuple[str, str | None, bool]:
    text, finish, done = [], None, False
    for line in lines:
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            continue
        event = json.loads(line[6:])
        assert "error" not in event, event
        choice = event["choices"][0]
        text.append((choice["delta"].get("content") or "") if chat else choice["text"])
        finish = choice["finish_reason"] or finish
    return "".join(text), finish, done


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
def test_sixteen_clients_a_thousand_mixed_requests(reference, tmp_path):
    code, chats, want_completion, want_chat = reference
    results: list = [None] * REQUESTS
    health: list = []
    rss: dict = {}
    chat_file = tmp_path / "chat.jinja"
    chat_file.write_text(TEMPLATE)
    proc = subprocess.Popen(
        [sys.executable, "-m", "laguna_dflash.runtime.cli", "serve", "--port", "0", "-c", "2048", "-t", "1",
         "--cache-type", "f32", "--parallel", "2", "--max-queue", str(2 * CLIENTS), "--max-body-bytes",
         str(BODY_LIMIT), "--chat-template-file", str(chat_file)], stderr=subprocess.PIPE, text=True, cwd=ROOT)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stderr], daemon=True).start()
    try:
        url, seen = None, []
        while url is None:
            seen.append(lines.get(timeout=120))
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", seen[-1])
            url = m and m.group(1)
        stop_health = threading.Event()

        def watch_health():
            with httpx.Client(base_url=url, timeout=5) as h:
                while not stop_health.is_set():
                    t0 = time.perf_counter()
                    try:
                        r = h.get("/health")
                        health.append((r.status_code, time.perf_counter() - t0))
                    except httpx.HTTPError as e:
                        health.append((repr(e), time.perf_counter() - t0))
                    stop_health.wait(0.1)

        def one(h: httpx.Client, drop: httpx.Client, i: int):
            kind = KINDS[i % len(KINDS)]
            p = (i * 7) % len(code)
            c = (i * 5) % len(chats)
            if kind in ("completion", "completion-stream"):
                body = {"prompt": code[p], "max_tokens": MAX_TOKENS, "stream": kind.endswith("stream")}
                if body["stream"]:
                    with h.stream("POST", "/v1/completions", json=body) as r:
                        return kind, r.status_code, sse_text(r.iter_lines(), chat=False), want_completion[p]
                r = h.post("/v1/completions", json=body)
                return kind, r.status_code, r.json(), want_completion[p]
            if kind in ("chat", "chat-stream"):
                body = {"messages": chats[c], "max_tokens": MAX_TOKENS, "stream": kind.endswith("stream")}
                if body["stream"]:
                    with h.stream("POST", "/v1/chat/completions", json=body) as r:
                        return kind, r.status_code, sse_text(r.iter_lines(), chat=True), want_chat[c]
                r = h.post("/v1/chat/completions", json=body)
                return kind, r.status_code, r.json(), want_chat[c]
            if kind == "cancelled":  # the stream is closed after its first event: its connection drops
                body = {"prompt": LOOPING + str(i), "max_tokens": 400, "stream": True}
                with drop.stream("POST", "/v1/completions", json=body) as r:
                    first = next(line for line in r.iter_lines() if line.startswith("data: "))
                return kind, r.status_code, first, None
            if kind == "malformed":
                r = h.post("/v1/completions", content=b'{"prompt": "x", "max_tokens": ',
                           headers={"content-type": "application/json"})
            elif kind == "oversized":
                r = h.post("/v1/completions", json={"prompt": "x" * BODY_LIMIT})
            else:
                r = h.post("/v1/chat/completions", json={"messages": chats[c], "temperature": -1})
            return kind, r.status_code, r.json(), None

        warm = threading.Barrier(CLIENTS + 1)
        measured = threading.Barrier(CLIENTS + 1)
        errors: list = []

        def client(k: int):
            try:
                with httpx.Client(base_url=url, timeout=60) as h, httpx.Client(base_url=url, timeout=60) as drop:
                    for i in range(k, WARM_UP, CLIENTS):
                        results[i] = one(h, drop, i)
                    warm.wait()
                    measured.wait()
                    for i in range(WARM_UP + k, REQUESTS, CLIENTS):
                        results[i] = one(h, drop, i)
            except BaseException as e:  # noqa: BLE001 (reported below)
                errors.append(e)
                warm.abort()
                measured.abort()

        watcher = threading.Thread(target=watch_health, daemon=True)
        watcher.start()
        t0 = time.monotonic()
        clients = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(CLIENTS)]
        for t in clients:
            t.start()
        warm.wait(timeout=300)
        rss["warm"] = rss_bytes(proc.pid)
        measured.wait(timeout=10)
        for t in clients:
            t.join(300)
        elapsed = time.monotonic() - t0
        rss["end"] = rss_bytes(proc.pid)
        stop_health.set()
        watcher.join(10)
        assert not errors, errors[0]
        with httpx.Client(base_url=url, timeout=10) as h:
            deadline = time.monotonic() + 30
            while h.get("/health").json()["slots_idle"] != 2:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            metrics = h.get("/metrics").text
        cancelled = float(re.search(r'laguna_requests_total\{endpoint="completions",outcome="cancelled"\} (\S+)',
                                    metrics).group(1))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

    assert all(r is not None for r in results), "a request got no answer"
    by_kind: dict[str, int] = {}
    for i, (kind, status, got, want) in enumerate(results):
        by_kind[kind] = by_kind.get(kind, 0) + 1
        assert status < 500, (i, kind, status, got)
        if kind in ("completion", "chat"):
            assert status == 200, (i, got)
            choice = got["choices"][0]
            text = choice["text"] if kind == "completion" else choice["message"]["content"]
            assert text == want, (i, kind, text, want)
            assert got["usage"]["completion_tokens"] <= MAX_TOKENS
        elif kind.endswith("stream"):
            text, finish, done = got
            assert status == 200 and done and finish in ("length", "stop"), (i, got)
            assert text == want, (i, kind, text, want)
        elif kind == "cancelled":
            assert status == 200 and got.startswith("data: ")
        else:
            expected = {"malformed": (400, "invalid_json"), "oversized": (413, "request_too_large"),
                        "invalid": (400, "invalid_value")}[kind]
            assert (status, got["error"]["code"]) == expected, (i, got)
    assert sum(by_kind.values()) == REQUESTS and by_kind["cancelled"] == REQUESTS // len(KINDS)
    assert cancelled >= 0.8 * by_kind["cancelled"], f"only {cancelled} streams were cancelled mid-way"
    assert health and all(status == 200 for status, _ in health), [h for h in health if h[0] != 200][:5]
    assert len(health) >= elapsed / 0.5, f"/health answered {len(health)} times in {elapsed:.0f} s"
    assert abs(rss["end"] - rss["warm"]) <= 0.10 * rss["warm"], \
        f"RSS {rss['warm'] / 2**20:.1f} -> {rss['end'] / 2**20:.1f} MiB"
    print(f"\n{REQUESTS} requests from {CLIENTS} clients in {elapsed:.1f} s; RSS "
          f"{rss['warm'] / 2**20:.1f} -> {rss['end'] / 2**20:.1f} MiB; /health max "
          f"{max(t for _, t in health) * 1e3:.0f} ms")
