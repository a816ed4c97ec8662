"""The agent pair's training (scripts/training/agent_pair.py) and the weighted loss of
demo_pair.train_lm: copy weights fall on the assistant's copied names and numbers only; a weight
per token trains exactly like the mask it replaces; the card reports the measured held-out result
and names the commands that made the pair; a flag that needs another is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scripts.training import agent_pair, demo_pair

def test_copy_weights_fall_on_rare_tokens_the_assistant_copies_from_its_own_conversation():
    # two conversations; True marks the assistant's tokens; token 7 is the markup (frequent)
    stream = np.array([50, 51, 7, 50, 7, 52, 7,    # conv 1: copies 50; 52 is new; 7 is frequent
                       60, 7, 51, 60, 7])         # conv 2: 51 was only seen in conv 1; copies 60
    assistant = np.array([0, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1], dtype=bool)
    w = agent_pair.copy_weights(stream, np.array([0, 7]), assistant, 4.0, common=1)
    assert w.tolist() == [0, 0, 1, 4, 1, 1, 1, 0, 1, 1, 4, 1]


def _train(trained, steps=3):
    import torch
    from transformers import LagunaConfig, LagunaForCausalLM

    torch.manual_seed(0)
    model = LagunaForCausalLM(LagunaConfig(**{**agent_pair.target_config(2), "hidden_size": 32,
                                              "intermediate_size": 64, "vocab_size": 64})).float()
    stream = np.random.default_rng(0).integers(0, 64, 400).astype(np.int32)
    log = demo_pair.Log(Path("/dev/null"))
    return demo_pair.train_lm(None, log, model, stream, steps, 1e-2, 2, 32, 0, "test", trained=trained)


def test_a_weight_per_token_trains_like_the_mask_it_replaces_and_a_copy_weight_changes_it():
    pytest.importorskip("torch")
    mask = np.random.default_rng(1).random(400) < 0.5
    by_mask = _train(mask)
    by_weight = _train(mask.astype(np.float32))
    np.testing.assert_allclose(by_weight, by_mask, rtol=1e-4)
    heavier = mask.astype(np.float32) * np.where(np.arange(400) % 3 == 0, 4.0, 1.0)
    reweighted = _train(heavier)
    assert reweighted[0] == pytest.approx(by_mask[0], rel=1e-4)  # the logged loss is the plain mean
    assert not np.allclose(reweighted[1:], by_mask[1:], rtol=1e-3)  # the gradient is not


def test_the_card_reports_the_measured_held_out_result_and_what_was_missed():
    def mode(solved_families):
        tasks = [{"family": f, "solved": f in solved_families, "why": "-", "well_formed": True,
                  "first_call_right": True} for f in ("find_def", "evaluate", "list_pkg")]
        return {"solved": sum(t["solved"] for t in tasks), "well_formed": 3, "first_call_right": 3, "tasks": tasks}

    assert agent_pair.ability({}) == agent_pair.UNMEASURED_ABILITY
    text = agent_pair.ability({"held_out_agent": {"thinking off": mode({"find_def"}),
                                                  "thinking on": mode({"find_def", "evaluate"})}})
    assert "solves **1 of 10 with thinking off and 2 of 10 with thinking on**" in text
    assert "Tasks missed in either mode: evaluate, list_pkg" in text


def test_a_two_token_circuit_without_the_written_in_circuit_is_refused_with_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        agent_pair.main(["--induction-match", "2"])
    assert exit_.value.code == 2
    assert "--induction-match: only with --induction-init" in capsys.readouterr().err


def test_the_card_reproduces_a_drafter_trained_later_with_both_commands(tmp_path):
    """A pair whose drafter came from a later ``--reuse-target`` run: the card's Reproduce lists the
    target's command first, then the drafter's, each with its own wall time; a pair from one run
    lists one command."""
    record = json.loads((agent_pair.DEFAULT_OUT / "train_log.json").read_text())
    single = {k: v for k, v in record.items() if k not in ("target_command", "target_wall_seconds")}
    one = agent_pair.reproduce(single | {"command": "python scripts/train_agent_pair.py --x", "wall_seconds": 600})
    assert one == "```bash\npython scripts/train_agent_pair.py --x\n```\n\n10 minutes"
    two = agent_pair.reproduce(record | {"target_command": "python scripts/train_agent_pair.py --t",
                                         "target_wall_seconds": 5220, "command": "python scripts/train_agent_pair.py "
                                         "--reuse-target --d", "wall_seconds": 1800})
    block, times = two.split("\n```\n\n")
    assert block.splitlines()[1:] == ["python scripts/train_agent_pair.py --t",
                                      "python scripts/train_agent_pair.py --reuse-target --d"]
    assert times.startswith("87 minutes for the first") and "30 for the second" in times
    agent_pair.write_card(tmp_path, record | {"target_command": "python scripts/train_agent_pair.py --t",
                                               "target_wall_seconds": 5220})
    assert "python scripts/train_agent_pair.py --t\npython scripts/train_agent_pair.py" in (tmp_path / "README.md").read_text()
