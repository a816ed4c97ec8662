#!/usr/bin/env python3
"""Where the batched engine's time goes by kind of pass, at fixed depths and under ``auto``.

``auto`` prices a depth by its settled, timed passes only (runtime/batch.py, ``_plan_depths``):
not a prompt's pass, nor the decoding pass right after one (where a drafter first reads the
prompt's captured rows), nor the first pass of a new shape (a graph rebuilt, a drafter catching
up on plain steps). Where drafting is marginal, what those other passes cost decides whether
a depth wins. This runs the bundled code pair's workload of the concurrency benchmark (8 greedy
completions of 64 tokens on 96-token prompts, one engine of ``--streams`` sequences, ``-t 2``),
each depth of ``--depths`` in turn for ``--runs`` rounds, and sums every target pass's wall time
(from the end of the last decode to the end of its own, as the planner times it) by kind:
``prompt``, ``after-prompt``, ``new-shape``, ``settled``; per kind also the rows per sequence of
the decoding passes. Beside each depth's total: its tokens per second over the run. With
``--refits N``, also the first N choices of ``auto``'s pass planner in each run (the pass's
width, its incumbent, the depth its refit found best, and the costs and expected tokens the
refit went by); with ``--passes``, every pass in order (kind, rows per sequence, ms, the
target decode's own ms, whether the target captured rows for a drafter), and per depth the
settled passes' medians of those: the pass, its decode, the rest (the host's work between
decodes) and the share that captured. Depth
``0c`` is plain decoding whose every step reads its row for the drafter (captures the target's
hidden states), as the plain passes ``auto`` times while a drafting depth leads do. A probe:

    python -m scripts.investigate.pass_kinds --depths 0,4,auto --runs 5 --json kinds.json
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from pathlib import Path

from scripts.arguments import int_list, require_at_least
from scripts.recorded import command_line, write_json


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--depths", type=int_list(0, 15, ("auto", "0c")), default=(0, 4, "auto"),
                    help="comma-separated fixed depths, auto, and/or 0c (plain decoding that captures every row)")
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--refits", type=int, default=0, help="record the first N refits of auto's planner in each run")
    ap.add_argument("--passes", action="store_true", help="also keep every pass (kind, rows per sequence, ms) in the JSON")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    require_at_least(ap, args, streams=1, runs=1, threads=1)
    depths = list(args.depths)

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.batch import BatchEngine
    from laguna_dflash.runtime.engine import EngineConfig, GenerateOptions
    from laguna_dflash.runtime.llama import Model
    from laguna_dflash.runtime.open_pair import resolve_pair
    from laguna_dflash.runtime.tuner import DepthPolicy
    from scripts.bench.bench_concurrency import in_a_thread, run_batched

    class CapturingPlain(DepthPolicy):
        """Depth 0 every round with no plain stretch promised, so that each step's row is
        captured for the drafter."""

        def choose(self) -> int:
            return 0

    pair = resolve_pair(assets.TINY_TARGET, assets.converted_tiny_drafter())
    cfg = EngineConfig(n_ctx=1024, n_threads=args.threads, kv_type="f16", prompt_cache=False)
    texts = assets.read_prompts(assets.CODE_PROMPTS)
    target, drafter = Model(pair.target.path), Model(pair.drafter.path)
    prompts = [target.tokenize(texts[i % len(texts)])[:96] for i in range(8)]
    engine = BatchEngine(target, pair, cfg, n_seq=args.streams, drafter_model=drafter)

    passes: list[tuple[str, tuple[int, ...], float, float, bool]] = []
    # the last target decode's own wall time, and whether it captured rows for a drafter
    decode_seqs, last_decode = engine.ctx.decode_seqs, {"s": 0.0, "captured": False}

    def timed_decode(parts):
        t0 = time.perf_counter()
        try:
            return decode_seqs(parts)
        finally:
            last_decode.update(s=time.perf_counter() - t0, captured=bool(engine._captured))

    engine.ctx.decode_seqs = timed_decode
    # the planner's own verdict on each pass (its clock, timed, settled), and the pass's rows
    plan_depths, observe = engine._plan_depths, engine.planner.observe
    this_pass: dict = {}

    def recorded(rnd) -> None:
        this_pass.update(prompt=any(s.rows.prompt for s, _, _ in rnd.parts),
                         rows=tuple(len(t) for _, t, _ in rnd.parts))
        if engine.planner.stretch_left and engine._stretch_holds(rnd):
            # a pass of a plain stretch: the planner hears of it only at the stretch's end, so
            # it is kept here, on the planner's clock read just before the engine reads it
            passes.append(("settled", this_pass["rows"], time.perf_counter() - engine._t_pass,
                           last_decode["s"], last_decode["captured"]))
        plan_depths(rnd)

    def observed(depths, other_rows, seconds, timed=True, settled=True) -> None:
        kind = ("prompt" if this_pass["prompt"] else "after-prompt" if not timed
                else "new-shape" if not settled else "settled")
        passes.append((kind, this_pass["rows"], seconds, last_decode["s"], last_decode["captured"]))
        observe(depths, other_rows, seconds, timed=timed, settled=settled)

    engine._plan_depths, engine.planner.observe = recorded, observed
    refits: list[dict] = []
    if args.refits:
        from laguna_dflash.runtime.tuner.batch import PassDepth

        refit = PassDepth._refit

        def logged(pd: PassDepth) -> int:
            best = refit(pd)
            if len(refits) < args.refits:
                cost, tokens = pd.costs.estimates(), pd.expected_tokens()
                refits.append({"width": pd.n, "rounds": pd.rounds, "incumbent": pd.best, "refit_best": best,
                               "timed_rounds": {str(d): pd.costs.samples(d) for d in sorted(pd.costs.cost)},
                               "cost_ms": [round(1e3 * c, 3) for c in cost[:8]],
                               "expected_tokens": [round(e, 3) for e in tokens[:8]],
                               "settle_rounds": {"plain": pd.settle_rounds(True), "drafting": pd.settle_rounds(False)},
                               "after_change": {f"{'plain' if to_plain else 'drafting'} {place}": [round(x, 2) for x in r]
                                                for (to_plain, place), r in sorted(pd._settling.items())}})
            return best

        PassDepth._refit = logged
    per_depth: dict[str, list[dict]] = {str(d): [] for d in depths}
    for run in range(args.runs):
        for d in depths:
            passes.clear()
            refits.clear()
            engine._t_pass = time.perf_counter()  # the run's first pass is timed from its start
            # 0c: plain steps under a policy that promises no plain stretch, so that every step
            # captures its row for the drafter (FixedDepth(0) runs without the drafter at all)
            summary, _ = in_a_thread(run_batched, engine, prompts,
                                     GenerateOptions(n_predict=64, n_max=CapturingPlain() if d == "0c" else d),
                                     args.streams)
            kinds: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
            rows: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
            for kind, shape, sec, _, _ in passes:
                kinds[kind][0] += 1
                kinds[kind][1] += sec
                if kind != "prompt":
                    rows[kind][max(shape)] += 1
            per_depth[str(d)].append({
                "tokens_per_s": summary["aggregate"], "wall_s": summary["wall"],
                "kinds": {k: {"passes": n, "ms": 1e3 * s, "ms_per_pass": 1e3 * s / n} for k, (n, s) in kinds.items()},
                "rows_per_sequence": {k: dict(sorted(c.items())) for k, c in rows.items()},
                **({"refits": list(refits)} if refits else {}),
                **({"passes": [[kind, list(shape), round(1e3 * sec, 4), round(1e3 * dec, 4), captured]
                                for kind, shape, sec, dec, captured in passes],
                    "settled": settled_split(passes)} if args.passes else {})})
            for r in refits:
                print(f"  refit: width {r['width']}, round {r['rounds']}, incumbent {r['incumbent']} -> "
                      f"{r['refit_best']}; cost ms {r['cost_ms']}; tokens {r['expected_tokens']}", flush=True)
            k = per_depth[str(d)][-1]["kinds"]
            print(f"run {run + 1} depth {d}: {summary['aggregate']:.0f} tok/s; "
                  + ", ".join(f"{kind} {v['passes']} x {v['ms_per_pass']:.2f} ms" for kind, v in sorted(k.items())),
                  flush=True)
            sp = per_depth[str(d)][-1].get("settled", {"passes": 0})
            if sp["passes"]:  # none at a fixed drafting depth
                print(f"  settled plain passes: {sp['passes']}, median ms {sp['ms']}, decode {sp['decode_ms']}, "
                      f"rest {sp['rest_ms']}, captured {sp['captured_share']} (decode {sp['decode_ms_captured']} "
                      f"captured, {sp['decode_ms_not_captured']} not)", flush=True)
    engine.close()
    if args.refits:
        PassDepth._refit = refit
    if args.passes:  # the settled plain passes' medians over runs, run 1 (the probes) left out
        for d, runs in per_depth.items():
            later = [r["settled"] for r in runs[1:] or runs if r["settled"]["passes"]]
            if later:
                print(f"depth {d}, settled plain passes, median over runs 2-: "
                      + ", ".join(f"{k} {statistics.median(x for r in later if (x := r[k]) is not None):.4f}"
                                  for k in ("ms", "decode_ms", "rest_ms", "captured_share", "decode_ms_captured",
                                            "decode_ms_not_captured")
                                  if any(r[k] is not None for r in later)), flush=True)
    medians = {d: {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
                   "ms_by_kind": {kind: statistics.median(r["kinds"].get(kind, {"ms": 0.0})["ms"] for r in runs)
                                  for kind in ("prompt", "after-prompt", "new-shape", "settled")}}
               for d, runs in per_depth.items()}
    for d, m in medians.items():
        print(f"depth {d}: median {m['tokens_per_s']:.0f} tok/s; ms by kind (medians) "
              + ", ".join(f"{k} {v:.1f}" for k, v in m["ms_by_kind"].items()))
    if args.json:
        write_json(args.json, {"command": command_line(__file__, argv), "threads": args.threads,
                               "streams": args.streams, "runs": args.runs, "medians": medians, "per_run": per_depth})
    return 0


def settled_split(passes) -> dict:
    """The settled plain passes of every sequence (one row each): how many, and the medians of
    their wall time, their target decode's, and the rest, in ms; the share that captured."""
    plain = [(sec, dec, captured) for kind, shape, sec, dec, captured in passes
             if kind == "settled" and max(shape) == 1]
    if not plain:
        return {"passes": 0}
    med = lambda xs: round(1e3 * statistics.median(xs), 4) if xs else None  # noqa: E731
    return {"passes": len(plain), "ms": med([p[0] for p in plain]), "decode_ms": med([p[1] for p in plain]),
            "rest_ms": med([p[0] - p[1] for p in plain]),
            "captured_share": round(sum(p[2] for p in plain) / len(plain), 3),
            "decode_ms_captured": med([p[1] for p in plain if p[2]]),
            "decode_ms_not_captured": med([p[1] for p in plain if not p[2]])}


if __name__ == "__main__":
    raise SystemExit(main())
