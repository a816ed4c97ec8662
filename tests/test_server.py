"""laguna-run serve on 127.0.0.1 (an ephemeral port, inside the test process), driven by the
official ``openai`` package and by httpx: outputs equal the Python API's, streaming and not;
8 concurrent clients get their sequential outputs; a disconnect frees its slot within one round;
every error status; /metrics; 500 short requests with RSS flat; the ``serve`` command itself."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from laguna_dflash.runtime import assets  # noqa: E402
from laguna_dflash.runtime.chat_template import ChatTemplate  # noqa: E402
from laguna_dflash.runtime.cli import main as cli_main  # noqa: E402
from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions  # noqa: E402
from server_harness import TEMPLATE, LiveServer, completion_request, make_pool, openai_client as client  # noqa: E402

PROMPTS = [p[:160] for p in assets.read_prompts(assets.CODE_PROMPTS)]
LOOPING = "def fib(n):\n"  # the bundled target's greedy answer runs 1500 tokens without an end (".0.0.0...")


@pytest.fixture(scope="module")
def ref(models):
    """The Python API on the same models: what the server must answer."""
    target, path, drafter = models
    with Engine(target, path, EngineConfig(n_ctx=2048, kv_type="f32", n_threads=1), drafter_model=drafter) as e:
        yield e


@pytest.fixture(scope="module")
def srv(models):
    target, path, drafter = models
    with LiveServer(make_pool(target, path, drafter, parallel=4, max_queue=8)) as s:
        yield s




def chat_tokens(eng: Engine, messages) -> list[int]:
    return eng.tokenize(ChatTemplate(TEMPLATE, "t").render(messages, add_generation_prompt=True))


def wait_idle(s, timeout=20.0) -> dict:
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=s.url, timeout=10) as h:
        while True:
            st = h.get("/health").json()
            if st["slots_idle"] == st["slots"] and st["queue"] == 0:
                return st
            assert time.monotonic() < deadline, f"slots still busy: {st}"
            time.sleep(0.02)


# ---------------------------------------------------------------------------- the openai client


def test_completions_through_the_openai_client_equal_the_python_api(srv, ref):
    c = client(srv)
    for prompt in PROMPTS[:2]:
        want = ref.generate(prompt, GenerateOptions(n_predict=24, n_max=4))
        r = c.completions.create(model="laguna-tiny", prompt=prompt, max_tokens=24, temperature=0)
        assert r.object == "text_completion" and r.model == "laguna-tiny"
        assert r.choices[0].text == want.text
        assert r.choices[0].finish_reason == "length"
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (want.stats.n_prompt, len(want.tokens))
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
        t = r.model_extra["timings"]
        assert t["predicted_n"] == 24 and t["n_max"] == 4 and t["draft_n"] > 0
        assert 0 <= t["draft_n_accepted"] <= t["draft_n"] and len(t["acceptance_by_position"]) == 4
        assert t["accepted_per_round"] == pytest.approx(t["draft_n_accepted"] / t["rounds"], abs=0.5)
        pieces = [ch.choices[0].text for ch in c.completions.create(
            model="laguna-tiny", prompt=prompt, max_tokens=24, temperature=0, stream=True)]
        assert "".join(pieces) == want.text


def test_chat_through_the_openai_client_streaming_and_not(srv, ref):
    c = client(srv)
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def fib(n):"}]
    want = ref.generate(chat_tokens(ref, messages), GenerateOptions(n_predict=20, n_max=4))
    r = c.chat.completions.create(model="laguna-tiny", messages=messages, max_tokens=20)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == want.text
    assert r.usage.prompt_tokens == want.stats.n_prompt and r.usage.completion_tokens == len(want.tokens)
    chunks = list(c.chat.completions.create(model="laguna-tiny", messages=messages, max_tokens=20, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == want.text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(want.tokens)
    # the second identical request found its prompt in a slot's cache
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == want.stats.n_prompt - 1
    # content as a list of text parts, as editors send it
    parts = [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in messages]
    assert c.chat.completions.create(model="x", messages=parts, max_tokens=20).choices[0].message.content == want.text


def test_per_request_depth_stop_strings_and_models(srv, ref):
    c = client(srv)
    prompt = PROMPTS[2]
    plain = c.completions.create(model="m", prompt=prompt, max_tokens=30, extra_body={"n_max": 0})
    spec = c.completions.create(model="m", prompt=prompt, max_tokens=30, extra_body={"n_max": 2})
    assert plain.choices[0].text == spec.choices[0].text  # greedy: exact at any depth
    assert plain.model_extra["timings"]["draft_n"] == 0 and spec.model_extra["timings"]["draft_n"] > 0
    assert len(spec.model_extra["timings"]["acceptance_by_position"]) == 2
    full = plain.choices[0].text
    stop = full[8:11]
    assert stop and stop in full
    want = ref.generate(prompt, GenerateOptions(n_predict=30, stop=(stop,)))
    assert want.stop_reason == "stop"
    r = c.completions.create(model="m", prompt=prompt, max_tokens=30, stop=[stop, "\x00never"])
    assert r.choices[0].text == want.text == full[:full.find(stop)] and r.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="m", prompt=prompt, max_tokens=30, stop=stop, stream=True))
    assert streamed == want.text
    ids = [m.id for m in c.models.list().data]
    assert ids == ["laguna-tiny"]


def test_a_long_stop_string_is_cut_alike_streamed_and_not(srv, ref):
    """A stop string of many tokens: found by both modes (the old check decoded 16 tokens), no
    byte of it sent, finish_reason stop, and the streamed text equals the whole one."""
    c = client(srv)
    prompt = PROMPTS[1]
    full = ref.generate(prompt, GenerateOptions(n_predict=60))
    assert full.stop_reason == "length"
    n = len(full.text)
    stop = full.text[n // 4:n // 4 + n // 2]  # half the text: far more than 16 tokens
    want = full.text[:full.text.find(stop)]
    r = c.completions.create(model="m", prompt=prompt, max_tokens=60, stop=stop)
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    chunks = list(c.completions.create(model="m", prompt=prompt, max_tokens=60, stop=stop, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].usage.completion_tokens < 60  # it stopped there, not at max_tokens


def test_eight_concurrent_clients_get_their_sequential_outputs(srv):
    prompts = [PROMPTS[i % len(PROMPTS)][: 60 + 11 * i] for i in range(8)]
    c = client(srv)

    def ask(p):
        return c.completions.create(model="m", prompt=p, max_tokens=24).choices[0].text

    sequential = [ask(p) for p in prompts]
    first = len(srv.pool.finished)
    with ThreadPoolExecutor(8) as ex:
        concurrent = list(ex.map(ask, prompts))
    assert concurrent == sequential
    jobs = list(srv.pool.finished)[first:]
    assert len(jobs) == 8 and len({j.slot for j in jobs}) > 1
    overlap = max(sum(1 for j in jobs if j.t_start < k.t_end and k.t_start < j.t_end) for k in jobs)
    assert overlap >= 2, "the requests did not run at the same time"


def test_in_lanes_concurrent_clients_get_their_sequential_outputs_and_spread_over_the_lanes(models):
    target, path, drafter = models
    prompts = [PROMPTS[i % len(PROMPTS)][: 60 + 11 * i] for i in range(6)]
    with LiveServer(make_pool(target, path, drafter, parallel=4, lanes=2, n_threads=2)) as s:
        c = client(s)

        def ask(p):
            return c.completions.create(model="m", prompt=p, max_tokens=24).choices[0].text

        sequential = [ask(p) for p in prompts]
        health = httpx.get(s.url + "/health").json()
        assert [(st["slot"], st["lane"]) for st in health["slot_states"]] == [(0, 0), (1, 1), (2, 0), (3, 1)]
        assert c.models.list().data[0].model_extra["meta"]["lanes"] == 2
        first = len(s.pool.finished)
        with ThreadPoolExecutor(2) as ex:  # two at a time: one in each lane
            concurrent = list(ex.map(ask, prompts))
        jobs = list(s.pool.finished)[first:]
    assert concurrent == sequential
    together = [(j, k) for j in jobs for k in jobs if j is not k and j.t_start < k.t_end and k.t_start < j.t_end]
    assert together, "the requests did not run at the same time"
    assert all(j.slot % 2 != k.slot % 2 for j, k in together), "two requests at once shared a lane"


# ---------------------------------------------------------------------------- errors


def post(s, path, body, **headers):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    with httpx.Client(base_url=s.url, timeout=60) as h:
        return h.post(path, content=data, headers={"content-type": "application/json", **headers})


def assert_error(r, status, param=None, code=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


@pytest.mark.parametrize("path,body,param,code", [
    ("/v1/completions", '{"prompt": "def f(', None, "invalid_json"),
    ("/v1/chat/completions", "not json", None, "invalid_json"),
    ("/v1/completions", [1, 2], None, None),
    ("/v1/completions", {"prompt": "x", "logprobs": 3}, "logprobs", "unknown_parameter"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logit_bias": {"1": 5}},
     "logit_bias", "unknown_parameter"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages", None),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role", None),
    ("/v1/chat/completions", {"messages": []}, "messages", None),
    ("/v1/completions", {}, "prompt", "missing_parameter"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "5"}, "max_tokens", None),
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, "max_tokens", None),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, "temperature", "invalid_value"),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, "top_p", "invalid_value"),
    ("/v1/completions", {"prompt": "x", "n_max": 16}, "n_max", "invalid_value"),
    ("/v1/completions", {"prompt": "x", "n": 2}, "n", None),
    ("/v1/completions", {"prompt": "x", "frequency_penalty": 0.5}, "frequency_penalty", None),
    ("/v1/completions", {"prompt": "x", "stop": ["a", ""]}, "stop", None),
    ("/v1/completions", {"prompt": [1, 99999]}, "prompt", None),
    ("/v1/completions", {"prompt": ["a", "b"]}, "prompt", None),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens", None),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens", None),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1.5}, "max_tokens", None),
    ("/v1/completions", {"prompt": "x " * 2100, "max_tokens": 1}, "prompt", "context_length_exceeded"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x " * 2100}]}, "messages",
     "context_length_exceeded"),
])
def test_bad_requests_are_400_in_the_openai_shape(srv, path, body, param, code):
    err = assert_error(post(srv, path, body), 400, param, code)
    assert err["type"] == "invalid_request_error"


def test_max_tokens_beyond_the_context_generates_until_it_is_full(srv):
    # llama-server's rule (opencode sends 32000 whatever the context): the context of 2048 fills,
    # 16 cells kept free, and the finish reason says the budget ended it
    prompt = "x " * 1990
    with httpx.Client(base_url=srv.url, timeout=120) as h:
        n_prompt = len(h.post("/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"])
        for path, body in (("/v1/completions", {"prompt": prompt}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]})):
            r = h.post(path, json={**body, "max_tokens": 32000, "temperature": 0})
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["choices"][0]["finish_reason"] == "length"
            assert out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"] == 2048 - 16
            if path == "/v1/completions":
                assert out["usage"]["prompt_tokens"] == n_prompt


def test_the_servers_n_predict_caps_every_request(models):
    """serve -n N (llama-server's -n): a larger max_tokens is cut to N, and the reply ends as a
    budget ends it ("length"; Messages: "max_tokens"); a request without one generates N; a
    smaller one keeps its own. Without -n the same request generates its 40."""
    target, path, drafter = models
    body = {"prompt": "def fibonacci(n):", "temperature": 0}
    with LiveServer(make_pool(target, path, drafter), n_predict=5) as s, httpx.Client(base_url=s.url, timeout=120) as h:
        for extra, n in (({"max_tokens": 40}, 5), ({}, 5), ({"max_tokens": 3}, 3)):
            out = h.post("/v1/completions", json={**body, **extra}).json()
            assert (out["usage"]["completion_tokens"], out["choices"][0]["finish_reason"]) == (n, "length"), out
        msg = h.post("/v1/messages", json={"model": "m", "max_tokens": 40, "messages": [
            {"role": "user", "content": "Write a long Python module."}]}).json()
        assert (msg["usage"]["output_tokens"], msg["stop_reason"]) == (5, "max_tokens"), msg
    with LiveServer(make_pool(target, path, drafter)) as s, httpx.Client(base_url=s.url, timeout=120) as h:
        assert h.post("/v1/completions", json={**body, "max_tokens": 40}).json()["usage"]["completion_tokens"] == 40


def test_the_openai_client_reads_the_errors(srv):
    c = client(srv)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="m", prompt="x", max_tokens=3, extra_body={"mystery": 1})
    assert e.value.status_code == 400 and "mystery" in e.value.message
    with httpx.Client(base_url=srv.url) as h:
        assert_error(h.get("/v1/nothing"), 404)
        assert_error(h.get("/v1/completions"), 405)


def test_a_full_queue_is_503_and_queued_requests_run_in_order(models):
    target, path, drafter = models
    with LiveServer(make_pool(target, path, drafter, parallel=1, max_queue=1)) as s:
        long = {"prompt": LOOPING, "max_tokens": 1500, "stream": True}
        order = []
        with httpx.Client(base_url=s.url, timeout=60) as a, httpx.Client(base_url=s.url, timeout=60) as b:
            with a.stream("POST", "/v1/completions", json=long) as ra:
                lines = ra.iter_lines()  # (a dropped iterator would close the connection)
                next(lines)  # A runs
                done_b = threading.Event()

                def second():
                    r = b.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
                    order.append(("b", r.status_code))
                    done_b.set()
                threading.Thread(target=second, daemon=True).start()
                deadline = time.monotonic() + 20
                while s.pool.status()["queue"] != 1:
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
                err = assert_error(post(s, "/v1/completions", {"prompt": "x", "max_tokens": 2}), 503, code="queue_full")
                assert err["type"] == "server_error"
                with pytest.raises(openai.InternalServerError) as e:
                    client(s).completions.create(model="m", prompt="x", max_tokens=2)
                assert e.value.status_code == 503
                assert not done_b.is_set()  # B waits behind A
            assert done_b.wait(30) and order == [("b", 200)]  # A gone: B ran
        wait_idle(s)
        m = s.pool.metrics
        assert m.get("laguna_requests_total", endpoint="completions", outcome="queue_full") == 2


def test_waiting_requests_run_first_in_first_out_and_health_answers_meanwhile(models):
    target, path, drafter = models
    with LiveServer(make_pool(target, path, drafter, parallel=1, max_queue=4)) as s:
        results = {}
        with httpx.Client(base_url=s.url, timeout=60) as a:
            with a.stream("POST", "/v1/completions", json={"prompt": LOOPING, "max_tokens": 1500,
                                                          "stream": True}) as ra:
                lines = ra.iter_lines()
                next(lines)
                threads = []
                for i, name in enumerate("bcd"):
                    def ask(name=name, i=i):
                        with httpx.Client(base_url=s.url, timeout=60) as h:
                            results[name] = h.post("/v1/completions", json={"prompt": f"x{i}", "max_tokens": 2})
                    threads.append(threading.Thread(target=ask, daemon=True))
                    threads[-1].start()
                    deadline = time.monotonic() + 20
                    while s.pool.status()["queue"] != i + 1:  # each waits before the next is sent
                        assert time.monotonic() < deadline
                        time.sleep(0.005)
                # the event loop is free while a slot generates: /health answers at once
                with httpx.Client(base_url=s.url, timeout=10) as h:
                    t0 = time.perf_counter()
                    health = h.get("/health").json()
                    assert time.perf_counter() - t0 < 1.0
                    assert health["queue"] == 3
                    assert health["slot_states"] == [{"slot": 0, "state": "decoding", "endpoint": "completions",
                                                      "n_prompt": len(s.pool.engine.tokenize(LOOPING)),
                                                      "rounds": health["slot_states"][0]["rounds"]}]
                    assert scrape(s)['laguna_slot_busy{slot="0"}'] == 1
            for t in threads:
                t.join(30)
        assert [results[n].status_code for n in "bcd"] == [200, 200, 200]
        want = [s.pool.engine.tokenize(f"x{i}") for i in range(3)]
        jobs = sorted((j for j in s.pool.finished if j.tokens in want), key=lambda j: j.t_start)
        assert [j.tokens for j in jobs] == want


def test_a_wrong_or_missing_api_key_is_401(models, caplog):
    target, path, drafter = models
    key = "s3cret-key-for-tests"
    caplog.set_level("DEBUG")
    with LiveServer(make_pool(target, path, drafter), api_key=key) as s:
        with pytest.raises(openai.AuthenticationError):
            client(s, key="wrong").completions.create(model="m", prompt="x", max_tokens=2)
        assert_error(post(s, "/v1/completions", {"prompt": "x"}), 401, code="invalid_api_key")
        assert_error(post(s, "/v1/completions", {"prompt": "x"}, authorization=f"Basic {key}"), 401)
        assert_error(post(s, "/v1/completions", "{bad json", authorization="Bearer nope"), 401)
        with httpx.Client(base_url=s.url) as h:
            assert_error(h.get("/metrics"), 401)
            assert_error(h.get("/v1/models"), 401)
            assert h.get("/health").status_code == 200
        r = client(s, key=key).completions.create(model="m", prompt="x", max_tokens=2)
        assert r.usage.completion_tokens == 2
    assert key not in caplog.text


# ---------------------------------------------------------------------------- disconnects


def finished_job(s, before: int):
    deadline = time.monotonic() + 20
    while len(s.pool.finished) <= before:
        assert time.monotonic() < deadline, "the job never finished"
        time.sleep(0.01)
    return s.pool.finished[before]


@pytest.mark.parametrize("stream", [True, False])
def test_a_disconnect_cancels_within_one_round_and_frees_the_slot(models, stream):
    target, path, drafter = models
    with LiveServer(make_pool(target, path, drafter, parallel=1, max_queue=2)) as s:
        body = {"prompt": LOOPING, "max_tokens": 1500, "stream": stream}
        before = len(s.pool.finished)
        if stream:
            with httpx.Client(base_url=s.url, timeout=60) as h:
                with h.stream("POST", "/v1/completions", json=body) as r:
                    lines = r.iter_lines()
                    got = 0
                    while got < 4:
                        got += next(lines).startswith("data: ")
        else:
            # the client hangs up once its job has run a few rounds, whatever the machine's pace
            # (a read timeout raced it: on a fast CPU the 1500 tokens came back first)
            with socket.create_connection(("127.0.0.1", s.port)) as sock:
                sock.sendall(completion_request(body))
                deadline = time.monotonic() + 20
                while (job := s.pool.slots[0].job) is None or job.rounds < 4:
                    assert len(s.pool.finished) == before and time.monotonic() < deadline, \
                        "the job ended, or never ran, before its client hung up"
                    time.sleep(0.001)
        job = finished_job(s, before)
        wait_idle(s)
        assert job.outcome_label == "cancelled"
        assert job.rounds_after_cancel is not None and job.rounds_after_cancel <= 1
        assert job.rounds < 1000  # far from the 1500 tokens asked for
        # the slot serves the next request
        r = client(s).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=3)
        assert r.usage.completion_tokens == 3
        assert s.pool.metrics.get("laguna_requests_total", endpoint="completions", outcome="cancelled") == 1


# ---------------------------------------------------------------------------- metrics, health, soak


def scrape(s) -> dict[str, float]:
    with httpx.Client(base_url=s.url) as h:
        r = h.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_count_what_the_responses_report(srv):
    c = client(srv)
    wait_idle(srv)
    before = scrape(srv)
    rs = [c.completions.create(model="m", prompt=p, max_tokens=12) for p in PROMPTS[3:5]]
    after = scrape(srv)

    def delta(name):
        return after.get(name, 0) - before.get(name, 0)
    assert delta('laguna_requests_total{endpoint="completions",outcome="ok"}') == 2
    assert delta("laguna_generated_tokens_total") == sum(r.usage.completion_tokens for r in rs)
    assert delta("laguna_prompt_tokens_total") == sum(r.usage.prompt_tokens for r in rs)
    assert delta("laguna_drafted_tokens_total") == sum(r.model_extra["timings"]["draft_n"] for r in rs)
    assert delta("laguna_accepted_tokens_total") == sum(r.model_extra["timings"]["draft_n_accepted"] for r in rs)
    assert delta("laguna_rounds_total") == sum(r.model_extra["timings"]["rounds"] for r in rs)
    assert 0 <= after['laguna_acceptance_by_position{position="1"}'] <= 1
    assert delta('laguna_phase_seconds_total{phase="verify"}') > 0
    assert after["laguna_queue_depth"] == 0 and after["laguna_slots"] == 4 and after["laguna_slots_busy"] == 0
    assert [after[f'laguna_slot_busy{{slot="{i}"}}'] for i in range(4)] == [0, 0, 0, 0]
    assert delta('laguna_requests_total{endpoint="completions",outcome="bad_request"}') == 0


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
def test_500_short_requests_keep_rss_flat(srv):
    """Completions and chats, streamed and not, over one keep-alive connection; RSS (server and
    client, one process) after 500 within 10% of after the first 50."""
    chat = [{"role": "user", "content": "x"}]
    statuses = []
    with httpx.Client(base_url=srv.url, timeout=60) as h:
        def one(i):
            body = {"max_tokens": 2, "stream": i % 5 == 0}
            if i % 2:
                body["messages"] = chat + [{"role": "user", "content": f"n = {i}"}]
                path = "/v1/chat/completions"
            else:
                body["prompt"] = f"{PROMPTS[i % 4][:40]}{i}"
                path = "/v1/completions"
            r = h.post(path, json=body)
            statuses.append(r.status_code)
            if body["stream"]:
                assert r.text.rstrip().endswith("data: [DONE]")
            else:
                assert r.json()["usage"]["completion_tokens"] <= 2
        for i in range(50):
            one(i)
        base = rss_bytes()
        t0 = time.monotonic()
        for i in range(50, 550):
            one(i)
        grown = rss_bytes()
    assert statuses == [200] * 550
    assert abs(grown - base) <= 0.10 * base, f"RSS {base / 2**20:.1f} -> {grown / 2**20:.1f} MiB"
    assert time.monotonic() - t0 < 300


# ---------------------------------------------------------------------------- the serve command


def test_serve_refuses_bad_flags_with_one_line_and_exit_2(capsys):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        for args, needle in ((["--parallel", "0"], "--parallel"), (["--port", "70000"], "--port"),
                             (["--max-queue", "-1"], "--max-queue"), (["--n-max", "16"], "--n-max"),
                             (["--api-key", " "], "--api-key"), (["--parallel", "2", "--lanes", "3"], "--lanes"),
                             (["--port", str(busy.getsockname()[1])], "cannot listen"),
                             (["--chat-template-file", "/nonexistent.jinja"], "/nonexistent.jinja")):
            code = cli_main(["serve", *args])
            err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
            assert code == 2 and len(err) == 1 and needle in err[0], (args, err)
    finally:
        busy.close()


def test_laguna_run_serve_starts_answers_and_stops_on_ctrl_c(tmp_path):
    import queue

    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE)
    proc = subprocess.Popen([sys.executable, "-m", "laguna_dflash.runtime.cli", "serve", "--port", "0", "-c", "1024", "-t", "1",
                             "--chat-template-file", str(template), "--api-key", "sekret-xyz"],
                            stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stderr], daemon=True).start()
    seen = []
    try:
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                assert proc.poll() is None, "".join(seen)
                continue
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", seen[-1])
            url = m and m.group(1)
        assert url, "".join(seen)
        c = openai.OpenAI(base_url=url + "/v1", api_key="sekret-xyz", max_retries=0, timeout=60)
        r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "def f():"}], max_tokens=4)
        assert r.usage.completion_tokens == 4 and r.model == assets.TINY_TARGET.name
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130  # a graceful shutdown, then Ctrl-C's exit code, as laguna-run's
        time.sleep(0.2)
        while not lines.empty():
            seen.append(lines.get())
        assert "sekret-xyz" not in "".join(seen)  # never printed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
