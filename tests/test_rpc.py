"""The target over llama.cpp's RPC backend, on loopback: laguna-rpc-server processes started
here, greedy output equal to the local run, and every fault (unreachable server, protocol
version mismatch, a server killed mid-generation, the server mode after that) an error, never
an abort of this process. Every server started here is killed in a finally."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from laguna_dflash.runtime import rpc
from laguna_dflash.runtime.cli import main as cli_main
from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions
from laguna_dflash.runtime.rpc_server import main as rpc_server_main

REPO = Path(__file__).resolve().parent.parent
PROMPT = [int(t) for t in np.random.default_rng(7).integers(16, 512, size=40)]
N_PREDICT = 24
DEPTHS = (0, 4, "auto")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command() -> list[str]:
    script = Path(sys.executable).parent / "laguna-rpc-server"  # the console script pip installed
    return [str(script)] if script.exists() else [sys.executable, "-m", "laguna_dflash.runtime.rpc_server"]


@contextlib.contextmanager
def rpc_servers(n: int, *extra: str, threads: int = 1):
    """n laguna-rpc-server processes on free loopback ports; killed however the block ends."""
    procs, endpoints = [], []
    try:
        for _ in range(n):
            port = free_port()
            procs.append(subprocess.Popen([*server_command(), "--port", str(port), "--threads", str(threads), *extra],
                                          cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            endpoints.append(f"127.0.0.1:{port}")
        for proc, ep in zip(procs, endpoints):
            deadline = time.monotonic() + 30
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"laguna-rpc-server exited with {proc.returncode}: "
                                       f"{proc.stderr.read().decode(errors='replace')}")
                try:
                    rpc.probe(ep, timeout=1.0)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        yield endpoints, procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for proc in procs:
            proc.wait(10)
            proc.stderr.close()


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_target):
    from test_engine import make_drafter

    return tiny_target["gguf"], make_drafter(tmp_path_factory.mktemp("rpc"), "d", tiny_target["gguf"])


@pytest.fixture(scope="module")
def servers():
    with rpc_servers(2) as (endpoints, _):
        yield endpoints


def config(**kw) -> EngineConfig:
    return EngineConfig(**{"n_ctx": 512, "kv_type": "f32", "n_threads": 1, "prompt_cache": False, **kw})


def outputs(target, drafter, cfg: EngineConfig) -> dict:
    from laguna_dflash.runtime.llama import set_verbose

    try:
        with Engine.load(target, drafter, cfg) as eng:
            return {d: eng.generate(PROMPT, GenerateOptions(n_predict=N_PREDICT, n_max=d)).tokens for d in DEPTHS}
    finally:
        set_verbose(False)


@pytest.fixture(scope="module")
def local(pair):
    return outputs(*pair, config())


def test_the_wheel_has_the_rpc_backend_and_its_server():
    assert rpc.supported(), "llama-cpp-python lacks the RPC backend or patch 0022: run laguna-run setup"
    assert rpc.client_version()[0] >= 7
    from laguna_dflash.runtime.rpc_server import server_binary

    assert os.access(server_binary(), os.X_OK)


def buffers_by_device(log: str) -> dict[str, float]:
    """llama.cpp's 'DEVICE model buffer size = X MiB' lines of a verbose load."""
    out = {}
    for line in log.splitlines():
        if "model buffer size" in line:
            dev = line.split("load_tensors:")[-1].split("model buffer size")[0].strip()
            out[dev] = float(line.split("=")[-1].split()[0])
    return out


def test_split_across_two_servers_equals_local_at_every_depth(pair, servers, local, capfd):
    got = outputs(*pair, config(rpc=tuple(servers), tensor_split=(1.0, 2.0), verbose=True))
    log = capfd.readouterr().err
    for d in DEPTHS:
        assert got[d] == local[d], f"n_max {d}"
    devices = buffers_by_device(log)
    remote = [d for d in devices if d.startswith("RPC")]
    assert len(remote) == 2 and all(devices[d] > 0 for d in remote), devices
    assert "offloaded 7/7 layers" in log  # every layer and the head's slot; the head's weights stay here


def test_one_server_plus_this_machine_equals_local(pair, servers, local, capfd):
    got = outputs(*pair, config(rpc=(servers[0],), n_gpu_layers=3, verbose=True))
    log = capfd.readouterr().err
    assert got == local
    devices = buffers_by_device(log)
    assert any(d.startswith("RPC") for d in devices) and any(d.startswith("CPU") for d in devices), devices
    assert "offloaded 3/7 layers" in log


def test_drafter_on_the_servers_too_equals_local(pair, servers, local):
    got = outputs(*pair, config(rpc=tuple(servers), draft_rpc=True))
    assert got == local


def test_unreachable_server_is_one_line_and_exit_2_before_any_model(pair, monkeypatch, capsys):
    import laguna_dflash.runtime.engine

    def no_model(*a, **k):
        raise AssertionError("a model was loaded before the RPC servers were checked")

    monkeypatch.setattr(laguna_dflash.runtime.engine, "Model", no_model)
    port = free_port()  # nothing listens there
    code = cli_main(["-m", str(pair[0]), "-md", str(pair[1]), "-p", "x", "-n", "2", "--rpc", f"127.0.0.1:{port}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and f"127.0.0.1:{port}" in err[0] and "cannot connect" in err[0], err


@pytest.mark.parametrize("value", ["localhost", "127.0.0.1:0", "127.0.0.1:99999", "a:1,a:1", ""])
def test_bad_rpc_values_are_one_line_and_exit_2(pair, value, capsys):
    code = cli_main(["-m", str(pair[0]), "-p", "x", "--rpc", value])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: --rpc"), err


def test_tensor_split_without_rpc_or_with_too_many_values_is_refused(pair, servers, capsys):
    assert cli_main(["-m", str(pair[0]), "-p", "x", "--tensor-split", "1,1"]) == 2
    assert "needs --rpc" in capsys.readouterr().err
    assert cli_main(["-m", str(pair[0]), "-p", "x", "--rpc", servers[0], "--tensor-split", "1,1,1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "3 proportions for 1 device" in err[0], err


@contextlib.contextmanager
def fake_server(version: tuple[int, int, int]):
    """Answers one RPC HELLO with ``version`` (an rpc-server of another llama.cpp), then closes."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    stop = threading.Event()

    def serve():
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(1 + 8 + 24)
                    conn.sendall(struct.pack("<Q", 28) + bytes(version) + bytes(25))
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        sock.close()


def test_protocol_version_mismatch_names_both_versions(pair, capsys):
    client = rpc.format_version(rpc.client_version())
    with fake_server((rpc.client_version()[0] - 1, 0, 0)) as ep:
        code = cli_main(["-m", str(pair[0]), "-p", "x", "--rpc", ep])
    err = capsys.readouterr().err.strip().splitlines()
    old = f"{rpc.client_version()[0] - 1}.0.0"
    assert code == 2 and len(err) == 1, err
    assert ep in err[0] and old in err[0] and client in err[0], err


def test_a_server_killed_mid_generation_ends_the_request_with_an_error(pair, local):
    with rpc_servers(1) as (endpoints, procs):
        eng = Engine.load(*pair, config(rpc=tuple(endpoints)))
        try:
            killed_at = []

            def kill_after_third_round(record):
                if record["round"] == 3 and not killed_at:
                    procs[0].send_signal(signal.SIGKILL)
                    procs[0].wait(10)
                    killed_at.append(time.monotonic())

            with pytest.raises(rpc.RpcError, match=endpoints[0]) as info:
                eng.generate(PROMPT, GenerateOptions(n_predict=200, n_max=4, trace=kill_after_third_round))
            assert killed_at and time.monotonic() - killed_at[0] < 5.0
            assert "connection lost" in str(info.value)
            # the engine stays refused (its weights are gone), this process goes on
            with pytest.raises(rpc.RpcError):
                eng.generate(PROMPT, GenerateOptions(n_predict=4, n_max=0))
        finally:
            eng.close()
    # a local engine in the same process still works, and gives the same output
    assert outputs(*pair, config())[4] == local[4]


def test_a_server_that_stops_answering_is_lost_after_the_timeout_not_waited_for(pair):
    with rpc_servers(1) as (endpoints, procs):
        eng = Engine.load(*pair, config(rpc=tuple(endpoints), rpc_timeout_s=1.0))
        try:
            stopped = []

            def stop_after_second_round(record):
                if record["round"] == 2 and not stopped:
                    procs[0].send_signal(signal.SIGSTOP)  # alive, connected, silent
                    stopped.append(time.monotonic())

            with pytest.raises(rpc.RpcError, match="did not answer in time"):
                eng.generate(PROMPT, GenerateOptions(n_predict=200, n_max=4, trace=stop_after_second_round))
            assert stopped and time.monotonic() - stopped[0] < 1.0 + 3.0
        finally:
            eng.close()  # rpc_servers kills the stopped process (SIGKILL reaches it)


def test_the_server_mode_answers_503_after_a_lost_backend_and_keeps_serving(pair):
    import httpx

    from laguna_dflash.runtime.server.pool import load_pool
    from server_harness import LiveServer

    with rpc_servers(1) as (endpoints, procs):
        pool = load_pool(*pair, config(rpc=tuple(endpoints)), parallel=1)
        try:
            with LiveServer(pool) as srv:
                body = {"model": "laguna-tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
                ok = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
                assert ok.status_code == 200, ok.text
                procs[0].kill()
                procs[0].wait(10)
                t0 = time.monotonic()
                lost = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
                assert time.monotonic() - t0 < 10
                assert lost.status_code == 503, lost.text
                assert lost.json()["error"]["code"] == "backend_lost" and endpoints[0] in lost.text
                again = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
                assert again.status_code == 503 and "restart" in again.json()["error"]["message"]
                health = httpx.get(srv.url + "/health", timeout=10)
                assert health.status_code == 503 and endpoints[0] in health.json()["error"]
                assert httpx.get(srv.url + "/v1/models", timeout=10).status_code == 200  # still serving
        finally:
            pool.close()


def test_a_server_memory_cap_refuses_the_load_instead_of_aborting(pair):
    from laguna_dflash.runtime.llama import LlamaError

    with rpc_servers(1, "--mem", "1") as (endpoints, _):  # 1 MiB: less than the tiny target's layers
        with pytest.raises(LlamaError, match="refused to load"):
            Engine.load(*pair, config(rpc=tuple(endpoints)))


def live_threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts a process's threads in /proc")
def test_a_server_of_several_threads_keeps_its_workers_between_graphs(pair):
    # Without OpenMP a CPU device with no thread pool starts and joins its workers at every graph
    # it computes (half the tokens/s at --threads 2); the server attaches one pool of --threads
    # threads (patch 0024), whose workers live as long as the server.
    from laguna_dflash.runtime import llama

    if "OPENMP" in llama.cpu_backend_features():
        pytest.skip("an OpenMP build's pool has no workers of its own")
    with rpc_servers(1, threads=3) as (endpoints, procs):
        pid = procs[0].pid  # laguna-rpc-server execs the binary: the same process
        assert live_threads(pid) == 3
        with Engine.load(*pair, config(rpc=tuple(endpoints))) as eng:
            assert len(eng.generate(PROMPT, GenerateOptions(n_predict=4, n_max=0)).tokens) == 4
            assert live_threads(pid) == 3


def test_laguna_rpc_server_binds_loopback_unless_exposed(monkeypatch, capsys):
    assert rpc_server_main(["--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--expose" in err[0] and "no authentication or encryption" in err[0], err
    assert rpc_server_main(["--port", "0"]) == 2
    assert rpc_server_main(["--mem", "-5"]) == 2
    capsys.readouterr()
    launched = []
    monkeypatch.setattr(os, "execv", lambda path, args: launched.append(args))
    port = free_port()
    assert rpc_server_main(["--host", "0.0.0.0", "--port", str(port), "--expose", "--mem", "512"]) == 0
    assert "no authentication or encryption" in capsys.readouterr().err
    assert launched[0][1:] == ["--host", "0.0.0.0", "--port", str(port), "--mem", "512"]
    assert rpc_server_main(["--port", str(port)]) == 0  # loopback: no warning
    assert "WARNING" not in capsys.readouterr().err
    assert launched[1][1:3] == ["--host", "127.0.0.1"]


def test_cpu_and_cuda_wheels_are_built_with_rpc_and_the_cache_key_covers_it(monkeypatch):
    from laguna_dflash.runtime.setup import wheel as bw

    monkeypatch.setattr(bw, "cublas_flags", lambda: [])  # no toolkit probing or downloads here
    monkeypatch.setattr(bw, "driver_flags", lambda: [])
    patches = bw.series()
    assert {"0020-rpc-server-in-wheel.patch", "0021-rpc-server-mem-cap.patch",
            "0022-rpc-client-fails-gracefully.patch"} <= {p.name for p in patches}
    for cuda in (False, True):
        flags = bw.build_flags(cuda, "90")
        assert "-DGGML_RPC=ON" in flags and ("-DGGML_CUDA=on" in flags) == cuda
        without = [f for f in flags if f != "-DGGML_RPC=ON"]
        assert bw.cache_key(patches, flags) != bw.cache_key(patches, without)
