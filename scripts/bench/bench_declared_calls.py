#!/usr/bin/env python3
"""What holding calls to the declared tools costs (``tool_choice: "auto"`` with tools,
runtime/constraint/tool_calls.py): the bundled agent pair's first replies to its held-out tasks,
greedy at depth ``--n-max``, with and without the constraint, interleaved.

    python -m scripts.bench.bench_declared_calls --repeats 3

Statistic (fixed before the run): decode tokens/s summed over all replies of a repetition, with
and without; the ratio of the medians over repetitions, held at >= 0.9; every constrained reply
is also compared with the unconstrained one (equal where the model only calls declared tools).
"""

from __future__ import annotations

import argparse
import statistics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n-max", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--n-predict", type=int, default=256)
    args = parser.parse_args(argv)

    from examples.agent_tools import TOOLS

    from tests.helpers.agent_tasks import held_out_tasks

    from laguna_dflash.runtime.drafter_cache import native_drafter_path
    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.chat_template import ChatTemplate
    from laguna_dflash.runtime.constraint import compile_constraint, declared_calls_constraint
    from laguna_dflash.runtime.conversation import ChatTurn, end_of_turn_tokens
    from laguna_dflash.runtime.engine import Engine, EngineConfig
    from laguna_dflash.runtime.llama import Model
    from laguna_dflash.runtime.request import GenerateOptions

    _, target_path, convert = assets.BUNDLED["agent"]
    with Model(target_path) as target:
        drafter_path = native_drafter_path(convert(), target.path)
        template = ChatTemplate(target.chat_template(), target.path)
        ends = end_of_turn_tokens(target)
        constraint = compile_constraint(declared_calls_constraint(TOOLS), target)
        prompts = [target.tokenize(ChatTurn.render(template, [{"role": "user", "content": t.user}], tools=TOOLS).prompt,
                                   add_special=False, parse_special=True) for t in held_out_tasks(args.tasks)]
        speeds: dict[str, list[float]] = {"plain": [], "held": []}
        same = total = 0
        with Engine(target, drafter_path, EngineConfig(n_ctx=4096, kv_type="f32", n_threads=1)) as engine:
            for _ in range(args.repeats):
                n = {"plain": 0, "held": 0}
                s = {"plain": 0.0, "held": 0.0}
                for tokens in prompts:
                    out = {}
                    for key, c in (("plain", None), ("held", constraint)):
                        r = engine.generate(tokens, GenerateOptions(n_predict=args.n_predict, n_max=args.n_max,
                                                                    constraint=c, end_tokens=ends, special_text=True))
                        n[key] += r.stats.n_generated
                        s[key] += r.stats.t_total
                        out[key] = r.tokens
                    same += out["plain"] == out["held"]
                    total += 1
                for key in speeds:
                    speeds[key].append(n[key] / s[key])
    plain, held = (statistics.median(speeds[k]) for k in ("plain", "held"))
    print(f"unconstrained {plain:.1f} tok/s ({min(speeds['plain']):.1f}-{max(speeds['plain']):.1f}), "
          f"held to the tools {held:.1f} tok/s ({min(speeds['held']):.1f}-{max(speeds['held']):.1f}): "
          f"ratio {held / plain:.3f}; {same} of {total} replies the same")
    return 0 if held / plain >= 0.9 else 1


if __name__ == "__main__":
    raise SystemExit(main())
