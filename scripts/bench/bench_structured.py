#!/usr/bin/env python3
"""Constrained vs unconstrained speculative decoding on prompts whose answer is JSON or a tool call.

    flock -x /tmp/laguna-cpu.lock .venv/bin/python -m scripts.bench.bench_structured --repeats 7 --json docs/results/structured/structured.json

``--pair code`` (the bundled laguna-tiny pair, which completes Python code): the prompts are
Python that asks for a JSON value the way code does (``DEFAULTS = ``, a docstring saying "return
the settings as JSON", a request body) and two that lead into a tool call. ``--pair agent`` (the
agent pair, which speaks Laguna 2.1's chat format): the first turns of the held-out agent tasks,
rendered by the pair's own template (thinking off and on in turn), under ``tool_choice:
"required"`` over the agent's tools (after the reasoning where thinking is on); the pair answers
them with a tool call unconstrained too, so the comparison is the constraint's cost on output the
model writes anyway. One process, one engine (Q8_0 drafter, the
default F16 cache); a repetition runs every prompt under every configuration, the configurations
in a fresh random order for each prompt:

* ``spec``: unconstrained, depth ``--depth``; ``spec+c``: the same under the prompt's
  constraint (a JSON schema with bounded strings, ``json_object``, or ``tool_calls``);
* ``plain``, ``plain+c``: the same at depth 0.

Statistics, fixed before any run: tokens/s of a configuration in a repetition = its generated
tokens over its generation seconds (prefill excluded), summed over the prompts; reported: the
median over repetitions of the ratio ``spec+c / spec`` (and of ``plain+c / plain``) within the
repetition, with min and max, and each configuration's median tokens/s and acceptance. The
constraint's own cost: the wall time spent inside the constraint's code (drafting under the mask,
masks, consuming tokens; measured by wrapping runtime.constraint's Matcher methods with a clock), per
generated token and per round, median over repetitions.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from laguna_dflash.runtime import assets, constraint as constraint_mod
from laguna_dflash.runtime.constraint import Constraint
from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions

from scripts.recorded import command_line, write_json

RECORD = {
    "type": "object", "additionalProperties": False,
    "properties": {"name": {"type": "string", "maxLength": 32},
                   "size": {"type": "integer", "minimum": 0, "maximum": 100000},
                   "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4},
                   "enabled": {"type": "boolean"}},
    "required": ["name", "size", "tags", "enabled"],
}
CONFIG = {
    "type": "object", "additionalProperties": False,
    "properties": {"host": {"type": "string", "maxLength": 40}, "port": {"type": "integer", "maximum": 65535},
                   "debug": {"type": "boolean"}, "paths": {"type": "array", "maxItems": 4,
                                                           "items": {"type": "string", "maxLength": 40}}},
    "required": ["host", "port", "debug", "paths"],
}
TOOLS = [
    {"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer", "maximum": 9999}},
        "required": ["path"]}}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}, "regex": {"type": "boolean"}},
        "required": ["query", "regex"]}}},
]

PROMPTS = [
    ("import json\n\nDEFAULTS = ", Constraint.json_schema(RECORD)),
    ('def load_settings():\n    """Return the settings as a JSON object."""\n    return ', Constraint.json_schema(CONFIG)),
    ('x = {"name": "demo", "size": 3}\ny = ', Constraint.json_schema(RECORD)),
    ("# the request body, as JSON\nbody = ", Constraint.json_schema(CONFIG)),
    ('config = json.loads(open("settings.json").read())\ndefaults = ', Constraint.json_object()),
    ('HEADERS = {"Content-Type": "application/json", "Accept": "text/plain"}\nPARAMS = ', Constraint.json_object()),
    ("def find(pattern):\n    # look it up\n    ", Constraint.tool_calls(TOOLS)),
    ("import os\n\n", Constraint.tool_calls(TOOLS, {"type": "function", "function": {"name": "read_file"}})),
]


class ConstraintClock:
    """Wall time inside the constraint's code: the Matcher methods the engine calls."""

    METHODS = ("allowed", "admissible", "try_consume", "consume", "masked", "is_allowed", "draft", "rollback")

    def __init__(self) -> None:
        self.total = 0.0
        self.calls = defaultdict(int)
        self.depth = 0  # only the outermost call is timed (the methods call each other)
        cls = constraint_mod.Matcher
        for name in self.METHODS:
            self._wrap(cls, name)

    def _wrap(self, cls, name: str) -> None:
        inner = getattr(cls, name)
        clock = self

        def timed(*a, **kw):
            clock.depth += 1
            t0 = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                clock.depth -= 1
                if clock.depth == 0:
                    clock.total += time.perf_counter() - t0
                    clock.calls[name] += 1

        setattr(cls, name, timed)


def agent_prompts(target) -> list[tuple[list[int], Constraint]]:
    """The held-out agent tasks' first turns, each under a required tool call."""
    from laguna_dflash.runtime.chat_template import ChatTemplate
    from laguna_dflash.runtime.conversation import ChatTurn

    from examples.agent_tools import TOOLS as AGENT_TOOLS
    from tests.helpers.agent_tasks import held_out_tasks

    template = ChatTemplate(target.chat_template(), assets.AGENT_TARGET)
    bos = target.special_text("bos")
    out = []
    for i, task in enumerate(t for t in held_out_tasks(10) if t.first_call is not None):
        turn = ChatTurn.render(template, [{"role": "user", "content": task.user}], tools=AGENT_TOOLS,
                               template_kwargs={"enable_thinking": i % 2 == 1}, bos_token=bos)
        tokens = target.tokenize(turn.prompt, add_special=False, parse_special=True)
        out.append((tokens, Constraint.tool_calls(AGENT_TOOLS, "required", after_reasoning=turn.reasoning)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", choices=("code", "agent"), default="code", help="which bundled pair and its prompts")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-t", "--threads", type=int, default=0, help="CPU threads (0: all cores)")
    args = ap.parse_args(argv)
    clock = ConstraintClock()
    rng = random.Random(args.seed)
    configs = {"spec": (args.depth, False), "spec+c": (args.depth, True), "plain": (0, False), "plain+c": (0, True)}
    per_rep = []
    target, drafter = assets.default_pair(None, args.pair)
    with Engine.load(target, drafter, EngineConfig(n_ctx=2048, n_threads=args.threads)) as eng:
        from laguna_dflash.runtime.conversation import end_of_turn_tokens

        prompts = PROMPTS if args.pair == "code" else agent_prompts(eng.target)
        ends = {} if args.pair == "code" else {"end_tokens": end_of_turn_tokens(eng.target), "special_text": True}
        for prompt, c in prompts:  # compile every constraint once, outside the timed runs
            constraint_mod.compile_constraint(c, eng.target)
        for _, c in prompts[:2]:  # warm-up
            eng.generate(prompts[0][0], GenerateOptions(n_predict=16, n_max=args.depth, constraint=c, **ends))
        for rep in range(args.repeats):
            acc = {k: {"tokens": 0, "seconds": 0.0, "rounds": 0, "drafted": 0, "accepted": 0, "c_seconds": 0.0,
                       "eog": 0} for k in configs}
            for prompt, c in prompts:
                order = list(configs)
                rng.shuffle(order)
                for name in order:
                    depth, constrained = configs[name]
                    before = clock.total
                    res = eng.generate(prompt, GenerateOptions(n_predict=args.n_predict, n_max=depth,
                                                               constraint=c if constrained else None, **ends))
                    a = acc[name]
                    a["tokens"] += res.stats.n_generated
                    a["seconds"] += res.stats.t_total
                    a["rounds"] += res.stats.rounds
                    a["drafted"] += res.stats.drafted
                    a["accepted"] += res.stats.accepted
                    a["c_seconds"] += clock.total - before
                    a["eog"] += res.stop_reason == "eog"
            per_rep.append(acc)
            print(f"repetition {rep + 1}: " + ", ".join(f"{k} {v['tokens'] / v['seconds']:.1f} tok/s"
                                                       for k, v in acc.items()), flush=True)

    def tps(a):
        return a["tokens"] / a["seconds"]

    def summary(values):
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    out = {
        "command": "flock -x /tmp/laguna-cpu.lock " + command_line(__file__, argv),
        "pair": args.pair, "repeats": args.repeats, "depth": args.depth, "n_predict": args.n_predict,
        "prompts": [{"prompt": p if isinstance(p, str) else f"{len(p)} tokens", "constraint": c.kind} for p, c in prompts],
        "ratio_spec_constrained_over_spec": summary([tps(r["spec+c"]) / tps(r["spec"]) for r in per_rep]),
        "ratio_plain_constrained_over_plain": summary([tps(r["plain+c"]) / tps(r["plain"]) for r in per_rep]),
        "configs": {k: {"tokens_per_s": summary([tps(r[k]) for r in per_rep]),
                        "tokens": per_rep[0][k]["tokens"], "complete_outputs": per_rep[0][k]["eog"],
                        "accepted_per_round": per_rep[0][k]["accepted"] / max(1, per_rep[0][k]["rounds"]),
                        "acceptance": per_rep[0][k]["accepted"] / max(1, per_rep[0][k]["drafted"]),
                        "constraint_us_per_token": summary([1e6 * r[k]["c_seconds"] / r[k]["tokens"] for r in per_rep]),
                        "constraint_us_per_round": summary([1e6 * r[k]["c_seconds"] / max(1, r[k]["rounds"])
                                                            for r in per_rep]),
                        "constraint_share_of_time": summary([r[k]["c_seconds"] / r[k]["seconds"] for r in per_rep])}
                    for k in configs},
    }
    print(json.dumps(out, indent=1))
    if args.json:
        write_json(args.json, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
