"""What `--n-max auto`'s own bookkeeping costs per round, alone and between other runs.

    python -m scripts.bench.bench_bookkeeping --repeats 2

The engine times every ``choose``/``observe`` call of the depth policy (``Stats.t_policy``). In
a tight loop those calls take a few microseconds; between llama.cpp decodes the interpreter's
caches are cold and they take ten times that. ``scripts/bench/bench_autotune.py`` runs auto between
nine fixed-depth runs of each prompt, which cools them further. This script measures, in one
process and on the same code prompts, the tuner's share of the generation time in a stream of
auto-only requests (one tuner, as a server runs it) and in the interleaved order of the
benchmark, repeat by repeat in turn so that the machine's drift falls on both alike.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scripts.recorded import command_line, write_json

FIXED = (0, 1, 2, 3, 4, 5, 6, 8, 15)  # the fixed depths bench_autotune.py interleaves


def measure(engine, prompts: list[str], n_predict: int, interleaved: bool) -> dict:
    """One fresh tuner over the prompts; with ``interleaved`` every fixed depth runs first on
    each prompt, as in bench_autotune.py. Every run pays for the same trace callback."""
    from laguna_dflash.runtime.engine import GenerateOptions
    from laguna_dflash.runtime.tuner import AutoDepth

    tuner = AutoDepth(engine.drafter.spec.max_draft, window=engine.drafter.spec.sliding_window,
                      graph_replay=engine.graph_replay)
    t_policy = t_total = 0.0
    rounds = 0
    for prompt in prompts:
        for depth in FIXED if interleaved else ():
            sink: list = []
            engine.generate(prompt, GenerateOptions(n_predict=n_predict, n_max=depth, trace=sink.append))
        sink = []
        s = engine.generate(prompt, GenerateOptions(n_predict=n_predict, n_max=tuner, trace=sink.append)).stats
        t_policy += s.t_policy
        t_total += s.t_total
        rounds += s.rounds
    return {"us_per_round": 1e6 * t_policy / rounds, "share": t_policy / t_total, "rounds": rounds}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--n-predict", type=int, default=96)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions
    from laguna_dflash.runtime.llama import Model

    prompts = assets.read_prompts(assets.CODE_PROMPTS)
    runs: dict[str, list[dict]] = {"auto alone": [], "interleaved": []}
    with Model(assets.TINY_TARGET) as target, \
            Engine(target, assets.converted_tiny_drafter(), EngineConfig(n_ctx=2048)) as engine, \
            Progress(transient=True) as progress:
        engine.generate(prompts[0], GenerateOptions(n_predict=8, n_max=0))  # warm-up
        task = progress.add_task("bookkeeping", total=2 * args.repeats)
        for _ in range(args.repeats):
            for name in runs:
                runs[name].append(measure(engine, prompts, args.n_predict, name == "interleaved"))
                progress.advance(task)
    t = Table(title="--n-max auto: the tuner's own time (code prompts, one process)", title_justify="left")
    for col in ("order", "us per round (per repeat)", "share of generation time (per repeat)"):
        t.add_column(col, justify="right")
    for name, rs in runs.items():
        t.add_row(name, ", ".join(f"{r['us_per_round']:.0f}" for r in rs),
                  ", ".join(f"{100 * r['share']:.2f}%" for r in rs))
    Console().print(t)
    if args.json:
        cmd = command_line(__file__, argv)
        write_json(args.json, {"command": cmd, "runs": runs}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
