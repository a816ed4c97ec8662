#!/usr/bin/env python3
"""4-6-bit drafters (q6_k, q5_k_m, q4_k_m, q4_0) against Q8_0, on the tiny pair and at XS 2.1 widths.

    .venv/bin/python -m scripts.bench.bench_lowbit --json docs/results/lowbit/lowbit.json --png docs/results/lowbit/lowbit.png
    .venv/bin/python -m scripts.bench.bench_lowbit --part tiny --repeats 5
    .venv/bin/python -m scripts.bench.bench_lowbit --from-json docs/results/lowbit/lowbit.json --png docs/results/lowbit/lowbit.png   # tables/chart only

**Tiny pair** (the bundled laguna-tiny target and its drafter, converted here with
``laguna-gguf convert --outtype T`` for T in q8_0 and the 4-6-bit types): one process, one target
model, one engine per drafter. A repetition runs every prompt (the first ``--prompts`` of
``runtime/data/prompts/code.txt``) under every configuration (plain decoding, and each drafter at each
``--depths``), the configurations in a fresh random order for each prompt. Greedy decoding.

**XS 2.1 widths** (random weights; acceptance cannot be measured there): the cost-model harness's
random XS 2.1 drafter checkpoint (``scripts/bench/bench_cost_model.py``'s ``build``, same shapes and
seed) is written again and converted to Q8_0 and to each 4-6-bit type, against a target built by
the harness's own code: with ``--xs-target light`` (default) its 5-layer random target with 8
experts per MoE layer instead of 256 (a draft pass reads only the target's token embeddings and
output head, which are the same tensors, types and widths; 0.5 GB instead of 6.8 GB, and it
builds where the full one takes hours on a loaded machine), with ``--xs-target harness`` the
harness's cached models themselves (the Q8_0 file is then checked against the harness's, and a
decode step of its 2- and 5-layer targets is timed in every item, for the cost model's 40-layer
extrapolation). Every drafter holds ``--context`` injected context rows; an item times, in a
random order, one draft pass over ``[bonus, MASK * k]`` of every drafter (as the harness's
``Bench.time_draft``): the pass times of all the drafters at one depth, side by side.

The statistics, fixed before any run:

* tiny, tokens/s of a configuration in a repetition = its generated tokens over its generation
  seconds (prefill excluded), summed over the prompts; reported: the median over repetitions of
  the per-repetition ratio to Q8_0 at the same depth (and to plain decoding), with min and max.
  Acceptance per depth: accepted drafts per round and accepted / drafted, over all prompts (greedy
  decoding is deterministic; the JSON says whether every repetition gave the same tokens);
* XS, per depth: the median over items of the ratio of a drafter's pass time to Q8_0's pass time
  in the same item, with min and max; the median pass time in ms; file sizes; with the harness's
  targets also the median of pass time over the 40-layer decode step (``T40 = c + 39 m``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np


from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from laguna_dflash.convert.quantize import OutType  # noqa: E402
from scripts.arguments import int_list
from scripts.recorded import command_line, write_json

console = Console(width=None if sys.stdout.isatty() else 160)

REFERENCE = OutType.Q8_0
LOWBIT = (OutType.Q6_K, OutType.Q5_K_M, OutType.Q4_K_M, OutType.Q4_0)
TYPES = (REFERENCE, *LOWBIT)


def cache_root() -> Path:
    base = os.environ.get("LAGUNA_DFLASH_CACHE") or str(Path.home() / ".cache" / "laguna-dflash")
    return Path(base) / "lowbit"


def summary(xs: list[float]) -> dict:
    return {"median": float(statistics.median(xs)), "min": float(min(xs)), "max": float(max(xs)), "n": len(xs)}


def machine() -> dict:
    return {"nproc": os.cpu_count(), "loadavg": list(os.getloadavg())}


def tensor_types(path: Path) -> dict[str, str]:
    from gguf import GGMLQuantizationType, GGUFReader

    return {t.name: GGMLQuantizationType(t.tensor_type).name for t in GGUFReader(path).tensors}


def convert_all(source: Path, target: Path, work: Path, tag: str, reuse: bool = False) -> dict[OutType, dict]:
    """``source`` converted to every type of TYPES with the CLI's code path; size, types, seconds
    (None for a file of an earlier run, kept when ``reuse``)."""
    from laguna_dflash.convert.converter import convert
    from laguna_dflash.convert.target import read_target

    tgt = read_target(target)
    out = {}
    for t in TYPES:
        path = work / f"{tag}-{t.value}.gguf"
        seconds = None
        if not (reuse and path.exists()):
            path.unlink(missing_ok=True)
            t0 = time.perf_counter()
            convert(source, tgt, path, t)
            seconds = time.perf_counter() - t0
        out[t] = {"path": path, "seconds": seconds, "bytes": path.stat().st_size, "types": tensor_types(path)}
        took = "kept from an earlier run" if seconds is None else f"converted in {seconds:.1f} s"
        console.print(f"  {path.name}: {out[t]['bytes'] / 2**20:.2f} MiB, {took}")
    return out


# ----------------------------------------------------------------------------- tiny pair

def run_tiny(args, work: Path) -> dict:
    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions
    from laguna_dflash.runtime.llama import Model

    console.print("[bold]tiny pair[/]: converting the bundled drafter")
    files = convert_all(assets.TINY_DRAFTER_HF, assets.TINY_TARGET, work, "tiny")
    prompts = assets.read_prompts(assets.CODE_PROMPTS)[:args.prompts]
    configs = [("plain", 0)] + [(t.value, k) for t in TYPES for k in args.depths]
    rng = random.Random(args.seed)
    per_rep: list[dict] = []  # repetition -> config -> sums
    outputs: dict[str, list] = {}
    same_everywhere = True
    with Model(assets.TINY_TARGET) as target:
        engines = {t.value: Engine(target, files[t]["path"], EngineConfig(n_ctx=2048, n_threads=args.threads))
                   for t in TYPES}
        try:
            def engine_of(name: str):
                return engines[REFERENCE.value if name == "plain" else name]

            for name, k in configs:  # warm-up: graph reservation, cold caches
                engine_of(name).generate(prompts[0][:200], GenerateOptions(n_predict=8, n_max=k))
            t_start = time.perf_counter()
            for rep in range(args.repeats):
                sums = {f"{n}:{k}": {"tokens": 0, "seconds": 0.0, "rounds": 0, "drafted": 0, "accepted": 0,
                                     "accepted_at": [0] * 15, "drafted_at": [0] * 15} for n, k in configs}
                for ip, prompt in enumerate(prompts):
                    order = list(configs)
                    rng.shuffle(order)
                    for name, k in order:
                        res = engine_of(name).generate(prompt, GenerateOptions(n_predict=args.n_predict, n_max=k))
                        key = f"{name}:{k}"
                        s, st = sums[key], res.stats
                        s["tokens"] += st.n_generated
                        s["seconds"] += st.t_total
                        s["rounds"] += st.rounds
                        s["drafted"] += st.drafted
                        s["accepted"] += st.accepted
                        for i, (a, d) in enumerate(zip(st.accepted_at, st.drafted_at)):
                            s["accepted_at"][i] += a
                            s["drafted_at"][i] += d
                        seen = outputs.setdefault(key, [None] * len(prompts))
                        if seen[ip] is None:
                            seen[ip] = res.tokens
                        elif seen[ip] != res.tokens:
                            same_everywhere = False
                per_rep.append(sums)
                console.print(f"  repetition {rep + 1}/{args.repeats} done "
                              f"({time.perf_counter() - t_start:.0f} s, load {os.getloadavg()[0]:.1f})")
        finally:
            for e in engines.values():
                e.close()

    plain = outputs["plain:0"]
    rows = {}
    for t in TYPES:
        for k in args.depths:
            key = f"{t.value}:{k}"
            first = per_rep[0][key]
            tps = [r[key]["tokens"] / r[key]["seconds"] for r in per_rep]
            rows[key] = {
                "type": t.value, "depth": k,
                "mean_accepted_per_round": first["accepted"] / first["rounds"],
                "acceptance_rate": first["accepted"] / first["drafted"] if first["drafted"] else 0.0,
                "acceptance_by_position": [a / d for a, d in zip(first["accepted_at"], first["drafted_at"]) if d],
                "exact_prompts": sum(o == p for o, p in zip(outputs[key], plain)),
                "tokens_per_s": summary(tps),
                "vs_q8_0": summary([r[key]["tokens"] / r[key]["seconds"]
                                    / (r[f"{REFERENCE.value}:{k}"]["tokens"] / r[f"{REFERENCE.value}:{k}"]["seconds"])
                                    for r in per_rep]),
                "vs_plain": summary([r[key]["tokens"] / r[key]["seconds"]
                                     / (r["plain:0"]["tokens"] / r["plain:0"]["seconds"]) for r in per_rep]),
            }
    return {
        "settings": {"repeats": args.repeats, "prompts": len(prompts), "n_predict": args.n_predict,
                     "depths": list(args.depths), "threads": args.threads, "kv_type": "f16", "seed": args.seed},
        "files": {t.value: {k: (str(v) if k == "path" else v) for k, v in files[t].items()} for t in TYPES},
        "plain_tokens_per_s": summary([r["plain:0"]["tokens"] / r["plain:0"]["seconds"] for r in per_rep]),
        "rows": rows,
        "deterministic": same_everywhere,
        "per_repetition": per_rep,
    }


# ----------------------------------------------------------------------------- XS widths

def light_host(cm, work: Path, seed: int) -> Path:
    """The harness's 5-layer random target with 8 experts per MoE layer instead of 256, quantised
    by the harness's own Q4_K_M step. A draft pass reads the target's token embeddings and output
    head only (the same tensors, types and widths as the harness's), never its layers, so its time
    is the same; the file is a fifth of the size and builds in a fraction of the time."""
    path = work / f"xs-host-8-experts-seed{seed}-Q4_K_M.gguf"
    if path.exists():
        return path
    f16 = path.with_name(path.name.replace("Q4_K_M", "F16"))
    saved = cm.N_EXPERT
    cm.N_EXPERT = cm.N_USED
    try:
        cm.write_target_f16(f16, cm.N_LAYERS_BUILT, seed)
        cm.quantize_q4_k_m(f16, path, os.cpu_count() or 1)
    finally:
        cm.N_EXPERT = saved
        f16.unlink(missing_ok=True)
    return path


def run_xs(args, work: Path) -> dict:
    from scripts.tuning import cost_model as cm

    from tests.helpers.synthetic import XS_2_1, write_drafter
    from laguna_dflash.runtime.drafter import Drafter
    from laguna_dflash.runtime.llama import Context, ContextParams, Model

    xs_dir = work / f"xs-seed{args.seed}"
    xs_dir.mkdir(parents=True, exist_ok=True)
    if args.xs_target == "harness":
        console.print("[bold]XS 2.1 widths[/]: the cost-model harness's models (built once, cached)")
        art = cm.build(cm.cache_root(), args.seed, args.threads, False)
        host, variants = art.targets[("random", cm.N_LAYERS_BUILT)], cm.VARIANTS
    else:
        console.print("[bold]XS 2.1 widths[/]: the harness's target with 8 experts (built once, cached)")
        art, host, variants = None, light_host(cm, xs_dir, args.seed), ()
    ckpt = xs_dir / "drafter"
    if not (ckpt / "model.safetensors").exists():
        shutil.rmtree(ckpt, ignore_errors=True)
        shapes = {**XS_2_1, "num_target_layers": cm.N_LAYERS_BUILT, "target_layer_ids": tuple(range(cm.N_LAYERS_BUILT))}
        # the harness's own drafter checkpoint (bench_cost_model.build), written again: it keeps only the Q8_0 file
        write_drafter(ckpt, **shapes, dtype="bf16", seed=args.seed, name_or_path="random/Laguna-XS-2.1-DFlash-shapes")
    console.print("  converting the XS drafter")
    files = convert_all(ckpt, host, xs_dir, "xs", reuse=not args.reconvert)
    same_as_harness = same_tensors(files[REFERENCE]["path"], art.drafter) if art else None

    P, threads, n_batch = args.context, args.threads, args.n_batch
    rng = np.random.default_rng(1)
    prompt = rng.integers(300, cm.VOCAB, P).tolist()
    context_feats = rng.standard_normal((P, cm.N_LAYERS_BUILT * cm.HIDDEN), dtype=np.float32)
    models, ctxs, drafters = {}, {}, {}
    samples: dict[str, list[float]] = {}
    try:
        for n in variants or (cm.N_LAYERS_BUILT,):
            models[n] = Model(art.targets[("random", n)] if art else host)
            ctxs[n] = Context(models[n], ContextParams(n_ctx=P + 160, n_batch=n_batch, n_ubatch=n_batch,
                                                       n_threads=threads))
            if variants:  # the decode steps are timed at this context length
                for i0 in range(0, P, n_batch):
                    chunk = prompt[i0:i0 + n_batch]
                    ctxs[n].decode(chunk, np.arange(i0, i0 + len(chunk)), logits="last")
        for t in TYPES:
            d = Drafter(files[t]["path"], ctxs[cm.N_LAYERS_BUILT], n_threads=threads, n_batch=n_batch)
            d.inject(context_feats, 0)
            drafters[t.value] = d
        mask = drafters[REFERENCE.value].spec.mask_token_id

        def decode_step(n: int) -> float:
            t0 = time.perf_counter()
            ctxs[n].decode([int(rng.integers(300, cm.VOCAB))], np.arange(P, P + 1), logits="last")
            dt = time.perf_counter() - t0
            ctxs[n].seq_rm(P, -1)
            return dt

        def draft_pass(name: str, k: int) -> float:  # as bench_cost_model.Bench.time_draft
            d = drafters[name]
            rows = np.ones(k + 1, dtype=bool)
            rows[0] = False  # row 0 re-predicts the bonus; only the k proposals need logits
            t0 = time.perf_counter()
            d.ctx.decode([int(rng.integers(300, cm.VOCAB))] + [mask] * k, np.arange(P, P + k + 1), logits=rows)
            dt = time.perf_counter() - t0
            d.ctx.seq_rm(P, -1)
            return dt

        order = random.Random(args.seed)
        for k in args.xs_depths:  # warm-up, untimed
            for n in variants:
                decode_step(n)
            for t in TYPES:
                draft_pass(t.value, k)
        if args.setup_only:
            return {"files": {t.value: {k: (str(v) if k == "path" else v) for k, v in files[t].items()}
                              for t in TYPES}}
        t_start = time.perf_counter()
        for rep in range(args.xs_repeats):
            depths = list(args.xs_depths)
            order.shuffle(depths)
            for k in depths:
                passes = [("decode", n) for n in variants] + [("draft", t.value) for t in TYPES]
                order.shuffle(passes)
                got = {}
                for what, who in passes:
                    got[(what, who)] = decode_step(who) if what == "decode" else draft_pass(who, k)
                dec40 = cm.extrapolate(*(got[("decode", n)] for n in variants))["t40"] if variants else None
                if dec40:
                    samples.setdefault("decode40", []).append(dec40)
                for t in TYPES:
                    samples.setdefault(f"draft:{t.value}:{k}", []).append(got[("draft", t.value)])
                    samples.setdefault(f"over_q8_0:{t.value}:{k}", []).append(
                        got[("draft", t.value)] / got[("draft", REFERENCE.value)])
                    if dec40:
                        samples.setdefault(f"over_decode40:{t.value}:{k}", []).append(got[("draft", t.value)] / dec40)
            console.print(f"  repeat {rep + 1}/{args.xs_repeats} done ({time.perf_counter() - t_start:.0f} s, "
                          f"load {os.getloadavg()[0]:.1f})")
    finally:
        for d in drafters.values():
            d.close()
        for obj in (*ctxs.values(), *models.values()):
            obj.close()

    rows = {}
    for t in TYPES:
        for k in args.xs_depths:
            rows[f"{t.value}:{k}"] = {
                "type": t.value, "depth": k,
                "draft_ms": summary([1e3 * x for x in samples[f"draft:{t.value}:{k}"]]),
                "vs_q8_0": summary(samples[f"over_q8_0:{t.value}:{k}"]),
            }
            if variants:
                rows[f"{t.value}:{k}"]["over_decode40"] = summary(samples[f"over_decode40:{t.value}:{k}"])
    return {
        "settings": {"repeats": args.xs_repeats, "depths": list(args.xs_depths), "threads": threads, "context": P,
                     "n_batch": n_batch, "seed": args.seed, "kv_type": "f16", "target": args.xs_target,
                     "host": str(host), "host_bytes": host.stat().st_size},
        "files": {t.value: {k: (str(v) if k == "path" else v) for k, v in files[t].items()} for t in TYPES},
        "q8_0_same_as_cost_model_drafter": same_as_harness,
        "decode40_ms": summary([1e3 * x for x in samples["decode40"]]) if variants else None,
        "rows": rows,
        "samples_s": samples,
    }


def same_tensors(a: Path, b: Path) -> bool:
    """The two GGUFs hold the same tensors, byte for byte (their metadata may differ)."""
    from gguf import GGUFReader

    ta, tb = ({t.name: t for t in GGUFReader(p).tensors} for p in (a, b))
    return ta.keys() == tb.keys() and all(
        ta[n].tensor_type == tb[n].tensor_type and np.array_equal(ta[n].data, tb[n].data) for n in ta)


# ----------------------------------------------------------------------------- output

def type_mix(types: dict[str, str]) -> str:
    counts: dict[str, int] = {}
    for v in types.values():
        counts[v] = counts.get(v, 0) + 1
    return ", ".join(f"{n} {t}" for t, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def fmt(s: dict, digits: int = 2) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def print_tables(res: dict) -> None:
    if "tiny" in res:
        tiny = res["tiny"]
        t = Table(title=f"tiny pair: {tiny['settings']['prompts']} code prompts x {tiny['settings']['n_predict']} "
                        f"tokens, {tiny['settings']['repeats']} repetitions; median (min-max)")
        for c in ("type", "MiB", "k", "accepted/round", "accept rate", "exact", "tok/s", "vs q8_0", "vs plain"):
            t.add_column(c, justify="right")
        n_prompts = tiny["settings"]["prompts"]
        for key, r in tiny["rows"].items():
            t.add_row(r["type"], f"{tiny['files'][r['type']]['bytes'] / 2**20:.2f}", str(r["depth"]),
                      f"{r['mean_accepted_per_round']:.2f}", f"{r['acceptance_rate']:.3f}",
                      f"{r['exact_prompts']}/{n_prompts}", fmt(r["tokens_per_s"], 1), fmt(r["vs_q8_0"], 3),
                      fmt(r["vs_plain"], 3))
        console.print(t)
        console.print(f"plain decoding: {fmt(tiny['plain_tokens_per_s'], 1)} tok/s; same tokens in every "
                      f"repetition: {tiny['deterministic']}")
    if "xs" in res:
        xs = res["xs"]
        t = Table(title=f"XS 2.1 widths, random weights: one draft pass, {xs['settings']['repeats']} repeats, "
                        f"{xs['settings']['threads']} thread(s); median (min-max)")
        with_decode = xs["decode40_ms"] is not None
        for c in ("type", "MiB", "k", "pass ms", "vs q8_0", *(("pass / 40-layer decode",) if with_decode else ())):
            t.add_column(c, justify="right")
        for key, r in xs["rows"].items():
            t.add_row(r["type"], f"{xs['files'][r['type']]['bytes'] / 2**20:.0f}", str(r["depth"]),
                      fmt(r["draft_ms"], 0), fmt(r["vs_q8_0"], 3),
                      *((fmt(r["over_decode40"], 3),) if with_decode else ()))
        console.print(t)
        if with_decode:
            console.print(f"40-layer decode step (extrapolated): {fmt(xs['decode40_ms'], 0)} ms; Q8_0 tensors "
                          f"identical to the cost model's drafter: {xs['q8_0_same_as_cost_model_drafter']}")
        for v, f in xs["files"].items():
            console.print(f"  {v}: {type_mix(f['types'])}")


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in ("tiny", "xs") if p in res]
    fig, axes = plt.subplots(1, len(panels) + ("tiny" in res), figsize=(5.2 * (len(panels) + ("tiny" in res)), 4.2))
    axes = list(np.atleast_1d(axes))
    colors = {"q8_0": "#4c72b0", "q6_k": "#55a868", "q5_k_m": "#c44e52", "q4_k_m": "#8172b2", "q4_0": "#ccb974"}
    width = 0.16
    if "tiny" in res:
        tiny = res["tiny"]
        depths = tiny["settings"]["depths"]
        x = np.arange(len(depths))
        ax = axes.pop(0)
        for i, t in enumerate(TYPES):
            v = [tiny["rows"][f"{t.value}:{k}"]["mean_accepted_per_round"] for k in depths]
            ax.bar(x + (i - 2) * width, v, width, color=colors[t.value], label=t.value)
        ax.set_xticks(x, [str(k) for k in depths])
        ax.set_xlabel("draft depth k")
        ax.set_ylabel("accepted drafts per round")
        ax.set_title("tiny pair: acceptance", fontsize=10)
        ax.legend(fontsize=8, loc="upper left")
        ax = axes.pop(0)
        for i, t in enumerate(TYPES):
            rows = [tiny["rows"][f"{t.value}:{k}"]["vs_q8_0"] for k in depths]
            med = np.array([r["median"] for r in rows])
            err = np.array([[m - r["min"] for m, r in zip(med, rows)], [r["max"] - m for m, r in zip(med, rows)]])
            ax.bar(x + (i - 2) * width, med, width, yerr=err, capsize=2, color=colors[t.value], label=t.value)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_ylim(0.5, 1.5)
        ax.set_xticks(x, [str(k) for k in depths])
        ax.set_xlabel("draft depth k")
        ax.set_ylabel("tokens/s / Q8_0's (median, min-max)")
        ax.set_title("tiny pair: speed vs Q8_0 (busy machine)", fontsize=10)
    if "xs" in res:
        xs = res["xs"]
        depths = xs["settings"]["depths"]
        x = np.arange(len(depths))
        ax = axes.pop(0)
        for i, t in enumerate(TYPES):
            rows = [xs["rows"][f"{t.value}:{k}"]["vs_q8_0"] for k in depths]
            med = np.array([r["median"] for r in rows])
            err = np.array([[m - r["min"] for m, r in zip(med, rows)], [r["max"] - m for m, r in zip(med, rows)]])
            mib = xs["files"][t.value]["bytes"] / 2**20
            ax.bar(x + (i - 2) * width, med, width, yerr=err, capsize=2, color=colors[t.value],
                   label=f"{t.value} ({mib:.0f} MiB)")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(x, [str(k) for k in depths])
        ax.set_xlabel("draft depth k")
        ax.set_ylabel("draft pass time / Q8_0's (median, min-max)")
        ax.set_title("XS 2.1 widths (random weights): draft pass", fontsize=10)
        ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


depth_list = int_list(1, 15)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("tiny", "xs", "both"), default="both")
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads for every model (default 1: on a busy machine two threads stall at each "
                         "op's barrier)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", type=Path, default=None, help="converted files (default: $LAGUNA_DFLASH_CACHE/lowbit)")
    ap.add_argument("--repeats", type=int, default=5, help="tiny: interleaved repetitions")
    ap.add_argument("--prompts", type=int, default=6, help="tiny: the first N prompts of runtime/data/prompts/code.txt")
    ap.add_argument("--n-predict", type=int, default=64, help="tiny: tokens per generation")
    ap.add_argument("--depths", type=depth_list, default=(1, 2, 4, 8), help="tiny: draft depths")
    ap.add_argument("--xs-repeats", type=int, default=9, help="XS: timed repeats of every item")
    ap.add_argument("--xs-depths", type=depth_list, default=(1, 2, 4, 8, 15), help="XS: draft depths")
    ap.add_argument("--context", type=int, default=512, help="XS: tokens in every KV cache")
    ap.add_argument("--xs-target", choices=("light", "harness"), default="light",
                    help="XS: the drafters' target: 'harness' = bench_cost_model's own models (6.8 GB, also times "
                         "40-layer decode steps), 'light' = its 5-layer target with 8 experts (a draft pass "
                         "reads only the target's embeddings and head, which are the same)")
    ap.add_argument("--n-batch", type=int, default=256)
    ap.add_argument("--reconvert", action="store_true", help="XS: convert again even where an earlier run's file is")
    ap.add_argument("--setup-only", action="store_true",
                    help="XS: build, convert and load everything, measure nothing (nothing written)")
    ap.add_argument("--json", type=Path, default=None, help="results (default: <workdir>/lowbit.json)")
    ap.add_argument("--png", type=Path, default=None, help="chart (default: <workdir>/lowbit.png)")
    ap.add_argument("--from-json", type=Path, default=None, help="no measuring: tables and chart of a saved run")
    ap.add_argument("--update", action="store_true",
                    help="with --part tiny or xs: keep the other part's results already in --json")
    args = ap.parse_args()

    if args.from_json:
        res = json.loads(args.from_json.read_text())
        print_tables(res)
        if args.png:
            plot(res, args.png)
            console.print(f"wrote {args.png}")
        return 0
    if args.repeats < 5 or args.xs_repeats < 5:
        ap.error("--repeats and --xs-repeats: at least 5")
    work = args.workdir or cache_root()
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    out_json = args.json or work / "lowbit.json"
    res: dict = json.loads(out_json.read_text()) if args.update and out_json.exists() else {}
    if args.setup_only:
        files = run_xs(args, work)["files"]
        for v, f in files.items():
            console.print(f"  {v}: {type_mix(f['types'])}")
        return 0
    for part, run in (("tiny", run_tiny), ("xs", run_xs)):
        if args.part in (part, "both"):
            started = machine()
            res[part] = run(args, work)
            res[part] |= {"command": command_line(__file__), "machine_start": started, "machine_end": machine(),
                          "wall_s": time.perf_counter() - t0}
    print_tables(res)
    out_json.parent.mkdir(parents=True, exist_ok=True)
    write_json(out_json, res, indent=1, default=float)
    out_png = args.png or work / "lowbit.png"
    plot(res, out_png)
    console.print(f"wrote {out_json} and {out_png}; {(time.perf_counter() - t0) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
