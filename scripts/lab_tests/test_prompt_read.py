"""The prompt-read probe: a bad argument or a file that is no pair is one line and exit 2 before
anything loads, and a short run on the bundled pair times each part and writes its record."""

from __future__ import annotations

import json

from laguna_dflash.convert.gguf.specs import read_drafter
from laguna_dflash.runtime import assets
from scripts.investigate import prompt_read
from scripts.lab_tests.refusals import refusal


def test_bad_arguments_are_refused_in_one_line(capsys, tmp_path):
    target, drafter = str(assets.TINY_TARGET), str(assets.converted_tiny_drafter())
    assert "--target" in refusal(capsys, prompt_read.main, "--drafter", drafter)
    assert "--reps: expected >= 1, found 0" in refusal(capsys, prompt_read.main, "--target", target,
                                                       "--drafter", drafter, "--reps", "0")
    assert "--prompts" in refusal(capsys, prompt_read.main, "--target", target, "--drafter", drafter,
                                  "--prompts", "0")
    missing = tmp_path / "x.gguf"
    assert f"--drafter: no file {missing}" in refusal(capsys, prompt_read.main, "--target", target,
                                                      "--drafter", str(missing))
    # the target given as the drafter: a contract error naming the file, not a crash in llama.cpp
    assert target in refusal(capsys, prompt_read.main, "--target", target, "--drafter", target)


def test_a_short_run_times_the_read_of_the_visible_rows(tmp_path):
    out = tmp_path / "read.json"
    drafter = assets.converted_tiny_drafter()
    assert prompt_read.main(["--target", str(assets.TINY_TARGET), "--drafter", str(drafter), "--prompts", "40,700",
                             "--reps", "1", "--threads", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    window = read_drafter(drafter).sliding_window
    assert window < 700  # the long prompt is read from its last window only
    assert result["prompts"]["40"]["rows_read"] == 40 and result["prompts"]["700"]["rows_read"] == window - 1
    for row in result["prompts"].values():
        assert row["read"]["median_ms"] > 0 and row["prefill"]["median_ms"] > 0 and row["step"]["median_ms"] > 0
