"""The batched engine's library A/B and the shape-switch probe: a bad argument is one line and
exit 2 before any worker starts, and the summary divides medians and compares every worker's
outputs on both sides."""

from __future__ import annotations

import pytest

from scripts.bench import bench_batched_lib_ab
from scripts.investigate import shape_switch
from scripts.lab_tests.refusals import refusal


def test_bad_arguments_are_refused_in_one_line(capsys, tmp_path):
    assert "--a is required" in refusal(capsys, bench_batched_lib_ab.main)
    assert "--pairs: expected >= 1, found 0" in refusal(capsys, bench_batched_lib_ab.main, "--a", str(tmp_path),
                                                           "--pairs", "0")
    assert "--depths" in refusal(capsys, bench_batched_lib_ab.main, "--a", str(tmp_path), "--depths", "0,16")
    assert f"--a: no libllama.so in {tmp_path}" in refusal(capsys, bench_batched_lib_ab.main, "--a", str(tmp_path))
    assert "--repeats: expected >= 1, found 0" in refusal(capsys, shape_switch.main, "--repeats", "0")


def test_the_summary_divides_medians_and_compares_outputs():
    def worker(aggregate: float, sha: str) -> dict:
        return {"c1 d0": {"aggregate": aggregate, "outputs_sha": sha}}

    trials = {"A": [worker(100.0, "x"), worker(300.0, "x"), worker(200.0, "x")],
              "B": [worker(250.0, "x"), worker(210.0, "x"), worker(230.0, "x")]}
    row = bench_batched_lib_ab.summary(trials)["c1 d0"]
    assert row["A"]["median"] == 200.0 and row["B"]["median"] == 230.0
    assert row["A"]["min"] == 100.0 and row["B"]["max"] == 250.0
    assert row["B/A"] == pytest.approx(1.15)
    assert row["outputs_equal"]
    trials["B"][1] = worker(210.0, "y")
    assert not bench_batched_lib_ab.summary(trials)["c1 d0"]["outputs_equal"]
