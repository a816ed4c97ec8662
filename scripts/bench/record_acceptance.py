"""Record what a depth tuner faces on the laguna-tiny pair, so tuners can be replayed offline.

    python -m scripts.bench.record_acceptance --out tests/fixtures/recordings/replay.json
    python -m scripts.bench.record_acceptance --device cuda --lengths-from tests/fixtures/recordings/replay.json \
        --out replay-cuda.json     # another clock (here a GPU's) for the same content

Live benchmarks of ``--n-max auto`` on this 2-core machine move by 2-4% between runs, the size
of the margins being tuned. A replay removes that noise: the drafter's acceptance is a property
of the content, not of the clock, so it is recorded once, position by position, and the clock is
recorded once as a cost table. ``tests/helpers/depth_replay.py`` then plays any depth policy against both.

- **Match lengths**: for every prompt of a workload and every position t of its greedy output,
  how many of the drafter's 15 proposals from t agree with the target's greedy continuation
  (the blocks are causal, so a round at depth k accepts min(k, L_t)). The drafter runs inside
  llama.cpp on the target's captured hidden states, exactly as in a generation.
- **Costs** per prompt set (seconds, median of the rounds of fixed-depth generations): one round
  at each depth 0..15 (a plain step reading its row for the drafter); a plain step that need
  not (the tuner promised plain steps past the drafter's window); the extra time of a round
  whose depth differs from the round before (llama.cpp rebuilds its graphs for the new batch
  shape), and of the first and second rounds at a new depth over its settled cost (a GPU's
  backend runs both without the graph it replays from the third on); the drafter's catch-up on the rows of plain steps before a drafting round (a fixed
  part and a part per row); the spread of round times (the clock's noise) and its drift (how
  alike successive rounds' times are: a shared machine's load and the prompts' lengths move
  them together), from the autocorrelation of the fixed-depth runs' round times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from scripts.recorded import command_line, write_json
from tests.helpers.depth_replay import Scripted, drift


def match_lengths(engine, prompt: str, n_predict: int) -> list[int]:
    """L_t for t = 0 .. n_predict - 2: drafts from position t that agree with greedy decoding."""
    from laguna_dflash.runtime.engine import GenerateOptions

    greedy = engine.generate(prompt, GenerateOptions(n_predict=n_predict, n_max=0)).tokens
    prompt_tokens = engine.tokenize(prompt)
    rows = prompt_tokens + greedy[:-1]  # the last token is never context for a draft
    engine.reset()
    engine.drafter.set_capture(True)
    drafter, ctx = engine.drafter, engine.ctx
    feats = []
    for i0 in range(0, len(rows), ctx.n_batch):
        chunk = rows[i0:i0 + ctx.n_batch]
        ctx.decode(chunk, np.arange(i0, i0 + len(chunk)), logits="last")
        feats.append(drafter.captured_features())
    feats = np.concatenate(feats)
    n_prompt = len(prompt_tokens)
    drafter.inject(feats[:n_prompt], 0)
    out = []
    for t in range(len(greedy) - 1):
        truth = greedy[t + 1:t + 1 + drafter.spec.max_draft]
        drafts = drafter.draft(greedy[t], drafter.spec.max_draft)
        n = 0
        while n < len(truth) and drafts[n] == truth[n]:
            n += 1
        out.append(n)
        drafter.inject(feats[n_prompt + t:n_prompt + t + 1], n_prompt + t)
    return out


def round_times(engine, prompts: list[str], schedule: list[int], n_predict: int, ahead: int = 0) -> list[list[tuple]]:
    """Per prompt, (depth, accepted, t_round, t_catchup) of each round of ``schedule``; plain
    steps read their rows for the drafter unless ``ahead`` promises a stretch past its window."""
    from laguna_dflash.runtime.engine import GenerateOptions

    logs = []
    for p in prompts:
        policy = Scripted(schedule, ahead)
        engine.generate(p, GenerateOptions(n_predict=n_predict, n_max=policy))
        logs.append(policy.log)
    return logs


def measure_costs(engine, prompts: list[str], n_predict: int, progress, task) -> dict:
    max_depth = engine.drafter.spec.max_draft
    step, spread, runs = [], [], []
    for k in range(max_depth + 1):
        # rounds after the first two (graph shapes settled); the median is the depth's cost. The
        # last rounds of a generation are cut to the tokens left: they are not rounds at depth k
        times = [t for log in round_times(engine, prompts, [k], n_predict) for d, _, t, _ in log[2:] if d == k]
        med = statistics.median(times)
        step.append(med)
        spread += [t / med for t in times]
        runs.append([t / med for t in times])
        progress.advance(task)
    # plain steps that read their rows for the drafter and plain steps that need not (the tuner
    # promised a stretch past the window), prompt by prompt in turn: the difference is small
    # and the machine drifts
    with_rows, without = [], []
    for _ in range(3):
        for p in prompts:
            with_rows += [t for log in round_times(engine, [p], [0], n_predict) for _, _, t, _ in log[2:]]
            without += [t for log in round_times(engine, [p], [0], n_predict, ahead=1 << 30) for _, _, t, _ in log[2:]]
    step[0] = statistics.median(with_rows)
    skip = statistics.median(without)
    # a change of depth every other round: the first round at the new depth against the second,
    # and each of the two against the depth's settled cost (a GPU's backend replays a graph
    # only from the third round of a batch shape on: both are dearer there)
    first, after_change = [], ([], [])
    for k in (1, 2, 4, 8):
        other = 3 if k != 3 else 5
        for log in round_times(engine, prompts[:4], [k, k, other, other] * 100, n_predict):
            for i in range(2, len(log) - 1):
                d, _, t, _ = log[i]
                if d == k and log[i - 1][0] != k and log[i + 1][0] == k:
                    first.append(t - log[i + 1][2])
                    after_change[0].append(t - step[k])
                    after_change[1].append(log[i + 1][2] - step[k])
        progress.advance(task)
    # plain stretches of m steps, then a drafting round: the drafter reads the m rows it skipped
    rows, times = [], []
    for m in (8, 32, 64):
        for log in round_times(engine, prompts[:4], ([0] * m + [4, 4]) * 20, n_predict):
            for d, _, _, tc in log:
                if d == 4 and tc > 0:
                    rows.append(m)
                    times.append(tc)
        progress.advance(task)
    # the catch-up is one batched decode: a fixed part and a part per row
    per_row, fixed = np.polyfit(rows, times, 1)
    spread.sort()
    return {
        "window": engine.drafter.spec.sliding_window,
        "round_s": step,
        "plain_skip_s": skip,
        "depth_change_s": statistics.median(first),
        "change_s": [statistics.median(x) for x in after_change],
        "catchup_s": max(0.0, float(fixed)),
        "catchup_per_row_s": max(0.0, float(per_row)),
        # quantiles of round time / its depth's median: the replay draws its noise from these
        "noise_quantiles": [spread[int(q * (len(spread) - 1))] for q in np.linspace(0, 1, 41)],
        **drift(runs),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n-predict", type=int, default=96)
    ap.add_argument("--degrade", type=float, default=0.6)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where both models run (cuda: every layer)")
    ap.add_argument("--lengths-from", type=Path,
                    help="take the match lengths from this recording (they belong to the content) and time only the costs")
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.engine import Engine, EngineConfig
    from laguna_dflash.runtime.llama import Model
    from laguna_dflash.runtime.placement import resolve
    from scripts.bench.bench_autotune import degraded_drafter

    placement = resolve(args.device)
    config = EngineConfig(n_ctx=2048, n_gpu_layers_draft=placement.n_gpu_layers_draft)

    shipped = assets.converted_tiny_drafter()
    code = assets.read_prompts(assets.CODE_PROMPTS)
    plan = {"code": (shipped, code),
            "prose": (shipped, assets.read_prompts(assets.PROMPTS_DIR / "prose.txt")),
            "table": (shipped, assets.read_prompts(assets.PROMPTS_DIR / "table.txt"))}
    result = {"command": command_line(__file__, argv),
              "drafter_digest": assets.drafter_digest(), "n_predict": args.n_predict,
              "degrade": args.degrade, "placement": placement.describe(), "workloads": {}}
    if args.lengths_from:
        earlier = json.loads(args.lengths_from.read_text())
        for key in ("drafter_digest", "n_predict", "degrade"):
            if earlier[key] != result[key]:
                raise SystemExit(f"{args.lengths_from}: {key} is {earlier[key]!r}, expected {result[key]!r}")
        result["workloads"] = earlier["workloads"]
        result["lengths_from"] = str(args.lengths_from)
    measure_lengths = {} if args.lengths_from else {**plan, "degraded": (degraded_drafter(args.degrade), code)}
    console = Console()
    with Model(assets.TINY_TARGET, n_gpu_layers=placement.n_gpu_layers) as target, Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console) as progress:
        for name, (drafter, prompts) in measure_lengths.items():
            task = progress.add_task(f"match lengths: {name}", total=len(prompts))
            with Engine(target, drafter, config) as eng:
                lengths = []
                for p in prompts:
                    lengths.append(match_lengths(eng, p, args.n_predict))
                    progress.advance(task)
                result["workloads"][name] = lengths
        # the cost of a round depends on the prompts (their lengths set the attention's work), not
        # on the drafter's weights: the degraded drafter's workload runs on the code prompts
        result["costs"] = {}
        with Engine(target, shipped, config) as eng:
            for name in ("code", "prose", "table"):
                task = progress.add_task(f"round costs: {name}", total=16 + 4 + 3)
                result["costs"][name] = measure_costs(eng, plan[name][1], args.n_predict, progress, task)
        result["costs"]["degraded"] = result["costs"]["code"]
    write_json(args.out, result, indent=None, separators=(",", ":"))
    for name, c in result["costs"].items():
        console.print(f"{name}: round ms by depth " + " ".join(f"{1e3 * t:.2f}" for t in c["round_s"])
                      + f"; plain step without rows {1e3 * c['plain_skip_s']:.2f}; depth change {1e3 * c['depth_change_s']:+.2f} ms"
                      + " (first and second round after it: " + " and ".join(f"{1e3 * x:+.2f}" for x in c["change_s"]) + " ms)"
                      + f"; catch-up {1e3 * c['catchup_s']:.2f} ms + {1e6 * c['catchup_per_row_s']:.0f} us/row"
                      + f"; drift phi {c['drift_phi']:.2f}, share {c['drift_share']:.2f}")
    for name, lengths in result["workloads"].items():
        flat = [x for row in lengths for x in row]
        console.print(f"{name}: mean match length {sum(flat) / len(flat):.2f} over {len(flat)} positions")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
