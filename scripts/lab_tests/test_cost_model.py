"""The cost model's prediction against ik_llama.cpp's plain step: llama-bench's report read as
plain steps per file, our tokens per second over the peer's from round costs and acceptance, and
the peer's run in a repeat recorded under its target and routing."""

from __future__ import annotations

import stat
import sys
from types import SimpleNamespace

import pytest

from scripts.tuning import cost_model as cm


def test_peer_command_times_one_token_after_the_context_or_a_one_token_prompt():
    gp = cm.peer_command("llama-bench", ["a.gguf", "b.gguf"], 2, 3, 512, ["-rtr", "1"])
    assert gp == ["llama-bench", "-m", "a.gguf", "-m", "b.gguf", "-p", "0", "-n", "0", "-gp", "512,1",
                  "-t", "2", "-r", "3", "-o", "json", "-rtr", "1"]
    empty = cm.peer_command("llama-bench", ["a.gguf"], 1, 2, 0, [])
    assert empty[3:7] == ["-p", "1", "-n", "0"] and "-gp" not in empty


def test_peer_step_samples_are_seconds_per_file_and_refuse_a_longer_test():
    report = [{"model_filename": "a.gguf", "n_prompt": 512, "n_gen": 1, "samples_ns": [30_000_000, 32_000_000]},
              {"model_filename": "b.gguf", "n_prompt": 1, "n_gen": 0, "samples_ns": [10_000_000]},
              {"model_filename": "a.gguf", "n_prompt": 512, "n_gen": 1, "samples_ns": [31_000_000]}]
    assert cm.peer_step_samples(report) == {"a.gguf": [0.030, 0.032, 0.031], "b.gguf": [0.010]}
    with pytest.raises(ValueError, match="b.gguf: a test of 4 tokens"):
        cm.peer_step_samples([{"model_filename": "b.gguf", "n_prompt": 4, "n_gen": 0, "samples_ns": [1]}])


def test_versus_peer_is_tokens_per_round_over_the_round_in_peer_steps():
    # 3 tokens a round of 2 of our steps, each 1.25 of the peer's: 3 / 2.5 peer steps
    assert cm.versus_peer(3.0, 2.0, 1.25) == pytest.approx(1.2)
    assert cm.versus_peer(1.0, 1.0, 0.8) == pytest.approx(1.25)


def synthetic_samples() -> dict[str, list[float]]:
    """Passes whose cost is proportional to the rows (verify k = k + 1 decode steps), free drafts
    and injections, no engine rounds: ours 0.02 / 0.05 s at 2 / 5 layers (40 layers: 0.40 s),
    the peer 0.016 / 0.04 (0.32 s)."""
    s: dict[str, list[float]] = {}
    for routing in cm.ROUTINGS:
        for rows in cm.ROWS:
            s[f"target:{routing}:2:{rows}"] = [0.02 * rows] * 3
            s[f"target:{routing}:5:{rows}"] = [0.05 * rows] * 3
        for k in cm.MEASURED_DEPTHS:
            s[f"ratio:verify:{routing}:{k}"] = [k + 1.0] * 3
        s[f"peer:{routing}:2"] = [0.016] * 3
        s[f"peer:{routing}:5"] = [0.04] * 3
        s[f"ratio:decode_over_peer:{routing}"] = [1.0, 1.25, 1.25, 1.5]
        s[f"decode40:{routing}"] = [0.40] * 3
    for k in cm.MEASURED_DEPTHS:
        s[f"draft:{k}"] = [0.0] * 3
    for a in cm.INJECT_ACCEPTED:
        s[f"inject:{a}"] = [0.0] * 3
    return s


def test_the_prediction_against_the_peer_from_costs_and_acceptance():
    a = cm.analyse(synthetic_samples())
    peer = a["routing"]["random"]["peer"]
    assert peer["decode40_ms"] == pytest.approx(320.0)
    assert peer["decode_over_peer"] == pytest.approx(1.25)
    assert peer["tokens_per_s"] == pytest.approx(1 / 0.32) and peer["ours_plain_tokens_per_s"] == pytest.approx(2.5)
    code = a["acceptance_models"]["code (mlxcel fit)"]["a"]
    x = peer["predictions"]["code (mlxcel fit)"]
    assert x[0]["x_peer"] == pytest.approx(0.8)  # plain: 1 token a step of 1.25 peer steps
    for k in (1, 3, 8):
        e = cm.expected_tokens(code, k)
        assert x[k]["x_peer"] == pytest.approx(e / ((k + 1) * 1.25))
        assert x[k]["tokens_per_s"] == pytest.approx(e / ((k + 1) * 0.40))
        # the ratio of plain steps, 1.1875-1.3125 over the repeats (IQR), carried through
        assert x[k]["x_peer_iqr"] == pytest.approx([e / ((k + 1) * 1.3125), e / ((k + 1) * 1.1875)])
    assert a["routing"]["random"]["predictions"]["code (mlxcel fit)"][3]["speedup_iqr"] == pytest.approx(
        [cm.expected_tokens(code, 3) / 4] * 2)


def test_without_a_peer_run_the_analysis_has_no_peer_part():
    s = {k: v for k, v in synthetic_samples().items() if not k.startswith(("peer:", "ratio:decode_over_peer"))}
    assert "peer" not in cm.analyse(s)["routing"]["shared"]


def test_a_repeats_peer_run_is_recorded_under_its_target_and_routing(tmp_path):
    bench = tmp_path / "llama-bench"
    # answers like llama-bench -o json: a step of 16 ms on each 2-layer file, 40 ms on each 5-layer one
    bench.write_text(f"#!{sys.executable}\nimport json, sys\na = sys.argv[1:]\n"
                     "files = [a[i + 1] for i, x in enumerate(a) if x == '-m']\n"
                     "print(json.dumps([{'model_filename': f, 'n_prompt': 64, 'n_gen': 1, 'build_commit': 'c0ffee',"
                     " 'samples_ns': [16_000_000 if 'L2' in f else 40_000_000] * int(a[a.index('-r') + 1])}"
                     " for f in files]))\n")
    bench.chmod(bench.stat().st_mode | stat.S_IXUSR)
    targets = {(r, n): tmp_path / f"{r}-L{n}.gguf" for r in cm.ROUTINGS for n in cm.VARIANTS}
    args = SimpleNamespace(context=64, threads=1, ik_bench=bench, ik_reps=2, ik_args="-rtr 1")
    b = cm.Bench(cm.Artifacts(targets, tmp_path / "drafter.gguf"), args)
    b.record = True
    assert b.time_peer("shared") == pytest.approx(0.32)
    assert b.samples == {"peer:shared:2": [0.016, 0.016], "peer:shared:5": [0.04, 0.04]}
    assert b.peer_build == "c0ffee"


def test_a_missing_peer_binary_is_one_line_before_anything_loads(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_cost_model", "--ik-bench", str(tmp_path / "nope"),
                                      "--cache", str(tmp_path)])
    with pytest.raises(SystemExit) as e:
        cm.main()
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--ik-bench" in err and "llama-bench" in err
    assert not any(tmp_path.iterdir())
