"""laguna-run and laguna-run bench: a user's mistake is one line and exit code 2, found before any
model loads; Ctrl-C keeps what was done (exit 130); -n 0 generates nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from laguna_dflash.runtime.cli import main
from laguna_dflash.runtime.sampling import SamplingError, SamplingParams
from test_engine import make_drafter

REPO = Path(__file__).resolve().parent.parent
#: a model path that does not exist: an error about a flag proves the flag was checked first
NO_MODEL = ["-m", "/nonexistent/target.gguf"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_target):
    d = make_drafter(tmp_path_factory.mktemp("cli-errors"), "d", tiny_target["gguf"])
    return str(tiny_target["gguf"]), str(d)


def error_lines(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


def one_error_line(capsys) -> str:
    err = error_lines(capsys)
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


# ------------------------------------------------------------------ usage errors (click's)


@pytest.mark.parametrize("args,needle", [
    (["--no-such-flag"], "--no-such-flag"),
    (["-n", "many"], "'-n'"),
    (["--temp", "warm"], "'--temp'"),
    (["-p", "x", "-n"], "'-n' requires an argument"),
    (["stray"], "stray"),
    (["bench", "--repeats", "x"], "'--repeats'"),
    (["bench", "--repeats"], "'--repeats' requires an argument"),
    (["bench", "--bogus"], "--bogus"),
])
def test_usage_errors_print_usage_and_one_error_line(capsys, args, needle):
    assert main(args) == 2
    err = error_lines(capsys)
    prog = "laguna-run bench" if args[0] == "bench" else "laguna-run"
    assert len(err) == 2, err
    assert err[0].startswith(f"Usage: {prog} [OPTIONS]") and err[1].startswith("error: ") and needle in err[1]


def test_the_installed_entry_point_prints_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "laguna_dflash.runtime.cli", "bench", "--n-predict", "lots"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "error: Invalid value for '-n' / '--n-predict'" in proc.stderr


# ------------------------------------------------------------------ values, checked up front


@pytest.mark.parametrize("args,needle", [
    (["--temp", "-0.5"], "--temp: expected a finite number >= 0"),
    (["--temp", "nan"], "--temp: expected a finite number >= 0"),
    (["--temp", "inf"], "--temp: expected a finite number >= 0"),
    (["--top-k", "-1"], "--top-k: expected an integer >= 0"),
    (["--top-p", "0"], "--top-p: expected a number in (0, 1]"),
    (["--top-p", "1.5"], "--top-p: expected a number in (0, 1]"),
    (["--min-p", "1.5"], "--min-p: expected a number in [0, 1]"),
    (["--min-p", "-0.1"], "--min-p: expected a number in [0, 1]"),
    (["--repeat-penalty", "0"], "--repeat-penalty: expected a finite number > 0"),
    (["--repeat-penalty", "inf"], "--repeat-penalty: expected a finite number > 0"),
    (["--seed", "-2"], "--seed: expected an integer >= 0 or -1"),
    (["-n", "-1"], "-n/--n-predict: expected an integer >= 0"),
    (["-c", "0"], "-c/--ctx-size: expected an integer >= 1"),
    (["-b", "0"], "-b/--batch-size: expected an integer >= 1"),
    (["-ub", "-1"], "-ub/--ubatch-size: expected an integer >= 0"),
    (["-t", "-1"], "-t/--threads: expected 0..512"),
    (["-t", "100000"], "-t/--threads: expected 0..512"),
    (["--stop", ""], "--stop: expected a non-empty string"),
    (["--n-max", "-1"], "--n-max: expected an integer >= 0 or 'auto'"),
    (["--bundled", "nope"], "--bundled: expected one of code, agent, found 'nope'"),
])
def test_run_values_are_refused_with_the_flag_before_loading(capsys, args, needle):
    assert main([*NO_MODEL, "-p", "x", *args]) == 2
    assert needle in one_error_line(capsys)


@pytest.mark.parametrize("args,needle", [
    (["--repeats", "0"], "--repeats: expected an integer >= 1"),
    (["-n", "0"], "-n/--n-predict: expected an integer >= 1"),
    (["-b", "-3"], "-b/--batch-size"),
    (["--n-max", "1,x"], "--n-max"),
])
def test_bench_values_are_refused_with_the_flag_before_loading(capsys, args, needle):
    assert main(["bench", *NO_MODEL, "-md", "/nonexistent/d.gguf", *args]) == 2
    assert needle in one_error_line(capsys)


def test_sampling_rules_live_in_sampling_params():
    """The server reuses them: the field, the expected range and the value travel with the error."""
    with pytest.raises(SamplingError) as e:
        SamplingParams(min_p=1.5)
    assert (e.value.field, e.value.found) == ("min_p", 1.5)
    with pytest.raises(SamplingError, match="top_k"):
        SamplingParams(top_k=2.5)
    with pytest.raises(SamplingError, match="temperature"):
        SamplingParams(temperature=True)
    SamplingParams(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.1, seed=0)


def test_run_trace_path_is_checked_first(tmp_path, capsys):
    args = [*NO_MODEL, "-p", "x", "--trace"]
    assert main([*args, str(tmp_path / "missing" / "out.jsonl")]) == 2
    assert "--trace: expected an existing directory" in one_error_line(capsys)
    assert main([*args, str(tmp_path)]) == 2
    assert "--trace: expected a file path, found a directory" in one_error_line(capsys)
    # a path that can be written is left as it was: the run fails later, on the model
    ok = tmp_path / "rounds.jsonl"
    assert main([*args, str(ok)]) == 2
    assert "nonexistent" in one_error_line(capsys) and not ok.exists()


@pytest.mark.parametrize("flag", ["--json", "--png"])
def test_bench_output_paths_are_checked_first(tmp_path, capsys, flag):
    base = ["bench", *NO_MODEL, "-md", "/nonexistent/d.gguf"]
    assert main([*base, flag, str(tmp_path / "missing" / "out")]) == 2
    assert f"{flag}: expected an existing directory" in one_error_line(capsys)
    assert main([*base, flag, str(tmp_path)]) == 2
    assert f"{flag}: expected a file path, found a directory" in one_error_line(capsys)


@pytest.mark.parametrize("args,rows", [
    (["--n-max", "4", "-b", "4"], 5),
    (["--n-max", "auto", "-b", "8"], 16),
])
def test_batch_smaller_than_the_deepest_verify_is_refused_up_front(pair, capsys, args, rows):
    """Refused from the pair's headers (runtime/open_pair.py), before any model loads."""
    target, drafter = pair
    assert main(["-m", target, "-md", drafter, "-p", "x", "-n", "4", *args]) == 2
    assert f"-b/--batch-size: expected >= {rows}" in one_error_line(capsys)
    assert main(["bench", "-m", target, "-md", drafter, "-n", "4", *args]) == 2
    assert f"-b/--batch-size: expected >= {rows}" in one_error_line(capsys)


def test_depth_beyond_the_drafters_block_is_refused_up_front(pair, capsys):
    target, drafter = pair
    assert main(["bench", "-m", target, "-md", drafter, "--n-max", "2,16"]) == 2
    assert "--n-max: expected 0..15 (the drafter's block_size - 1)" in one_error_line(capsys)


def test_a_batch_that_holds_the_deepest_verify_runs(pair, capsys):
    target, drafter = pair
    assert main(["-m", target, "-md", drafter, "-p", "import os", "-n", "12", "--n-max", "4", "-b", "5",
                 "-ub", "2", "-t", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["n_generated"] == 12


def test_prompt_files_must_be_utf8(tmp_path, capsys):
    bad = tmp_path / "prompt.txt"
    bad.write_bytes("def f():\n    return 'é'\n".encode("latin-1"))
    assert main([*NO_MODEL, "-f", str(bad)]) == 2
    line = one_error_line(capsys)
    assert str(bad) in line and "expected UTF-8 text, found byte 0xe9 at byte offset 21" in line
    assert main(["bench", *NO_MODEL, "-md", "/nonexistent/d.gguf", "--prompts", str(bad)]) == 2
    assert "byte offset 21" in one_error_line(capsys)


def test_a_utf8_prompt_file_with_a_byte_order_mark_reads_as_its_text(tmp_path):
    from laguna_dflash.runtime.assets import read_prompt_text

    f = tmp_path / "p.txt"
    f.write_bytes(b"\xef\xbb\xbfimport os\n\xe2\x82\xac")
    assert read_prompt_text(f) == "import os\n€"


# ------------------------------------------------------------------ -n 0


def test_n_predict_0_generates_nothing(pair, capsys):
    target, drafter = pair
    assert main(["-m", target, "-md", drafter, "-p", "import os", "-n", "0", "-t", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == [] and out["text"] == "" and out["stop_reason"] == "length"
    assert out["stats"]["n_generated"] == 0 and out["stats"]["n_prompt"] > 0
    assert main(["-m", target, "-md", drafter, "-p", "import os", "-n", "0", "-t", "2"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "import os\n" and "generated tokens" in captured.err


# ------------------------------------------------------------------ Ctrl-C


def _lines_in(path) -> int:
    try:
        return path.read_text().count("\n")
    except FileNotFoundError:  # renamed over its final name between the glob and the read
        return 0


@pytest.mark.parametrize("json_out", [False, True], ids=["table", "json"])
def test_ctrl_c_reports_what_was_done_and_exits_130(pair, tmp_path, json_out):
    target, drafter = pair
    trace = tmp_path / "rounds.jsonl"
    n_predict = 3000  # the random drafter is never accepted: minutes of rounds, never finished here
    cmd = [sys.executable, "-m", "laguna_dflash.runtime.cli", "-m", target, "-md", drafter, "-p", "import os",
           "-n", str(n_predict), "--n-max", "3", "-t", "2", "--trace", str(trace)] + (["--json"] if json_out else [])
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        # followed live in its partial file (NAME.partial-PID), renamed over rounds.jsonl when the run
        # ends; the writability probe NAME.partial-probe-PID comes and goes before it, so it is not read
        while not any(_lines_in(f) >= 1 for f in tmp_path.glob("rounds.jsonl.partial-[0-9]*")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no round traced in 180 s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted (Ctrl-C)" in err
    assert not list(tmp_path.glob("*.partial-*"))
    rounds = [json.loads(line) for line in trace.read_text().splitlines()]  # whole lines only
    assert rounds and rounds[-1]["round"] == len(rounds)
    if json_out:
        result = json.loads(out)
        assert result["stop_reason"] == "interrupted"
        assert result["stats"]["rounds"] == len(rounds)
        assert 0 < result["stats"]["n_generated"] == len(result["tokens"]) < n_predict
    else:
        assert out.startswith("import os")
        assert "generated tokens" in err and "rounds" in err


def test_an_interrupted_bench_keeps_the_prompts_every_depth_completed(pair):
    from laguna_dflash.runtime.bench import run_bench
    from laguna_dflash.runtime.engine import Engine, EngineConfig

    target, drafter = pair
    with Engine.load(target, drafter, EngineConfig(n_ctx=512, n_threads=2)) as engine:
        calls = 0
        generate = engine.generate

        def counted(*args, **kwargs):
            nonlocal calls
            calls += 1
            return generate(*args, **kwargs)

        engine.generate = counted
        # warm-up (2 generations), prompt a (2), then Ctrl-C during prompt b's speculative run
        result = run_bench(engine, {"p": ["import os", "def f(x):", "class A:"]}, [2], n_predict=6,
                           should_stop=lambda: calls >= 6)
    assert calls == 6
    assert result["interrupted"] and result["prompts_measured"] == {"p": 1}
    plain, spec = result["rows"]
    assert plain["tokens"] == spec["tokens"] == 6
