#!/usr/bin/env python3
"""Speculation at long contexts: decode speed, acceptance and a round's cost split against the
context length, plain and at each depth, on a bundled pair (issue 32, item 3).

    python -m scripts.bench.bench_long_context --pair code --repeats 5 \\
        --json docs/results/long-context/long-context-code.json --png docs/results/long-context/long-context-code.png

A prompt of L tokens is standard-library code (sorted, the code pair's held-out modules left out)
ending with the first 384 tokens of a held-out module (one prompt per module of ``--tails``), so
every context length continues the same code; the engine (F32 cache, prompt cache on) prefills it
once per repetition (timed: prefill with the drafter's capture),
then generates ``--n-predict`` tokens greedily at depth 0 (plain) and at each depth of
``--depths`` (``auto``: the engine's one tuner, which carries what it learnt from context to
context as a server's does) from the cached prompt, so only decoding is timed. Contexts, and depths within a
context, run interleaved, ``--repeats`` rounds. Statistic (fixed before the run): per context and
depth the median over repetitions of decode tokens/s (all prompts' tokens over their time), with min-max; the speedup is the best depth's median over
plain's median, and the verdict is speedup(longest) / speedup(shortest) against issue 32's 0.9.
The split per round (draft, verify, the rest) is the median over repetitions of the per-round
means at each depth.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
from pathlib import Path

from scripts.arguments import int_list
from scripts.recorded import command_line, write_json


#: tokens of held-out code every prompt ends with, whatever its length: each context length
#: continues the same code, so acceptance differs only by what came before
TAIL = 384


def prompts_for(engine, n: int, n_tails: int) -> list[list[int]]:
    """``n_tails`` prompts of ``n`` tokens: stdlib code (sorted, held-out modules left out), then
    the first TAIL tokens of a held-out module."""
    from tests.helpers.stdlib_corpus import held_out_files, stdlib_dir

    held = held_out_files()
    filler: list[int] = []
    for p in sorted(p for p in stdlib_dir().glob("*.py") if p not in set(held)):
        filler += engine.tokenize(p.read_text(encoding="utf-8", errors="replace") + "\n\n", add_bos=not filler)
        if len(filler) >= n:
            break
    else:
        raise SystemExit(f"bench_long_context: the standard library holds fewer than {n} tokens")
    tails = [engine.tokenize(p.read_text(encoding="utf-8", errors="replace"), add_bos=False)[:TAIL] for p in held[:n_tails]]
    return [filler[:n - TAIL] + t for t in tails]


def open_engine(pair: str, n_ctx: int, threads: int):
    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.engine import Engine, EngineConfig

    target, drafter = assets.default_pair(None, pair)
    return Engine.load(target, drafter, EngineConfig(n_ctx=n_ctx, kv_type="f32", n_threads=threads))


def measure(engine, prompt: list[int], depth: int, n_predict: int) -> dict:
    from laguna_dflash.runtime.engine import GenerateOptions

    r = engine.generate(prompt, GenerateOptions(n_predict=n_predict, n_max=depth))
    s = r.stats
    return {"tokens": r.tokens, "generated": s.n_generated, "seconds": s.t_total, "cached": s.n_cached,
            "rounds": s.rounds, "accepted": s.accepted, "draft": s.t_draft, "verify": s.t_verify}


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def combine(ms: list[dict]) -> dict:
    """One repetition's runs of one context and depth (one per prompt) as one measurement."""
    tot = {k: sum(m[k] for m in ms) for k in ("generated", "seconds", "rounds", "accepted", "draft", "verify")}
    rounds = max(tot["rounds"], 1)
    return {"tokens_per_s": tot["generated"] / tot["seconds"], "accepted_per_round": tot["accepted"] / rounds,
            "draft_ms": 1e3 * tot["draft"] / rounds, "verify_ms": 1e3 * tot["verify"] / rounds,
            "rest_ms": 1e3 * (tot["seconds"] - tot["draft"] - tot["verify"]) / rounds,
            "diverged_at": [m["diverged_at"] for m in ms]}


def spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main(argv=None) -> int:
    from rich.progress import Progress

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="code", choices=("code", "agent"), help="bundled pair (default: %(default)s)")
    ap.add_argument("--contexts", type=int_list(TAIL + 1, 1 << 20), default=(1024, 8192, 16384, 32768),
                    help="context lengths, tokens")
    ap.add_argument("--depths", type=int_list(1, 15, words=("auto",)), default=(2, 4, 8),
                    help="speculative depths, 'auto' among them for the tuner (plain decoding always runs)")
    ap.add_argument("--n-predict", type=int, default=96,
                    help="tokens per run; more than the sliding window (128 on the bundled pairs) and the next "
                         "run cannot take the prompt from the cache")
    ap.add_argument("--tails", type=int, default=2, help="prompts per context (held-out modules they end with)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path)
    args = ap.parse_args(argv)
    contexts = list(args.contexts)
    depths: list[int | str] = [0, *args.depths]
    fixed = [d for d in depths[1:] if d != "auto"]
    if not fixed:
        ap.error("--depths: at least one fixed depth besides auto")
    from tests.helpers.stdlib_corpus import held_out_files

    if not 1 <= args.tails <= len(held_out_files()):
        ap.error(f"--tails: 1..{len(held_out_files())} (the held-out modules), found {args.tails}")

    from laguna_dflash.runtime.engine import GenerateOptions

    runs: dict[tuple[int, int], list[dict]] = {(L, d): [] for L in contexts for d in depths}
    prefill: dict[int, list[float]] = {L: [] for L in contexts}
    with open_engine(args.pair, max(contexts) + args.n_predict + 64, args.threads) as engine, Progress() as prog:
        prompts = {L: prompts_for(engine, L, args.tails) for L in contexts}
        task = prog.add_task("long contexts", total=args.repeats * len(contexts) * len(depths) * args.tails)
        for rep in range(args.repeats):
            for L in contexts:
                this_rep: dict[int, list[dict]] = {d: [] for d in depths}
                for prompt in prompts[L]:
                    engine.reset()
                    # a one-token run prefills the context with the drafter capturing it
                    r = engine.generate(prompt, GenerateOptions(n_predict=1, n_max=max(fixed)))
                    prefill[L].append(r.stats.t_prefill)
                    order = depths if rep % 2 == 0 else depths[::-1]
                    done = {}
                    for d in order:
                        m = done[d] = measure(engine, prompt, d, args.n_predict)
                        if m["cached"] < L - 1:
                            raise SystemExit(f"context {L}, depth {d}: only {m['cached']} prompt tokens came from the cache")
                        prog.advance(task)
                    for d in depths:
                        done[d]["diverged_at"] = first_difference(done[d]["tokens"], done[0]["tokens"])
                    for d in depths:
                        this_rep[d].append(done[d])
                for d in depths:
                    runs[(L, d)].append(combine(this_rep[d]))

    table = []
    for L in contexts:
        plain = statistics.median(m["tokens_per_s"] for m in runs[(L, 0)])
        row = {"context": L, "prefill_s": spread(prefill[L]), "prefill_tokens_per_s": L / statistics.median(prefill[L]),
               "depths": {}}
        for d in depths:
            ms = runs[(L, d)]
            row["depths"][d] = {"tokens_per_s": spread([m["tokens_per_s"] for m in ms]),
                                "speedup": statistics.median(m["tokens_per_s"] for m in ms) / plain,
                                "accepted_per_round": statistics.median(m["accepted_per_round"] for m in ms),
                                **{k: statistics.median(m[k] for m in ms) for k in ("draft_ms", "verify_ms", "rest_ms")},
                                "diverged_at": [m["diverged_at"] for m in ms]}
        best = max(fixed, key=lambda d: row["depths"][d]["speedup"])
        row["best_depth"], row["best_speedup"] = best, row["depths"][best]["speedup"]
        table.append(row)
    verdict = table[-1]["best_speedup"] / table[0]["best_speedup"]

    print(f"pair {args.pair}; {args.repeats} interleaved repetitions; medians (min-max)")
    print("context  prefill s      plain tok/s          best  speedup  accepted/round  draft/verify/rest ms per round (best)")
    for row in table:
        p, b = row["depths"][0], row["depths"][row["best_depth"]]
        print(f"{row['context']:>7}  {row['prefill_s']['median']:6.2f}  {p['tokens_per_s']['median']:7.1f} "
              f"({p['tokens_per_s']['min']:.0f}-{p['tokens_per_s']['max']:.0f})  d{row['best_depth']:<3} "
              f"{row['best_speedup']:6.2f}x  {b['accepted_per_round']:6.2f}  "
              f"{b['draft_ms']:.2f}/{b['verify_ms']:.2f}/{b['rest_ms']:.2f}"
              + (f"  auto {row['depths']['auto']['speedup']:.2f}x" if "auto" in row["depths"] else ""))
    print(f"speedup at {contexts[-1]} / speedup at {contexts[0]}: {verdict:.2f} (issue 32's bar: >= 0.9)")
    diverged = sorted({(row["context"], str(d)) for row in table for d in depths
                       if any(i is not None for rep in row["depths"][d]["diverged_at"] for i in rep)})
    if diverged:
        print(f"output differed from the same repetition's plain run (context, depth): {diverged}; each run starts "
              "from the cache the run before left, whose cell order changes the last bits (docs/results/long-context/README.md)")

    result = {"command": command_line(__file__, argv), "pair": args.pair, "repeats": args.repeats,
              "n_predict": args.n_predict, "threads": args.threads, "machine": f"{platform.machine()}",
              "table": table, "speedup_ratio_longest_to_shortest": verdict}
    if args.json:
        write_json(args.json, result, indent=1)
    if args.png:
        plot(table, depths, args.png, args.pair)
    return 0


def plot(table: list[dict], depths: list, path: Path, pair: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    xs = [r["context"] for r in table]
    for d in depths:
        a.plot(xs, [r["depths"][d]["tokens_per_s"]["median"] for r in table], marker="o",
               label="plain" if d == 0 else "auto" if d == "auto" else f"depth {d}")
    a.set(xscale="log", xlabel="context, tokens", ylabel="decode tokens/s (median)", title=f"{pair} pair")
    a.legend()
    d = max(d for d in depths if d != "auto")
    parts = ("draft_ms", "verify_ms", "rest_ms")
    bottom = [0.0] * len(xs)
    for part in parts:
        vals = [r["depths"][d][part] for r in table]
        b.bar([str(x) for x in xs], vals, bottom=bottom, label=part.replace("_ms", ""))
        bottom = [u + v for u, v in zip(bottom, vals)]
    b.set(xlabel="context, tokens", ylabel=f"ms per round at depth {d}", title="where a round's time goes")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
