"""The pass-by-pass library A/B: a bad argument is one line and exit 2 before a worker starts, the
summary takes the median over pairs of each pair's median ratio and compares every pass's
logits, and a short run of one library against itself reports the same logits on both sides."""

from __future__ import annotations

import json

import pytest

from scripts.bench import bench_pass_ab
from scripts.bench.bench_lib_ab import installed_lib_dir
from scripts.lab_tests import refusals


def refusal(capsys, *argv: str) -> str:
    return refusals.refusal(capsys, bench_pass_ab.main, *argv)


def test_bad_arguments_are_refused_in_one_line(capsys, tmp_path):
    assert "--a is required" in refusal(capsys)
    assert "--pairs: expected >= 1, found 0" in refusal(capsys, "--a", str(tmp_path), "--pairs", "0")
    assert "--burst: expected >= 1, found 0" in refusal(capsys, "--a", str(tmp_path), "--burst", "0")
    assert "--rows" in refusal(capsys, "--a", str(tmp_path), "--rows", "0,2")
    assert "--rows" in refusal(capsys, "--a", str(tmp_path), "--rows", "1:65")
    assert "--rows" in refusal(capsys, "--a", str(tmp_path), "--rows", "1:")
    assert f"--target: {tmp_path / 'x.gguf'}: no such file" in refusal(capsys, "--a", str(tmp_path), "--target",
                                                                        str(tmp_path / "x.gguf"))
    (tmp_path / "bad.gguf").write_bytes(b"not a model")
    assert "not a GGUF file" in refusal(capsys, "--a", str(tmp_path), "--target", str(tmp_path / "bad.gguf"))
    assert f"--a: no libllama.so in {tmp_path}" in refusal(capsys, "--a", str(tmp_path))


def test_row_specs_are_row_counts_and_cycles_of_them():
    assert bench_pass_ab.row_specs("1,5,1:5") == ((1,), (5,), (1, 5))
    assert [bench_pass_ab.spec_name(s) for s in bench_pass_ab.row_specs("20,2:1:3")] == ["20", "2:1:3"]


def turn(a_ms: float, b_ms: float, sha: str = "x") -> dict:
    return {"A": {"ms": a_ms, "logits_sha": sha}, "B": {"ms": b_ms, "logits_sha": sha}}


def test_the_summary_is_the_median_over_pairs_of_each_pairs_median_ratio():
    pairs = [{"2": [turn(1.0, 0.9), turn(2.0, 1.0), turn(1.0, 1.2)]},   # ratios 0.9, 0.5, 1.2: median 0.9
             {"2": [turn(1.0, 1.1), turn(1.0, 1.0), turn(1.0, 0.7)]},   # 1.1, 1.0, 0.7: 1.0
             {"2": [turn(4.0, 3.0), turn(4.0, 3.2), turn(4.0, 3.6)]}]   # 0.75, 0.8, 0.9: 0.8
    row = bench_pass_ab.summary(pairs)["2"]
    assert row["B/A per pair"] == pytest.approx([0.9, 1.0, 0.8])
    assert row["B/A"] == pytest.approx(0.9)
    assert (row["B/A min"], row["B/A max"]) == pytest.approx((0.8, 1.0))
    assert row["A_ms"] == 1.0 and row["B_ms"] == 1.1  # each side over every turn of every pair
    assert row["logits_equal"]
    pairs[1]["2"][2] = {"A": {"ms": 1.0, "logits_sha": "x"}, "B": {"ms": 0.7, "logits_sha": "y"}}
    assert not bench_pass_ab.summary(pairs)["2"]["logits_equal"]
    # passes of one burst that disagreed, the same on every turn and side, are not equal logits
    pairs = [{"2": [turn(1.0, 1.0, "x,y"), turn(1.0, 1.0, "x,y")]}]
    assert not bench_pass_ab.summary(pairs)["2"]["logits_equal"]


def test_couples_of_pairs_take_one_of_each_start_order():
    # even pairs (A started first) 0.9, odd pairs 1.0: over five pairs the median is one
    # cluster's; each couple's geometric mean is sqrt(0.9) whatever the count
    pairs = [{"2": [turn(1.0, r)]} for r in (0.9, 1.0, 0.9, 1.0, 0.9)]
    row = bench_pass_ab.summary(pairs)["2"]
    assert row["B/A"] == pytest.approx(0.9)  # five pairs: three of one cluster
    assert row["B/A by couples"] == pytest.approx(0.9 ** 0.5)  # the fifth pair has no partner
    assert (row["B/A couples min"], row["B/A couples max"]) == pytest.approx((0.9 ** 0.5, 0.9 ** 0.5))
    pairs = [{"2": [turn(1.0, r)]} for r in (0.8, 1.0, 0.9, 0.9, 1.0, 1.1)]
    row = bench_pass_ab.summary(pairs)["2"]
    assert [row["B/A couples min"], row["B/A by couples"], row["B/A couples max"]] == pytest.approx(
        [0.8 ** 0.5, 0.9, (1.0 * 1.1) ** 0.5])
    assert bench_pass_ab.summary(pairs[:1])["2"]["B/A by couples"] is None


def test_one_library_against_itself_has_the_same_logits(tmp_path):
    lib = installed_lib_dir()
    if not (lib / "libllama.so").is_file():
        pytest.skip("no libllama.so in the installed llama_cpp")
    out = tmp_path / "ab.json"
    assert bench_pass_ab.main(["--a", str(lib), "--b", str(lib), "--rows", "1,1:3", "--pairs", "2", "--turns", "2",
                               "--warmup", "0", "--burst", "2", "--threads", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["summary"]) == {"1", "1:3"}
    assert all(row["logits_equal"] and len(row["B/A per pair"]) == 2 for row in result["summary"].values())
    assert len(result["turns_ms"]) == 2 and len(result["turns_ms"][0]["1:3"]) == 2
    assert result["cpu"]["cores"] >= 1
