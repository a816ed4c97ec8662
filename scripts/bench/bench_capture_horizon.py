#!/usr/bin/env python3
"""How many rows a drafter needs back after a stretch of plain decoding (the capture horizon).

When `--n-max auto` promises a stretch of plain steps, only the last ``capture_horizon`` of
them read their rows from the target for the drafter (``laguna_dflash.runtime.drafter.CATCHUP_ROWS``); the
drafter's context before the next draft is then those rows alone. Two measurements on the
bundled laguna-tiny pair, greedy:

1. acceptance: a scripted policy alternates ``--stretch`` plain steps with ``--visit`` rounds
   at depth ``--depth``, with only the last L rows of each stretch read back, for each L of
   ``--rows`` (the first is the drafter's whole window); printed: mean drafts accepted per
   visit round, per workload. With an F32 cache the greedy output is the same for every L
   (checked).
2. ``--ab``: time, in one process, `auto` with horizons 64 and the drafter's window against
   plain decoding on the degraded drafter (``bench_autotune.py``'s), interleaved prompt by
   prompt, ``--repeats`` times; printed: each as a ratio to plain decoding.

    python -m scripts.bench.bench_capture_horizon [--json out.json] [--ab]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path


from laguna_dflash.runtime.tuner import DepthPolicy  # noqa: E402
from scripts.recorded import command_line, write_json


class StretchThenVisit(DepthPolicy):
    """``stretch`` plain steps, then ``visit`` rounds at ``depth``, in turn; it promises the plain
    steps left in the stretch, so the engine reads only the last capture_horizon rows."""

    def __init__(self, stretch: int, visit: int, depth: int) -> None:
        self.stretch, self.visit, self.depth = stretch, visit, depth
        self.rounds = 0
        self.accepted: list[int] = []

    def _phase(self) -> int:
        return self.rounds % (self.stretch + self.visit)

    def choose(self) -> int:
        return 0 if self._phase() < self.stretch else self.depth

    def plain_rounds_ahead(self) -> int:
        return max(0, self.stretch - self._phase() - 1)

    def observe(self, depth: int, accepted: int, t_round: float, t_catchup: float = 0.0) -> None:
        self.rounds += 1
        if depth:
            self.accepted.append(accepted)


def acceptance_by_rows(engine, prompts: list[str], rows: list[int], args) -> dict[str, float]:
    from laguna_dflash.runtime.engine import GenerateOptions

    out, outputs = {}, {}
    for n_rows in rows:
        engine.drafter.capture_horizon = n_rows
        accepted, texts = [], []
        for p in prompts:
            policy = StretchThenVisit(args.stretch, args.visit, args.depth)
            texts.append(engine.generate(p, GenerateOptions(n_predict=args.n_predict, n_max=policy)).tokens)
            accepted += policy.accepted
        outputs[n_rows] = texts
        out[str(n_rows)] = statistics.fmean(accepted)
        out[f"{n_rows}_visit_rounds"] = len(accepted)
    first = outputs[rows[0]]
    if any(o != first for o in outputs.values()):
        raise SystemExit("the greedy output changed with the capture horizon: a capture bug")
    return out


def ab(target, drafter, prompts: list[str], window: int, repeats: int) -> dict[str, float]:
    from laguna_dflash.runtime.engine import Engine, GenerateOptions
    from laguna_dflash.runtime.drafter import CATCHUP_ROWS
    from laguna_dflash.runtime.tuner import AutoDepth

    horizons = {f"auto, horizon {CATCHUP_ROWS}": CATCHUP_ROWS, f"auto, horizon {window}": window}
    tokens, seconds = defaultdict(int), defaultdict(float)
    with Engine.load(target, drafter) as engine:
        engine.generate(prompts[0], GenerateOptions(n_predict=8, n_max=0))  # warm-up
        for _ in range(repeats):
            tuners = {name: AutoDepth(engine.drafter.spec.max_draft, window=window, graph_replay=engine.graph_replay)
                      for name in horizons}
            for p in prompts:
                for name in ["plain", *horizons]:
                    engine.drafter.capture_horizon = horizons.get(name, CATCHUP_ROWS)
                    s = engine.generate(p, GenerateOptions(n_predict=96, n_max=tuners.get(name, 0))).stats
                    tokens[name] += s.n_generated
                    seconds[name] += s.t_total
    plain = tokens["plain"] / seconds["plain"]
    return {name: tokens[name] / seconds[name] / plain for name in horizons} | {"plain_tokens_per_s": plain}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="512,128,64,32", help="rows read back after each stretch (first: the whole window)")
    ap.add_argument("--stretch", type=int, default=150)
    ap.add_argument("--visit", type=int, default=4)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--n-predict", type=int, default=460)
    ap.add_argument("--workloads", default="code,prose", help="prompt files for the acceptance part ('' to skip it)")
    ap.add_argument("--ab", action="store_true", help="also time auto with both horizons on the degraded drafter")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from rich.console import Console

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.engine import Engine, EngineConfig
    from scripts.bench.bench_autotune import degraded_drafter

    console = Console()
    rows = [int(r) for r in args.rows.split(",")]
    drafter = assets.converted_tiny_drafter()
    result = {"command": command_line(__file__, argv),
              "stretch": args.stretch, "visit": args.visit, "depth": args.depth, "acceptance": {}}
    # an F32 cache makes greedy speculative output equal plain decoding's on this CPU, so the
    # output must not depend on the horizon (with F16, near-ties may part: docs/results/demo-pair/README.md)
    with Engine.load(assets.TINY_TARGET, drafter, EngineConfig(kv_type="f32")) as engine:
        for name in filter(None, args.workloads.split(",")):
            prompts = assets.read_prompts(assets.PROMPTS_DIR / f"{name}.txt")
            r = result["acceptance"][name] = acceptance_by_rows(engine, prompts, rows, args)
            console.print(f"{name}: mean accepted per visit round ({r[f'{rows[0]}_visit_rounds']} rounds) by rows "
                          "read back: " + ", ".join(f"{n}: {r[str(n)]:.3f}" for n in rows))
        window = engine.drafter.spec.sliding_window
    if args.ab:
        r = result["ab"] = ab(assets.TINY_TARGET, degraded_drafter(0.6), assets.read_prompts(assets.CODE_PROMPTS),
                              window, args.repeats)
        console.print(f"degraded drafter, against plain decoding ({r['plain_tokens_per_s']:.0f} tok/s): "
                      + ", ".join(f"{k} {v:.3f}" for k, v in r.items() if k.startswith("auto")))
    if args.json:
        write_json(args.json, result, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
