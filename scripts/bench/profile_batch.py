#!/usr/bin/env python3
"""Where a batched round spends its time (runtime/batch.py): the target pass, each slot's drafter
work, the depth planner and the rest (host), per round and per slot.

    python -m scripts.bench.profile_batch --streams 4 --depths 0,4 --threads 2 \\
        --json docs/results/concurrency/round-profile.json

C streams run a closed loop of greedy requests on a BatchEngine of C slots (bundled code pair,
F16 cache, prompt cache off), as scripts/bench/bench_concurrency.py serves them. Every call below
is wrapped with profile_host's exclusive timers (wall and this thread's CPU time): the target's
``decode_seqs`` (the one pass per round), the drafter's passes (``draft``, ``draft_logits``), its
bookkeeping (queueing and reading captured rows: ``inject_captured``, ``queue_visible``,
``inject_visible``, ``catch_up``, ``captured_features``), the sampler, the planner. What no
wrapper covers is the round loop's own Python. Figures are per round of the engine (one ``step``), prefill rounds apart: requests
are timed from their first decoding round, and a round that also prefilled a prompt is left out.
Statistic (fixed before the run): the sum over ``--repeats`` closed loops divided by rounds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from scripts.arguments import int_list
from scripts.bench.profile_host import Timers
from scripts.recorded import command_line, write_json

DRAFTER_PASSES = ("draft", "draft_logits")
DRAFTER_BOOKKEEPING = ("inject_captured", "inject_visible", "queue_visible", "catch_up", "captured_features",
                       "flush_pending", "plain_step_begins", "plain_step_ends")


def instrument(engine, timers: Timers) -> None:
    import laguna_dflash.runtime.drafter as rdrafter
    import laguna_dflash.runtime.llama as rllama
    import laguna_dflash.runtime.sampling as rsampling
    import laguna_dflash.runtime.tuner.batch as rplanner

    C = rllama.Context
    C.decode_seqs = timers.wrap("target pass (decode_seqs)", C.__dict__["decode_seqs"])
    D = rdrafter.Drafter
    for name in DRAFTER_PASSES + DRAFTER_BOOKKEEPING:
        if name in D.__dict__:
            kind = "drafter pass" if name in DRAFTER_PASSES else "drafter bookkeeping"
            setattr(D, name, timers.wrap(f"{kind} ({name})", D.__dict__[name]))
    for name in ("sample", "accept"):
        S = rsampling.Sampler
        setattr(S, name, timers.wrap(f"sampler ({name})", S.__dict__[name]))
    P = rplanner.BatchPlanner
    for name in ("plan", "observe"):
        if name in P.__dict__:
            setattr(P, name, timers.wrap(f"planner ({name})", P.__dict__[name]))
    # the engine's side of planning: what it reads of the pass to tell the planner and plan the
    # next one (exclusive of the planner's own calls inside it)
    import laguna_dflash.runtime.batch as rbatch

    B = rbatch.BatchEngine
    if "_plan_depths" in B.__dict__:
        B._plan_depths = timers.wrap("planner (the engine's _plan_depths)", B.__dict__["_plan_depths"])


def closed_loop(engine, prompts, opts, streams: int, timers: Timers) -> dict:
    """Serve ``prompts`` with ``streams`` concurrent requests; time only rounds without a prefill."""
    queue = list(range(len(prompts)))
    owner: dict[int, int] = {}
    wall = cpu = 0.0
    rounds = 0
    kept = Timers()  # the timers of decoding rounds only
    while queue or owner:
        for slot in range(streams):
            if queue and slot not in owner:
                engine.start(slot, prompts[queue.pop(0)], opts)
                owner[slot] = 1
        prefill = any(s.rows is not None and s.rows.prompt for s in engine.slots)
        timers.reset()
        w0, c0 = time.perf_counter(), time.thread_time()
        ended = engine.step()
        w1, c1 = time.perf_counter(), time.thread_time()
        for fin in ended:
            owner.pop(fin.slot)
            engine.take_text(fin.slot)
        if prefill:
            continue
        wall += w1 - w0
        cpu += c1 - c0
        rounds += 1
        for label in timers.wall:
            kept.wall[label] += timers.wall[label]
            kept.cpu[label] += timers.cpu[label]
            kept.calls[label] += timers.calls[label]
    return {"rounds": rounds, "wall": wall, "cpu": cpu, "timers": kept}


def summarise(res: dict, streams: int, depth) -> dict:
    n = res["rounds"]
    t: Timers = res["timers"]
    groups: dict[str, dict] = {}
    for label in t.wall:
        g = label.split(" (")[0]
        e = groups.setdefault(g, {"wall_us": 0.0, "cpu_us": 0.0, "calls": 0.0, "parts": {}})
        e["wall_us"] += t.wall[label] / n * 1e6
        e["cpu_us"] += t.cpu[label] / n * 1e6
        e["calls"] += t.calls[label] / n
        e["parts"][label] = {"wall_us": t.wall[label] / n * 1e6, "cpu_us": t.cpu[label] / n * 1e6,
                             "calls_per_round": t.calls[label] / n}
    covered_w = sum(g["wall_us"] for g in groups.values())
    covered_c = sum(g["cpu_us"] for g in groups.values())
    groups["host (round loop, stop checks, bookkeeping)"] = {
        "wall_us": res["wall"] / n * 1e6 - covered_w, "cpu_us": res["cpu"] / n * 1e6 - covered_c}
    for g in groups.values():
        g["per_slot_wall_us"] = g["wall_us"] / streams
    return {"streams": streams, "depth": depth, "rounds": n, "round_wall_us": res["wall"] / n * 1e6,
            "round_cpu_us": res["cpu"] / n * 1e6, "groups": groups}


def table(s: dict) -> str:
    lines = [f"{s['streams']} streams, depth {s['depth']}: {s['rounds']} decoding rounds, "
             f"{s['round_wall_us']:.0f} us wall ({s['round_cpu_us']:.0f} us CPU of this thread) per round",
             f"  {'what':46s} {'calls/round':>11s} {'wall us':>9s} {'share':>6s} {'per slot us':>11s} {'cpu us':>9s}"]
    for name, g in sorted(s["groups"].items(), key=lambda kv: -kv[1]["wall_us"]):
        lines.append(f"  {name:46s} {g.get('calls', 0):11.2f} {g['wall_us']:9.1f} "
                     f"{g['wall_us'] / s['round_wall_us']:6.1%} {g['per_slot_wall_us']:11.1f} {g['cpu_us']:9.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--depths", default="0,4", help="comma-separated depths, or auto")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.batch import BatchEngine
    from laguna_dflash.runtime.engine import EngineConfig, GenerateOptions
    from laguna_dflash.runtime.open_pair import resolve_pair

    pair = resolve_pair(assets.TINY_TARGET, assets.converted_tiny_drafter())
    cfg = EngineConfig(n_ctx=1024, n_threads=args.threads, kv_type="f16", prompt_cache=False)
    results = []
    with BatchEngine.open(pair, cfg, n_seq=args.streams) as engine:
        texts = assets.read_prompts(assets.CODE_PROMPTS)
        prompts = [engine.tokenize(texts[i % len(texts)])[:args.prompt_tokens or None] for i in range(args.requests)]
        timers = Timers()
        instrument(engine, timers)
        for d in args.depths.split(","):
            depth = d if d == "auto" else int(d)
            opts = GenerateOptions(n_predict=args.n_predict, n_max=depth)
            closed_loop(engine, prompts[:args.streams], opts, args.streams, Timers())  # warm-up
            total = None
            for _ in range(args.repeats):
                r = closed_loop(engine, prompts, opts, args.streams, timers)
                if total is None:
                    total = r
                    continue
                total["rounds"] += r["rounds"]
                total["wall"] += r["wall"]
                total["cpu"] += r["cpu"]
                for label in r["timers"].wall:
                    total["timers"].wall[label] += r["timers"].wall[label]
                    total["timers"].cpu[label] += r["timers"].cpu[label]
                    total["timers"].calls[label] += r["timers"].calls[label]
            s = summarise(total, args.streams, depth)
            results.append(s)
            print(table(s), flush=True)
    if args.json:
        write_json(args.json, {"command": command_line(__file__, argv), "threads": args.threads,
                               "requests": args.requests, "n_predict": args.n_predict,
                               "prompt_tokens": args.prompt_tokens, "repeats": args.repeats, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
