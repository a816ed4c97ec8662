"""laguna-run and bench never destroy an input and never lose a result (issue 31): every output
(--trace, --json, --png, stdout) is checked before any model loads, written through a partial
file, and a failed write is one line naming the path, exit 2, with the results put elsewhere."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gguf import GGUFValueType as T

from laguna_dflash.runtime import outputs
from laguna_dflash.runtime.cli import main
from gguf_mutate import Source, encode_value
from test_engine import make_drafter

REPO = Path(__file__).resolve().parent.parent
SLOW_TEMPLATE = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_target):
    d = make_drafter(tmp_path_factory.mktemp("cli-outputs"), "d", tiny_target["gguf"])
    return Path(tiny_target["gguf"]), Path(d)


@pytest.fixture
def pair(tmp_path, built):
    """Copies of the pair and a prompt file: a test that destroyed one would show it."""
    target, drafter = tmp_path / "target.gguf", tmp_path / "drafter.gguf"
    shutil.copy(built[0], target)
    shutil.copy(built[1], drafter)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("import os\n")
    return target, drafter, prompt


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_error(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:") or "Traceback" in ln]
    assert len(err) == 1, err
    return err[0]


def run_args(target, drafter, *extra) -> list[str]:
    return ["-m", str(target), "-md", str(drafter), "-n", "4", "-t", "1", "-c", "256", *extra]


def bench_args(target, drafter, prompt, *extra) -> list[str]:
    return ["bench", "-m", str(target), "-md", str(drafter), "--prompts", str(prompt), "-n", "3", "-t", "1",
            "-c", "256", "--n-max", "2", *extra]


@pytest.mark.parametrize("victim", ["target", "drafter", "prompt", "hard link", "symlink"])
def test_trace_onto_an_input_is_refused_and_the_input_kept(pair, tmp_path, capsys, victim):
    target, drafter, prompt = pair
    if victim == "hard link":
        out = tmp_path / "trace.jsonl"
        os.link(target, out)
    elif victim == "symlink":
        out = tmp_path / "trace.jsonl"
        out.symlink_to(drafter)
    else:
        out = {"target": target, "drafter": drafter, "prompt": prompt}[victim]
    before = {p: digest(p) for p in pair}
    assert main(run_args(target, drafter, "-f", str(prompt), "--trace", str(out))) == 2
    assert "--trace: is an input of this run" in one_error(capsys)
    assert {p: digest(p) for p in pair} == before


@pytest.mark.parametrize("flag", ["--json", "--png"])
def test_bench_outputs_onto_an_input_are_refused(pair, capsys, flag):
    pytest.importorskip("matplotlib")
    target, drafter, prompt = pair
    before = {p: digest(p) for p in pair}
    for victim in (target, drafter, prompt):
        assert main(bench_args(target, drafter, prompt, flag, str(victim))) == 2
        error = one_error(capsys)  # --png onto a .gguf or .txt: its suffix is refused first
        assert f"{flag}: is an input of this run" in error or f"{flag}: expected a name ending in" in error
    assert {p: digest(p) for p in pair} == before


def test_devices_fifos_and_wrong_formats_are_refused_before_the_run(pair, tmp_path, capsys):
    target, drafter, prompt = pair
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    assert main(run_args(target, drafter, "-p", "x", "--trace", "/dev/full")) == 2
    assert "/dev/full: --trace: expected a regular file to write, found a character device" in one_error(capsys)
    assert main(run_args(target, drafter, "-p", "x", "--trace", str(fifo))) == 2  # would block on open
    assert "found a FIFO" in one_error(capsys)
    if pytest.importorskip("matplotlib"):
        assert main(bench_args(target, drafter, prompt, "--png", str(tmp_path / "out.txt"))) == 2
        assert "--png: expected a name ending in one of" in one_error(capsys)
    assert time.monotonic() - t0 < 60  # refused up front, not after a bench (a hang guard, not a benchmark)
    assert not (tmp_path / "out.txt").exists()


def test_a_full_disk_for_bench_json_keeps_the_old_file_and_prints_the_results(pair, tmp_path, capsys,
                                                                              monkeypatch):
    target, drafter, prompt = pair
    out = tmp_path / "bench.json"
    out.write_text('{"old": true}')
    real = outputs._create_temp
    monkeypatch.setattr(outputs, "_create_temp", lambda path, mode: os.open("/dev/full", os.O_WRONLY)
                        if path.name.startswith("bench.json.partial") else real(path, mode))
    assert main(bench_args(target, drafter, prompt, "--json", str(out))) == 2
    captured = capsys.readouterr()
    err = [ln for ln in captured.err.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and f"{out}: --json: write failed (No space left on device)" in err[0]
    assert "the results were written to stderr instead" in err[0]
    start = captured.err.index("{\n")
    result = json.loads(captured.err[start:captured.err.index("\n}\n", start) + 2])
    assert result["rows"] and out.read_text() == '{"old": true}'
    assert not list(tmp_path.glob("*.partial-*"))


def test_a_trace_that_cannot_be_written_mid_run_stops_with_one_line(pair, tmp_path, capsys, monkeypatch):
    target, drafter, prompt = pair
    trace = tmp_path / "rounds.jsonl"
    monkeypatch.setattr(outputs, "_create_temp", lambda path, mode: os.open("/dev/full", os.O_WRONLY))
    assert main(run_args(target, drafter, "-p", "import os", "-n", "40", "--trace", str(trace))) == 2
    captured = capsys.readouterr()
    err = [ln for ln in captured.err.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and f"{trace}: --trace: write failed (No space left on device)" in err[0]
    assert "generation stopped at that round" in err[0]
    assert "generated tokens" in captured.err  # the stats of what was done
    assert not trace.exists()


def run_cli(args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "laguna_dflash.runtime.cli", *args], cwd=REPO, text=True,
                          timeout=300, **kw)


def test_stdout_onto_dev_full_or_an_input_is_refused(pair, tmp_path):
    target, drafter, prompt = pair
    with open("/dev/full", "w") as full:
        r = run_cli(run_args(target, drafter, "-p", "x"), stdout=full, stderr=subprocess.PIPE)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: stdout (/dev/full): expected a terminal")
    before = digest(prompt)
    with open(prompt, "a") as same:  # laguna-run -f prompt.txt >> prompt.txt
        r = run_cli(run_args(target, drafter, "-f", str(prompt)), stdout=same, stderr=subprocess.PIPE)
    assert r.returncode == 2 and "is an input of this run" in r.stderr and digest(prompt) == before
    with open(os.devnull, "w") as null:
        assert run_cli(run_args(target, drafter, "-p", "x"), stdout=null, stderr=subprocess.PIPE).returncode == 0


def test_a_closed_pipe_mid_run_is_one_line_after_the_stats(pair):
    target, drafter, prompt = pair
    proc = subprocess.Popen([sys.executable, "-m", "laguna_dflash.runtime.cli",
                             *run_args(target, drafter, "-p", "import os", "-n", "3000", "-c", "4096")],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        proc.stdout.read(20)
        proc.stdout.close()  # `| head -c 20`
        err = proc.stderr.read()
        assert proc.wait(120) == 2
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = err.strip().splitlines()
    assert "Traceback" not in err and "generated tokens" in err
    assert lines[-1].startswith("error: stdout (pipe:") and "the reading end was closed" in lines[-1]


def test_a_prompt_file_far_over_the_context_is_refused_before_tokenizing(pair, tmp_path):
    target, drafter, _ = pair
    big = tmp_path / "big.txt"
    big.write_text("x = 1\n" * ((20 << 20) // 6))
    code = ("import resource, subprocess, sys; r = subprocess.run([sys.executable, '-m', "
            "'laguna_dflash.runtime.cli', *sys.argv[1:]], capture_output=True, text=True); "
            "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024); "
            "print(r.stderr, file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code, *run_args(target, drafter, "-f", str(big))], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    rc, peak_mb = map(int, r.stdout.split())
    assert rc == 2 and "-f: the prompt has" in r.stderr and "the context (-c/--ctx-size) holds 256" in r.stderr
    assert peak_mb < 600, f"peak RSS {peak_mb} MiB for a 20 MB prompt"


def test_a_chat_template_that_hangs_is_one_line_in_run(pair, tmp_path, monkeypatch):
    target, drafter, _ = pair
    hostile = tmp_path / "hostile.gguf"
    encoded = int(T.STRING).to_bytes(4, "little") + encode_value(T.STRING, SLOW_TEMPLATE)
    Source.of(target).write_record(hostile, "tokenizer.chat_template", encoded)
    r = run_cli(run_args(hostile, drafter, "-p", "hi", "--chat"), capture_output=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (f"error: {hostile}: tokenizer.chat_template: the template ran "
                                                 "longer than 2 s (refused)")
