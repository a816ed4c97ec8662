#!/usr/bin/env python3
"""A/B of two runtime trees in one process: this checkout's ``runtime`` (B) against another
checkout's (A), on the same model files, interleaved generation by generation.

    git worktree add --detach /tmp/base main
    .venv/bin/python -m scripts.bench.bench_host_ab --a /tmp/base -t 1 --depths 0,4 --repeats 5
    .venv/bin/python -m scripts.bench.bench_host_ab --a-cfg n_ubatch=512 --b-cfg n_ubatch=128   # two settings

Both engines load the same GGUFs; every prompt runs A then B (then B then A on the next
repeat, so neither always goes first) at each depth. Reported per side and depth, over all
generations: median / min / max tokens/s (wall), and the median CPU time of the calling thread
per generated token (the prompt's prefill included, the same on both sides). On a machine shared with other jobs wall time swells with every
preemption; with ``-t 1`` the calling thread does all the work, so its CPU time per token is
the steadier figure. The statistic is fixed before the run: medians, B/A ratio of medians.
Greedy outputs of A and B are compared token for token (``same``).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

from scripts.recorded import write_json


def load_runtime(root: Path, name: str):
    """Import root/runtime as package ``name`` (its imports are relative, so both coexist)."""
    spec = importlib.util.spec_from_file_location(name, root / "runtime" / "__init__.py",
                                                  submodule_search_locations=[str(root / "runtime")])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return importlib.import_module(f"{name}.engine")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, help="checkout whose runtime/ is side A (default: this one)")
    ap.add_argument("--a-cfg", default="", help="EngineConfig fields for side A, e.g. n_ubatch=512,kv_type=f32")
    ap.add_argument("--b-cfg", default="", help="the same for side B")
    ap.add_argument("-m", "--model", type=Path)
    ap.add_argument("-md", "--model-draft", type=Path)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=5, help="first N code prompts")
    ap.add_argument("--depths", default="0,4")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kv", default="f16")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    import laguna_dflash.runtime.engine as eng_b
    from laguna_dflash.runtime import assets

    target, drafter = assets.default_pair(args.model_draft) if args.model is None else (args.model, args.model_draft)
    eng_a = load_runtime(args.a.resolve(), "runtime_a") if args.a else eng_b
    engines = {}
    for side, mod, extra in (("A", eng_a, args.a_cfg), ("B", eng_b, args.b_cfg)):
        cfg = mod.EngineConfig(n_threads=args.threads, kv_type=args.kv)
        for item in filter(None, extra.split(",")):
            key, value = item.split("=")
            setattr(cfg, key, type(getattr(cfg, key))(value) if getattr(cfg, key) is not None else int(value))
        engines[side] = (mod, mod.Engine.load(target, drafter, cfg))
    prompts = [engines["B"][1].tokenize(p) for p in assets.read_prompts(assets.CODE_PROMPTS)[:args.prompts]]
    depths = [int(d) for d in args.depths.split(",")]
    for mod, e in engines.values():  # warm-up: graph reservation, cold caches
        for d in depths:
            e.generate(prompts[0], mod.GenerateOptions(n_predict=8, n_max=d))
    tps: dict = {}
    cpu_per_tok: dict = {}
    outputs: dict = {}
    for r in range(args.repeats):
        order = ("A", "B") if r % 2 == 0 else ("B", "A")
        for i, p in enumerate(prompts):
            for d in depths:
                for side in order:
                    mod, e = engines[side]
                    c0 = time.thread_time()
                    res = e.generate(p, mod.GenerateOptions(n_predict=args.n_predict, n_max=d))
                    c1 = time.thread_time()
                    tps.setdefault((side, d), []).append(res.stats.tokens_per_s)
                    # prefill included: the same prompt, the same prefill code on both sides
                    cpu_per_tok.setdefault((side, d), []).append((c1 - c0) / res.stats.n_generated)
                    outputs.setdefault((side, d, i), res.tokens)
        print(f"repeat {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    rows = []
    print(f"{'depth':>5s} {'side':>4s} {'tok/s median':>12s} {'min':>7s} {'max':>7s} {'cpu ms/tok':>10s} {'same':>5s}")
    for d in depths:
        med = {}
        for side in ("A", "B"):
            v = tps[(side, d)]
            c = statistics.median(cpu_per_tok[(side, d)]) * 1e3
            med[side] = (statistics.median(v), c)
            same = all(outputs[("A", d, i)] == outputs[("B", d, i)] for i in range(len(prompts)))
            print(f"{d:5d} {side:>4s} {statistics.median(v):12.1f} {min(v):7.1f} {max(v):7.1f} {c:10.3f} {str(same):>5s}")
            rows.append({"depth": d, "side": side, "tokens_per_s": v, "cpu_s_per_token": cpu_per_tok[(side, d)],
                         "same_tokens_as_other_side": same})
        print(f"{d:5d}  B/A {med['B'][0] / med['A'][0]:12.3f} {'':7s} {'':7s} {med['B'][1] / med['A'][1]:10.3f}")
    if args.json:
        write_json(args.json, {"command": " ".join(sys.argv), "rows": rows}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
