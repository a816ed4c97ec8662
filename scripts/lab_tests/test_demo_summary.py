"""make demo's last line: both speeds of this run, their ratio, and whether the output is plain
decoding's."""

from __future__ import annotations

import re

from laguna_dflash.runtime.assets import PROMPTS_DIR
from scripts.demo_summary import main, summary_line


def test_line_names_both_speeds_the_ratio_and_the_verdict():
    assert summary_line(600.0, 300.0, 4, 200, None) == (
        "speculative 600 tokens/s vs plain 300 tokens/s, measured in this run (n_max 4, 200 tokens): "
        "2.00x; output identical to plain decoding: yes")
    assert "identical to plain decoding: no, from generated token 17 on" in summary_line(600.0, 300.0, 4, 200, 17)


def test_demo_prints_one_line_from_a_real_run(capsys):
    assert main(["-f", str(PROMPTS_DIR / "demo.py"), "-n", "24", "--n-max", "4", "-t", "1", "--repeats", "1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    m = re.fullmatch(r"speculative (\d+) tokens/s vs plain (\d+) tokens/s, measured in this run "
                     r"\(n_max 4, 24 tokens\): (\d+\.\d\d)x; output identical to plain decoding: (yes|no.*)", out[0])
    assert m, out[0]
    spec, plain, ratio = int(m[1]), int(m[2]), float(m[3])
    assert spec > 0 and plain > 0 and abs(ratio - spec / plain) < 0.02 + 2 / plain
