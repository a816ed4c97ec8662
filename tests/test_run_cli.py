"""laguna-run's command line: JSON output, per-round trace, placement rules, user errors."""

from __future__ import annotations

import json

import pytest

from laguna_dflash.convert.errors import UserError
from laguna_dflash.runtime.cli import main
from laguna_dflash.runtime.placement import ALL_LAYERS, resolve
from test_engine import make_drafter


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_target):
    d = make_drafter(tmp_path_factory.mktemp("cli"), "d", tiny_target["gguf"])
    return str(tiny_target["gguf"]), str(d)


def test_json_and_trace(pair, tmp_path, capsys):
    target, drafter = pair
    trace = tmp_path / "rounds.jsonl"
    code = main(["-m", target, "-md", drafter, "-p", "import os", "-n", "20", "--n-max", "3",
                 "--json", "--trace", str(trace)])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["stop_reason"] in ("length", "eog") and len(out["tokens"]) <= 20
    stats = out["stats"]
    assert stats["rounds"] >= 1 and stats["drafted"] >= stats["accepted"] >= 0
    rounds = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(rounds) == stats["rounds"]
    assert all({"pos", "bonus", "drafted", "accepted"} <= r.keys() for r in rounds)
    assert sum(r["accepted"] for r in rounds) == stats["accepted"]
    # each round's tokens are its accepted drafts plus one of the target's own
    assert sum(r["accepted"] + 1 for r in rounds) + 1 >= len(out["tokens"])


def test_auto_depth_decisions_reach_the_trace(pair, tmp_path, capsys):
    target, drafter = pair
    trace = tmp_path / "auto.jsonl"
    assert main(["-m", target, "-md", drafter, "-p", "x = 1", "-n", "24", "--n-max", "auto",
                 "--json", "--trace", str(trace)]) == 0
    stats = json.loads(capsys.readouterr().out)["stats"]
    assert stats["policy"]["policy"] == "auto"
    whys = {json.loads(line).get("why") for line in trace.read_text().splitlines()}
    assert "probe" in whys


@pytest.mark.parametrize("args,needle", [
    (["-p", "x", "--n-max", "16"], "--n-max: expected 0..15"),
    (["-p", "x", "--n-max", "two"], "--n-max"),
    (["-p", "x", "-f", "y"], "exactly one"),
    (["-p", "x", "--device", "tpu"], "--device"),
    (["-p", "x", "--cache-type", "q4_0"], "--cache-type"),
])
def test_user_mistakes_exit_2_with_one_line(pair, capsys, args, needle):
    target, drafter = pair
    assert main(["-m", target, "-md", drafter, "-n", "4", *args]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error:") and needle in err[0]


def test_placement_rules():
    assert resolve("auto", has_gpu=False).target_device == "cpu"
    p = resolve("auto", has_gpu=True)
    assert (p.target_device, p.draft_device, p.n_gpu_layers, p.n_gpu_layers_draft) == ("cuda", "cuda", ALL_LAYERS, ALL_LAYERS)
    with pytest.raises(UserError, match="drafter must sit where the target"):
        resolve("cuda", "cpu", has_gpu=True)
    forced = resolve("cuda", "cpu", force=True, has_gpu=True)
    assert (forced.draft_device, forced.n_gpu_layers_draft) == ("cpu", 0)
    with pytest.raises(UserError, match="no usable GPU"):
        resolve("cuda", has_gpu=False)
    with pytest.raises(UserError, match="-ngl"):
        resolve("cpu", n_gpu_layers=4, has_gpu=True)
    assert resolve("cpu", "auto", has_gpu=True).draft_device == "cpu"
