"""Judge `--n-max auto` offline: replay it on the recorded laguna-tiny pair, many times.

    python -m scripts.bench.replay_autotune --recording tests/fixtures/recordings/replay.json --seeds 20

For each workload of the recording and each seed (seed 0: the prompt files' order; others: a
shuffled order, and every seed its own draw of the clock's noise, the same for every policy), a fresh tuner generates the
whole stream of prompts; every fixed depth 0..15 is replayed on the same stream with the same
noise model. Reported: auto against the best fixed depth (mean and worst seed), against plain
decoding, the quality of its choices from round 64 on (the mean fixed-depth speed of the depths
it exploited, relative to the best fixed depth), and how often it settled strictly (every
exploiting round from 64 on at a depth within 5% of the best). Then (``--stream``) one tuner
through the workloads in turn, each prompt on its own workload's clock, as the live sweep runs
them: how much following a change of content costs. ``scripts/bench/bench_autotune.py`` is the live
counterpart.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from scripts.arguments import factor_list
from scripts.recorded import command_line, write_json
from tests.helpers.depth_replay import RECORDED


def summary(make_policy, rec, prompts: list[list[int]], seeds: int) -> dict:
    from tests.helpers.depth_replay import SETTLE_ROUNDS, judge

    j = judge(make_policy, rec, prompts, seeds)
    ratios, vs_plain, quality, settles = j.vs_best_fixed, j.vs_plain, j.choice_quality, j.settle_round
    return {"auto_vs_best_fixed_mean": statistics.mean(ratios), "auto_vs_best_fixed_min": min(ratios),
            "auto_vs_plain_mean": statistics.mean(vs_plain), "auto_vs_plain_min": min(vs_plain),
            "settled_by_64": sum(1 for s in settles if s is not None and s <= SETTLE_ROUNDS) / len(settles),
            "choice_quality_after_64_mean": statistics.mean(quality), "choice_quality_after_64_min": min(quality),
            "settle_rounds": settles, "ratios": ratios}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recording", type=Path, default=RECORDED / "replay.json")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--workloads", default="")
    ap.add_argument("--stream", default="code,table,prose",
                    help="also replay one tuner through these workloads in turn (content changes); '' to skip")
    ap.add_argument("--plain-settle", type=factor_list, default=None,
                    help="factors of the 2nd, 3rd, ... plain step after a drafting round (e.g. 1.26,1.25,1.18,1.11), "
                         "instead of the recording's (none: every plain step after the first at its cost)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.table import Table

    from tests.helpers.depth_replay import Recording
    from laguna_dflash.runtime.tuner import AutoDepth

    settle = args.plain_settle
    names = args.workloads.split(",") if args.workloads else list(Recording.load(args.recording).workloads)
    t = Table(title=f"--n-max auto replayed ({args.seeds} seeds per workload)", title_justify="left")
    for col in ("workload", "auto vs best (mean)", "worst seed", "auto vs plain (mean)", "worst seed",
                "choice quality after round 64 (mean)", "worst seed", "strictly settled by round 64"):
        t.add_column(col, justify="right")
    out = {}
    for name in names:
        rec = Recording.load(args.recording, costs_of=name, plain_settle=settle)
        j = summary(AutoDepth, rec, rec.workloads[name], args.seeds)
        out[name] = j
        t.add_row(name, f"{j['auto_vs_best_fixed_mean']:.3f}", f"{j['auto_vs_best_fixed_min']:.3f}",
                  f"{j['auto_vs_plain_mean']:.3f}", f"{j['auto_vs_plain_min']:.3f}",
                  f"{j['choice_quality_after_64_mean']:.3f}", f"{j['choice_quality_after_64_min']:.3f}",
                  f"{100 * j['settled_by_64']:.0f}% of seeds")
    Console().print(t)
    result = {"command": command_line(__file__, argv),
              "workloads": out}
    if args.stream:
        from tests.helpers.depth_replay import judge_stream

        segments = args.stream.split(",")
        stream = judge_stream(AutoDepth, {n: Recording.load(args.recording, costs_of=n, plain_settle=settle)
                                          for n in segments}, args.seeds)
        s = Table(title=f"one tuner through {' -> '.join(segments)} ({args.seeds} seeds): auto vs the best fixed "
                  "depth on each part", title_justify="left")
        for col in ("workload", "mean", "worst seed"):
            s.add_column(col, justify="right")
        for n, ratios in stream.items():
            s.add_row(n, f"{statistics.mean(ratios):.3f}", f"{min(ratios):.3f}")
        Console().print(s)
        result["stream"] = {"order": segments, "auto_vs_best_fixed": stream}
    if args.json:
        write_json(args.json, result, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
