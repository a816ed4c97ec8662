"""op_waits' reading of the instrumented library's trace: the busiest graph, per-kind sums, coverage."""

from __future__ import annotations

import pytest

from scripts.investigate import op_waits

from .refusals import refusal

HEADER = "graph\tn_nodes\tgraphs\tnode\top\ttype\tne1\tname\tcomp0\tcomp1\twait0\twait1"


def trace(tmp_path, rows: list[str], tsc_hz: float = 1e9):
    path = tmp_path / "trace.tsv"
    path.write_text(f"# tsc_hz\t{tsc_hz:.0f}\n{HEADER}\n" + "\n".join(rows) + "\n")
    return path


def test_the_busiest_graph_is_summarised_per_kind(tmp_path):
    # graph 0 ran once (a prompt), graph 1 ten times (the decode step): 1e9 cycles a second
    path = trace(tmp_path, [
        "0\t3\t1\t0\tMUL_MAT\tq4_K\t96\tffn_up-0\t999000000\t999000000\t0\t0",
        "1\t3\t10\t0\tMUL_MAT\tq6_K\t1\tresult_output\t40000000\t30000000\t0\t10000000",
        "1\t3\t10\t1\tMUL_MAT\tq4_K\t1\tffn_up-0\t20000000\t20000000\t1000000\t1000000",
        "1\t3\t10\t2\tADD\tf32\t1\tffn_out-0\t5000000\t0\t0\t5000000",
    ])
    tsc_hz, rows = op_waits.read_trace(path)
    assert tsc_hz == 1e9 and {r["graph"] for r in rows} == {"1"}
    result = op_waits.summarise(tsc_hz, rows, threads=2)
    kinds = result["kinds"]
    assert result["graphs"] == 10 and list(kinds) == ["MUL_MAT q6_K", "MUL_MAT q4_K", "ADD"]  # by span
    head = kinds["MUL_MAT q6_K"]
    assert head["compute_0"] == pytest.approx(4.0) and head["compute_1"] == pytest.approx(3.0)
    assert head["uneven"] == pytest.approx(1.0) and head["span"] == pytest.approx(4.0)
    # the last node (ADD) meets the closing barrier, untimed: the quicker thread waits for the other
    assert kinds["ADD"]["uneven"] == pytest.approx(0.5) and kinds["ADD"]["wait_1"] == pytest.approx(0.5)
    assert kinds["ADD"]["wait_0"] == 0 and kinds["ADD"]["span"] == pytest.approx(0.5)
    assert [n["name"] for n in result["longest_nodes"]] == ["result_output", "ffn_up-0", "ffn_out-0"]


def test_the_last_nodes_wait_is_the_slower_threads_compute(tmp_path):
    # the head is last: thread 0 done in 4 ms, thread 1 in 6; the timed loop saw no wait after it
    path = trace(tmp_path, ["0\t1\t2\t0\tMUL_MAT\tq6_K\t1\tresult_output\t8000000\t12000000\t0\t0"])
    tsc_hz, rows = op_waits.read_trace(path)
    head = op_waits.summarise(tsc_hz, rows, threads=2)["kinds"]["MUL_MAT q6_K"]
    assert head["wait_0"] == pytest.approx(2.0) and head["wait_1"] == 0
    assert head["span"] == pytest.approx(6.0)


def test_coverage_is_one_threads_compute_over_the_span():
    one = {"kinds": {"MUL_MAT q6_K": {"compute_0": 7.0, "span": 7.0}, "ADD": {"compute_0": 0.1, "span": 0.1}}}
    two = {"kinds": {"MUL_MAT q6_K": {"span": 4.0}, "ADD": {"span": 0.2}, "GET_ROWS": {"span": 0.1}}}
    assert op_waits.coverage(one, two) == {"MUL_MAT q6_K": 1.75, "ADD": 0.5}


def test_a_missing_model_is_one_line_and_exit_2(capsys, tmp_path):
    line = refusal(capsys, op_waits.main, "-m", str(tmp_path / "none.gguf"))
    assert "expected a GGUF file" in line


def test_more_than_two_threads_is_refused_in_one_line(capsys, tmp_path):
    line = refusal(capsys, op_waits.main, "-m", str(tmp_path / "none.gguf"), "--threads", "1,4")
    assert "integers in 1..2" in line
