"""The prompt-read A/B: a bad argument is one line and exit 2, and a short run gives the same
tokens both ways and a new/old ratio per round."""

from __future__ import annotations

import json

from scripts.investigate import prompt_read_ab
from scripts.lab_tests.refusals import refusal


def test_bad_arguments_are_refused_in_one_line(capsys):
    assert "--rounds: expected >= 1, found 0" in refusal(capsys, prompt_read_ab.main, "--rounds", "0")
    assert "--depths" in refusal(capsys, prompt_read_ab.main, "--depths", "0")


def test_a_short_run_compares_both_ways(tmp_path):
    out = tmp_path / "ab.json"
    assert prompt_read_ab.main(["--depths", "4", "--prompts", "2", "--n-predict", "16", "--rounds", "2",
                                "--threads", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["same_tokens_both_ways"]
    assert result["old_prefill_reads"] == 2 * 2  # each prompt, each round: the old way ran
    assert len(result["depths"]["4"]["new_over_old"]["rounds"]) == 2
