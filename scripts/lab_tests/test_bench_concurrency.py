"""The concurrency benchmark on a target of the user's choosing: without a drafter it decodes
plainly and refuses any other depth in one line before a model loads; a run judges the plain line
(4 streams, depth 0, over one at a time on today's engine) and records the load average."""

from __future__ import annotations

import json

import pytest

from laguna_dflash.runtime import assets
from scripts.bench import bench_concurrency
from scripts.lab_tests import refusals


def refusal(capsys, *argv: str) -> str:
    return refusals.refusal(capsys, bench_concurrency.main, *argv)


def test_a_target_without_a_drafter_refuses_a_draft_depth_before_loading(capsys, tmp_path):
    not_a_gguf = tmp_path / "target.gguf"
    not_a_gguf.write_bytes(b"not a model")  # were it loaded, the error would be another one
    line = refusal(capsys, "--target", str(not_a_gguf), "--depths", "0,4,auto")
    assert "--depths" in line and "4,auto" in line and "--drafter" in line
    line = refusal(capsys, "--target", str(not_a_gguf), "--depths", "0", "--separate-depths", "2")
    assert "2 needs a drafter" in line


def test_a_drafter_needs_a_target_and_both_must_exist(capsys, tmp_path):
    some = tmp_path / "d.gguf"
    some.write_bytes(b"x")
    assert "--drafter: needs --target" in refusal(capsys, "--drafter", str(some))
    missing = tmp_path / "absent.gguf"
    assert f"--target: no file at {missing}" in refusal(capsys, "--target", str(missing), "--depths", "0")


def test_a_plain_run_judges_the_plain_line_and_records_the_load(tmp_path):
    out = tmp_path / "r.json"
    assert bench_concurrency.main(["--target", str(assets.TINY_TARGET), "--depths", "0", "--streams", "1,4",
                                   "--separate-streams", "1", "--requests", "4", "--n-predict", "4",
                                   "--prompt-tokens", "8", "--repeats", "2", "--threads", "1",
                                   "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert sorted(result["cells"]) == ["batched c1 d0", "batched c4 d0", "separate c1 d0"]
    assert result["drafter"] is None and result["target"] == assets.TINY_TARGET.name
    verdict = result["acceptance"]
    assert (verdict["streams"], verdict["depth"], verdict["bar"]) == (4, 0, 2.0)
    assert len(verdict["per_repetition_ratios"]) == 2 and verdict["outputs_equal_alone"]
    assert result["outputs"]["batched c4 d0"] == {"equal_to_batched_alone": "4/4", "equal_to_separate_alone": "4/4"}
    load = result["load_average"]
    assert len(load["before"]) == 3 and len(load["after_each_repetition"]) == 2


def test_rotate_starts_each_repetition_one_cell_further_and_auto_is_also_paired_within_repetitions(tmp_path):
    out = tmp_path / "r.json"
    assert bench_concurrency.main(["--depths", "0,2,auto", "--streams", "1", "--requests", "2", "--n-predict", "4",
                                   "--prompt-tokens", "8", "--repeats", "4", "--threads", "1", "--rotate",
                                   "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    first = ["batched c1 d0", "separate c1 d0", "batched c1 d2", "separate c1 d2", "batched c1 dauto", "separate c1 dauto"]
    orders = result["cell_order_per_repetition"]
    assert orders[0] == first and orders[1] == first[1:] + first[:1] and orders[3] == first[3:] + first[:3]
    auto = result["auto_vs_best_fixed"]["1"]
    best = result["aggregate_per_repetition"][f"batched c1 d{auto['best_fixed']}"]
    within = [a / b for a, b in zip(result["aggregate_per_repetition"]["batched c1 dauto"], best)]
    assert auto["per_repetition_ratios"] == within
    assert auto["median_of_per_repetition_ratios"] == pytest.approx((sorted(within)[1] + sorted(within)[2]) / 2)


def test_without_rotate_every_repetition_runs_the_cells_in_one_order():
    cells = [("batched", 1, 0), ("batched", 4, 0), ("separate", 1, 0)]
    assert [bench_concurrency.repetition_order(cells, r, False) for r in range(3)] == [cells] * 3
    assert bench_concurrency.repetition_order(cells, 4, True) == cells[1:] + cells[:1]
