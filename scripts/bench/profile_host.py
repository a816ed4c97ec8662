#!/usr/bin/env python3
"""Where a plain step and a speculative round spend their time, host side and inside llama.cpp.

    .venv/bin/python -m scripts.bench.profile_host                         # tiny pair, 5 code prompts, -t 2
    .venv/bin/python -m scripts.bench.profile_host --threads 1 --long 6400 # one ~6.4k-token prompt
    .venv/bin/python -m scripts.bench.profile_host -m TARGET.gguf -md DRAFTER.gguf --n-predict 32

It wraps the engine's calls (``llama_decode``, batch filling, logits, sampling, stop checks,
capture, drafting, injection, the depth policy) with timers that keep each call's *exclusive*
time (its own, minus the wrapped calls inside it), in wall time and in the calling thread's
CPU time. On a machine shared by many processes the wall time of host work swells with every
preemption; its CPU time does not, so the CPU column is the one to compare host work by. What
no wrapper covers is the round loop's own Python (``loop``). Graph reuse comes from
``llama_perf_context`` (how many decodes reused the previous graph).

The timers cost about a microsecond per call; the table is per plain step / per round.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from scripts.arguments import int_list
from scripts.recorded import write_json


class Timers:
    """Exclusive wall and thread-CPU time per label, for nested wrapped calls."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._stack: list[list[float]] = []  # per open call: [child wall, child cpu]

    def wrap(self, label: str, fn):
        wall, cpu, calls, stack = self.wall, self.cpu, self.calls, self._stack
        pc, tt = time.perf_counter, time.thread_time

        @functools.wraps(fn)
        def timed(*a, **k):
            stack.append([0.0, 0.0])
            w0, c0 = pc(), tt()
            try:
                return fn(*a, **k)
            finally:
                dw, dc = pc() - w0, tt() - c0
                child = stack.pop()
                wall[label] += dw - child[0]
                cpu[label] += dc - child[1]
                calls[label] += 1
                if stack:
                    stack[-1][0] += dw
                    stack[-1][1] += dc
        return timed

    def reset(self) -> None:
        self.wall.clear(), self.cpu.clear(), self.calls.clear()


def instrument(engine, timers: Timers, decode_only: bool = False) -> None:
    import llama_cpp.llama_cpp as ll

    import laguna_dflash.runtime.drafter as rdrafter
    import laguna_dflash.runtime.engine as rengine
    import laguna_dflash.runtime.llama as rllama
    import laguna_dflash.runtime.sampling as rsampling

    t = timers
    # C calls first (module attributes the runtime looks up at call time)
    for name in ("llama_get_logits_ith", "llama_memory_seq_rm"):
        setattr(rllama.ll, name, t.wrap(f"C {name}", getattr(ll, name)))
    t_ctx = {id(engine.ctx): "target", id(engine.drafter.ctx) if engine.drafter else -1: "drafter"}
    ptrs = {engine.ctx.ptr.value if hasattr(engine.ctx.ptr, "value") else engine.ctx.ptr: "target"}
    if engine.drafter:
        d = engine.drafter.ctx.ptr
        ptrs[d.value if hasattr(d, "value") else d] = "drafter"
    decode = ll.llama_decode
    by_shape = {}

    def llama_decode(ctx, batch):
        n = batch.n_tokens
        key = (ptrs.get(ctx.value if hasattr(ctx, "value") else ctx, "other"), n if n <= 16 else "prefill")
        w = by_shape.get(key)
        if w is None:
            w = by_shape[key] = t.wrap(f"C llama_decode [{key[0]}, {key[1]} rows]", decode)
        return w(ctx, batch)
    rllama.ll.llama_decode = llama_decode
    import laguna_dflash.runtime.rounds as rrounds

    def wrap_where_defined(name: str, label: str) -> None:
        # a function of the round loop now, a method of the engine before
        for owner in (rrounds, rengine.Engine):
            if name in vars(owner):
                setattr(owner, name, t.wrap(label, vars(owner)[name]))

    wrap_where_defined("_prefill", "prefill (its Python)")  # kept out of the rounds' host work
    if decode_only:  # one wrapper per decode: what is left of a round is host work, barely perturbed
        return

    def per_ctx(label, fn):
        wrapped = {}

        @functools.wraps(fn)
        def call(self, *a, **k):
            who = t_ctx.get(id(self), "other")
            w = wrapped.get(who)
            if w is None:
                w = wrapped[who] = t.wrap(f"{label} [{who}]", fn)
            return w(self, *a, **k)
        return call

    # names of older and newer runtimes alike: the same script profiles both
    C = rllama.Context
    for name in ("decode", "step", "decode_block", "decode_embd", "decode_embd_rows", "embd_rows", "logits_view",
                 "logits_block", "logits_rows", "seq_rm", "capture_into", "capture", "capture_view", "set_capture"):
        if name in C.__dict__:
            setattr(C, name, per_ctx(f"Context.{name}", C.__dict__[name]))
    D = rdrafter.Drafter
    for name in ("draft", "inject", "inject_visible", "inject_captured", "captured_features", "skip_context",
                 "queue_row", "flush_pending", "skip_pending"):
        if name in D.__dict__:
            setattr(D, name, t.wrap(f"Drafter.{name}", D.__dict__[name]))
    S = rsampling.Sampler
    for name in ("sample", "accept"):
        if name in S.__dict__:
            setattr(S, name, t.wrap(f"Sampler.{name}", S.__dict__[name]))
    wrap_where_defined("_stop_check", "stop check")
    import laguna_dflash.runtime.tuner as rtuner

    for cls in (rtuner.FixedDepth, rtuner.AutoDepth):
        for name in ("choose", "observe", "plain_rounds_ahead", "decision"):
            if name in cls.__dict__:
                setattr(cls, name, t.wrap(f"policy.{name}", cls.__dict__[name]))
    rengine.Stats.record_round = t.wrap("Stats.record_round", rengine.Stats.record_round)


def n_reused(ctx) -> int:
    import llama_cpp.llama_cpp as ll

    return int(ll.llama_perf_context(ctx.ptr).n_reused)


def profile(engine, prompts, depth, n_predict, timers: Timers, repeats: int) -> dict:
    from laguna_dflash.runtime.engine import GenerateOptions

    engine.generate(prompts[0], GenerateOptions(n_predict=8, n_max=depth))  # warm-up
    timers.reset()
    r0 = n_reused(engine.ctx)
    rd0 = n_reused(engine.drafter.ctx) if engine.drafter else 0
    wall = cpu = 0.0
    rounds = tokens = 0
    tps = []
    for _ in range(repeats):
        for p in prompts:
            # the generation phase only: prefill is timed and then subtracted below
            w0, c0 = time.perf_counter(), time.thread_time()
            res = engine.generate(p, GenerateOptions(n_predict=n_predict, n_max=depth))
            w1, c1 = time.perf_counter(), time.thread_time()
            wall += w1 - w0
            cpu += c1 - c0
            rounds += res.stats.rounds
            tokens += res.stats.n_generated
            tps.append(res.stats.tokens_per_s)
    n_decode_target = sum(v for k, v in timers.calls.items() if k.startswith("C llama_decode [target"))
    out = {"depth": depth, "rounds": rounds, "tokens": tokens, "tokens_per_s_median": statistics.median(tps),
           "tokens_per_s_min": min(tps), "tokens_per_s_max": max(tps),
           "reused_target": n_reused(engine.ctx) - r0,
           "reused_drafter": (n_reused(engine.drafter.ctx) - rd0) if engine.drafter else 0,
           "calls": dict(timers.calls), "wall": dict(timers.wall), "cpu": dict(timers.cpu),
           "total_wall": wall, "total_cpu": cpu, "n_llama_decode": n_decode_target}
    return out


def table(res: dict) -> str:
    """Per round (plain step at depth 0), exclusive times in microseconds."""
    n = res["rounds"]
    rows = []
    covered_w = covered_c = 0.0
    for label in sorted(res["wall"], key=lambda k: -res["cpu"][k]):
        w, c = res["wall"][label], res["cpu"][label]
        covered_w += w
        covered_c += c
        rows.append((label, res["calls"][label] / n, w / n * 1e6, c / n * 1e6))
    lines = [f"depth {res['depth']}: {n} rounds, {res['tokens']} tokens, median {res['tokens_per_s_median']:.0f} tok/s "
             f"(min {res['tokens_per_s_min']:.0f}, max {res['tokens_per_s_max']:.0f}); graphs reused: target "
             f"{res['reused_target']}, drafter {res['reused_drafter']} of {res['n_llama_decode']} decodes",
             f"  {'what':42s} {'calls/round':>11s} {'wall us':>9s} {'cpu us':>9s}"]
    for label, calls, w, c in rows:
        lines.append(f"  {label:42s} {calls:11.2f} {w:9.1f} {c:9.1f}")
    lines.append(f"  {'loop (unwrapped Python)':42s} {'':11s} {(res['total_wall'] - covered_w) / n * 1e6:9.1f} "
                 f"{(res['total_cpu'] - covered_c) / n * 1e6:9.1f}")
    # what a round costs outside llama.cpp: everything but the decodes and the prompt's own work
    skip = [k for k in res["wall"] if k.startswith("C llama_decode") or k.startswith("Engine._prefill")]
    host_w = res["total_wall"] - sum(res["wall"][k] for k in skip)
    host_c = res["total_cpu"] - sum(res["cpu"][k] for k in skip)
    lines.append(f"  {'host per round (all but decodes, prefill)':42s} {'':11s} {host_w / n * 1e6:9.1f} {host_c / n * 1e6:9.1f}")
    lines.append(f"  {'total per round':42s} {'':11s} {res['total_wall'] / n * 1e6:9.1f} {res['total_cpu'] / n * 1e6:9.1f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", type=Path)
    ap.add_argument("-md", "--model-draft", type=Path)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=5, help="first N code prompts")
    ap.add_argument("--long", type=int, default=0, help="instead: one prompt of this many tokens (argparse.py)")
    ap.add_argument("--depths", type=int_list(0, 15, ("auto",)), default=(0, 4),
                    help="comma-separated depths, or auto")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--kv", default="f16")
    ap.add_argument("--decode-only", action="store_true",
                    help="time llama_decode alone; the rest of each round is reported as host work")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.engine import Engine, EngineConfig

    target, drafter = assets.default_pair(args.model_draft) if args.model is None else (args.model, args.model_draft)
    n_ctx = max(4096, args.long + args.n_predict + 64)
    engine = Engine.load(target, drafter, EngineConfig(n_ctx=n_ctx, n_threads=args.threads, kv_type=args.kv))
    if args.long:
        import argparse as _argparse_module

        text = Path(_argparse_module.__file__).read_text()
        prompts = [engine.tokenize(text)[:args.long]]
    else:
        # token ids, so that tokenizing is not in the profile
        prompts = [engine.tokenize(p) for p in assets.read_prompts(assets.CODE_PROMPTS)[:args.prompts]]
    timers = Timers()
    instrument(engine, timers, args.decode_only)
    results = []
    for depth in args.depths:
        res = profile(engine, prompts, depth, args.n_predict, timers, args.repeats)
        results.append(res)
        print(table(res), flush=True)
    if args.json:
        write_json(args.json, {"args": vars(args) | {"model": str(target), "model_draft": str(drafter)},
                               "results": results}, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
