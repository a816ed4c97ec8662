#!/usr/bin/env python3
"""Concurrent streams: aggregate and per-stream tokens/s and time to first token at 1, 2, 4 and
8 streams, plain and speculative, for the batched slots (runtime/batch.py: one target decode per
round for every stream) against separate slots (an Engine and a thread per stream, each with
its own contexts: the server's slots before the batched engine) (issue 48).

    python -m scripts.bench.bench_concurrency --repeats 5 --threads 2 \\
        --json docs/results/concurrency/concurrency.json --png docs/results/concurrency/concurrency.png

The workload: ``--requests`` greedy completions of ``--n-predict`` tokens on the first
``--prompt-tokens`` tokens of the bundled code pair's prompts (F16 cache, prompt cache off), served by C streams in a closed loop (each
stream takes the next request when its last one ends, as C clients would); a run's wall time
is from the first request to the last token. Every (engine, C, depth) run is one cell; the
repetitions run every cell once each, in the same order, ``--repeats`` times (interleaved); with
``--rotate`` repetition r starts at cell r (modulo the cells) and goes round, so that no cell
always runs at the same point of a repetition, nor always after the same cell.
Statistic (fixed before the run): per cell the median over repetitions of the aggregate
tokens/s (all tokens over the run's wall time), with min-max; per-stream tokens/s is each
request's tokens over its own time from start to end, TTFT from its start to its first token
(the prefill's wall time, Stats.t_prefill, in both engines), both the median over the run's requests, then over repetitions; tokens per CPU second (this
process's CPU time) is what a run would give were the cores its own. The acceptance ratio is the
batched cell at C=4, depth 4 over the separate cell at C=1, depth 4 (the same requests run one
at a time on today's engine), held at >= 1.8 with every batched output equal to the output the
same request has alone on the batched engine (C=1); outputs are also compared with today's
engine alone. With ``auto`` among ``--depths``, each stream count's batched ``auto`` cell is also
judged against the best of the fixed depths run (median over median, held at >= 0.97; beside
it, reported only, the same ratio within each repetition and its median);
``--separate-depths`` and ``--separate-streams`` limit the separate engines to the cells a
comparison needs. Each engine's rounds run in a thread of their own (``in_a_thread``).
``--device cuda`` puts both models on the GPU (a CUDA build of the wheel).
``--lanes`` splits each batched engine's slots into lanes whose passes run at once
(runtime/lanes.py, ``laguna-run serve --lanes``).

``--target`` measures another target GGUF (e.g. the XS-width synthetic target that
``python -m scripts.bench.bench_cost_model --build-only`` writes), with its drafter from
``--drafter`` or, without one, plain decoding only (every depth 0). Its acceptance line is the
plain one: the batched cell at C=4, depth 0 over the separate cell at C=1, depth 0, held at >= 2.0
with every output equal to its output alone. The JSON records the load average before the run and
after each repetition.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from pathlib import Path

from scripts.arguments import int_list, require_at_least
from scripts.recorded import command_line, write_json, write_results

# streams, depth, the batched aggregate's bar over the same requests one at a time on today's engine
ACCEPTANCE = (4, 4, 1.8)  # the bundled code pair, speculative
ACCEPTANCE_PLAIN = (4, 0, 2.0)  # a --target (the XS-width one), plain decoding
AUTO_BAR = 0.97  # auto's aggregate over the best fixed depth's, at each stream count


class Run:
    """One run's requests: start, first token and end times, tokens."""

    def __init__(self, n: int) -> None:
        self.t_start, self.t_first, self.t_end = [0.0] * n, [0.0] * n, [0.0] * n
        self.tokens: list[list[int]] = [[] for _ in range(n)]

    def summary(self, wall: float, cpu: float) -> dict:
        n_tok = sum(len(t) for t in self.tokens)
        per = [len(t) / (e - s) for t, s, e in zip(self.tokens, self.t_start, self.t_end)]
        ttft = [f - s for f, s in zip(self.t_first, self.t_start)]
        return {"aggregate": n_tok / wall, "per_stream": statistics.median(per), "ttft": statistics.median(ttft),
                "per_cpu_s": n_tok / cpu, "tokens": n_tok, "wall": wall, "cpu": cpu}


def run_batched(engine, prompts, opts, streams: int) -> tuple[dict, list[list[int]]]:
    run = Run(len(prompts))
    queue = list(range(len(prompts)))
    owner: dict[int, int] = {}
    t0, c0 = time.perf_counter(), time.process_time()
    while queue or owner:
        for slot in range(streams):
            if queue and slot not in owner:
                i = queue.pop(0)
                run.t_start[i] = time.perf_counter()
                engine.start(slot, prompts[i], opts)
                owner[slot] = i
        ended = engine.step()
        now = time.perf_counter()
        for fin in ended:
            i = owner.pop(fin.slot)
            if fin.error is not None:
                raise fin.error
            engine.take_text(fin.slot)
            run.tokens[i] = list(fin.tokens)
            run.t_first[i] = run.t_start[i] + fin.stats.t_prefill
            run.t_end[i] = now
    return run.summary(time.perf_counter() - t0, time.process_time() - c0), run.tokens


def in_a_thread(fn, *args):
    """``fn(*args)`` run by a thread of its own, as the server's worker runs the batched rounds
    and as each separate engine runs in its client's thread, so that both meet the same threading
    (docs/results/concurrency/README.md: from the main thread, some generations at -t 2 took 10-50x
    longer on the shared machine)."""
    out: list = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn(*args))
        except BaseException as e:
            errors.append(e)
    t = threading.Thread(target=run)
    t.start()
    t.join()
    if errors:
        raise errors[0]
    return out[0]


def run_separate(engines, prompts, opts, streams: int) -> tuple[dict, list[list[int]]]:
    run = Run(len(prompts))
    queue = list(range(len(prompts)))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def client(engine) -> None:
        while True:
            with lock:
                if not queue:
                    return
                i = queue.pop(0)
            run.t_start[i] = time.perf_counter()
            try:
                res = engine.generate(prompts[i], opts)
            except BaseException as e:
                errors.append(e)
                return
            run.t_end[i] = time.perf_counter()
            run.t_first[i] = run.t_start[i] + res.stats.t_prefill
            run.tokens[i] = res.tokens

    t0, c0 = time.perf_counter(), time.process_time()
    threads = [threading.Thread(target=client, args=(e,)) for e in engines[:streams]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return run.summary(time.perf_counter() - t0, time.process_time() - c0), run.tokens


def repetition_order(cells: list, rep: int, rotate: bool) -> list:
    """The cells in repetition ``rep``'s order: the same every time, or starting at cell ``rep``."""
    if not rotate:
        return list(cells)
    k = rep % len(cells)
    return cells[k:] + cells[:k]


def auto_verdicts(table: dict, results: dict, streams, depths) -> dict:
    """Per stream count: the batched engine's median aggregate at ``auto`` over the best median of
    its fixed depths (those run), the verdict; and, reported only, ``auto`` over that depth within
    each repetition, which the pace's drift between repetitions does not move."""
    out = {}
    fixed = [d for d in depths if d != "auto"]
    if "auto" not in depths or not fixed:
        return out
    for c in streams:
        rate = {d: table[f"batched c{c} d{d}"]["aggregate"]["median"] for d in fixed}
        best = max(rate, key=rate.get)
        ratio = table[f"batched c{c} dauto"]["aggregate"]["median"] / rate[best]
        within = [a["aggregate"] / b["aggregate"]
                  for a, b in zip(results[f"batched c{c} dauto"], results[f"batched c{c} d{best}"])]
        out[str(c)] = {"ratio": ratio, "best_fixed": best, "bar": AUTO_BAR, "held": ratio >= AUTO_BAR,
                       "per_repetition_ratios": within, "median_of_per_repetition_ratios": statistics.median(within)}
    return out


def check_plain_only(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A target without a drafter decodes plainly: any other depth is refused in one line (exit 2),
    before a model loads."""
    if args.target is not None and args.drafter is None:
        deep = [d for d in (*args.depths, *(args.separate_depths or ())) if d != 0]
        if deep:
            ap.error(f"--depths/--separate-depths: {','.join(map(str, deep))} needs a drafter (--drafter GGUF); "
                     "without one, only 0 (plain decoding)")
    if args.drafter is not None and args.target is None:
        ap.error("--drafter: needs --target (the bundled code pair has its own drafter)")
    for flag, path in (("--target", args.target), ("--drafter", args.drafter)):
        if path is not None and not path.is_file():
            ap.error(f"{flag}: no file at {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int_list(1, 64), default=(1, 2, 4, 8))
    ap.add_argument("--depths", type=int_list(0, 15, ("auto",)), default=(0, 4))
    ap.add_argument("--separate-depths", type=int_list(0, 15, ("auto",)),
                    help="the depths separate engines run (default: --depths)")
    ap.add_argument("--separate-streams", type=int_list(1, 64),
                    help="the stream counts separate engines run (default: --streams)")
    ap.add_argument("--target", type=Path,
                    help="a target GGUF instead of the bundled code pair's (e.g. the XS-width synthetic target "
                         "of scripts.bench.bench_cost_model --build-only); judged on the plain line (4 streams, "
                         "depth 0, >= 2.0x one at a time)")
    ap.add_argument("--drafter", type=Path,
                    help="--target's drafter GGUF; without it, plain decoding only (--depths 0)")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=96, help="each prompt's first tokens (0: whole)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lanes", type=int, default=1,
                    help="the batched engines' lanes (laguna-run serve --lanes; at most the stream count)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: both models' layers on the GPU (a CUDA build of the wheel)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rotate", action="store_true",
                    help="repetition r starts at cell r and goes round (default: every repetition in the same order)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path)
    args = ap.parse_args(argv)
    require_at_least(ap, args, lanes=1)
    check_plain_only(ap, args)
    from rich.console import Console

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.cores import CpuMeter, busy_warning, cpu_facts
    from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions
    from laguna_dflash.runtime.lanes import make_engine
    from laguna_dflash.runtime.llama import Model
    from laguna_dflash.runtime.open_pair import resolve_pair
    from laguna_dflash.runtime.placement import ALL_LAYERS, gpu_available

    console = Console(stderr=True)
    if args.target is None:
        pair = resolve_pair(assets.TINY_TARGET, assets.converted_tiny_drafter())
        pair_name, acceptance = "code", ACCEPTANCE
    else:
        pair = resolve_pair(args.target, args.drafter)
        pair_name, acceptance = args.target.name, ACCEPTANCE_PLAIN
    layers = ALL_LAYERS if args.device == "cuda" else 0
    if layers and not gpu_available():
        ap.error("--device cuda: this build of the wheel has no CUDA, or no GPU is present")
    cfg = EngineConfig(n_ctx=1024, n_threads=args.threads, kv_type="f16", prompt_cache=False,
                       n_gpu_layers=layers, n_gpu_layers_draft=layers)
    texts = assets.read_prompts(assets.CODE_PROMPTS)
    target = Model(pair.target.path, n_gpu_layers=layers)
    drafter = Model(pair.drafter.path, n_gpu_layers=layers) if pair.drafter is not None else None
    prompts = [target.tokenize(texts[i % len(texts)])[:args.prompt_tokens or None] for i in range(args.requests)]
    batched = {c: make_engine(target, pair, cfg, c, min(args.lanes, c), drafter) for c in args.streams}
    separate_depths = args.depths if args.separate_depths is None else args.separate_depths
    separate_streams = args.streams if args.separate_streams is None else args.separate_streams
    separate = [Engine(target, config=cfg, drafter_model=drafter, pair=pair) for _ in range(max(separate_streams))]
    cells = [(kind, c, d) for d in args.depths for c in args.streams for kind in ("batched", "separate")
             if kind == "batched" or (d in separate_depths and c in separate_streams)]
    results: dict[str, list[dict]] = {f"{k} c{c} d{d}": [] for k, c, d in cells}
    outputs: dict[str, list[list[int]]] = {}
    differ: dict[str, int] = {}
    meter = CpuMeter()
    before = meter.snapshot()
    load = {"before": list(os.getloadavg()), "after_each_repetition": []}
    def summarise(done: int):
        """Everything measured so far (``done`` repetitions)."""
        others = meter.others_busy_cores(before, meter.snapshot())

        def med(key: str, field: str) -> dict:
            vals = [r[field] for r in results[key]]
            return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}

        table = {key: {f: med(key, f) for f in ("aggregate", "per_stream", "ttft", "per_cpu_s")} for key in results}
        solo_key = lambda kind, d: f"{kind} c1 d{d}"  # noqa: E731
        equal = {}
        for kind, c, d in cells:
            key = f"{kind} c{c} d{d}"
            for ref in ("batched", "separate"):
                if solo_key(ref, d) in outputs:
                    same = sum(a == b for a, b in zip(outputs[key], outputs[solo_key(ref, d)]))
                    equal.setdefault(key, {})[f"equal_to_{ref}_alone"] = f"{same}/{len(prompts)}"
        c_acc, d_acc, bar = acceptance
        verdict = None
        if f"batched c{c_acc} d{d_acc}" in table and solo_key("separate", d_acc) in table:
            ratios = [b["aggregate"] / s["aggregate"] for b, s in
                      zip(results[f"batched c{c_acc} d{d_acc}"], results[solo_key("separate", d_acc)])]
            ratio = table[f"batched c{c_acc} d{d_acc}"]["aggregate"]["median"] / \
                table[solo_key("separate", d_acc)]["aggregate"]["median"]
            exact = equal[f"batched c{c_acc} d{d_acc}"]["equal_to_batched_alone"] == f"{len(prompts)}/{len(prompts)}"
            verdict = {"streams": c_acc, "depth": d_acc, "ratio_of_medians": ratio, "per_repetition_ratios": ratios, "bar": bar,
                       "outputs_equal_alone": exact, "held": ratio >= bar and exact}
        auto = auto_verdicts(table, results, args.streams, args.depths)
        result = {"command": command_line(__file__, argv), "cpu": cpu_facts(), "threads": args.threads, "lanes": args.lanes,
                  "device": args.device,
                  "requests": args.requests, "n_predict": args.n_predict, "depths": list(args.depths), "prompt_tokens": args.prompt_tokens,
                  "repeats": args.repeats, "repeats_done": done,
                  "cell_order_per_repetition": [[f"{k} c{c} d{d}" for k, c, d in o] for o in orders[:done]],
                  "pair": pair_name, "target": Path(pair.target.path).name,
                  "drafter": Path(pair.drafter.path).name if pair.drafter is not None else None,
                  "cache": "f16", "others_busy_cores": others, "load_average": load, "cells": table,
                  "aggregate_per_repetition": {k: [r["aggregate"] for r in v] for k, v in results.items()},
                  "outputs": equal, "runs_whose_outputs_changed": differ, "acceptance": verdict,
                  "auto_vs_best_fixed": auto}
        return result, table, equal, verdict, auto, others

    orders = [repetition_order(cells, rep, args.rotate) for rep in range(args.repeats)]
    for rep in range(args.repeats):
        for kind, c, d in orders[rep]:
            opts = GenerateOptions(n_predict=args.n_predict, n_max=d)
            if kind == "batched":
                summary, tokens = in_a_thread(run_batched, batched[c], prompts, opts, c)
            else:
                summary, tokens = run_separate(separate, prompts, opts, c)
            key = f"{kind} c{c} d{d}"
            results[key].append(summary)
            outputs.setdefault(key, tokens)
            if tokens != outputs[key]:
                differ[key] = differ.get(key, 0) + 1  # a run whose outputs differ from its first
            console.print(f"rep {rep + 1}/{args.repeats} {key}: {summary['aggregate']:.0f} tok/s")
        load["after_each_repetition"].append(list(os.getloadavg()))
        if args.json and rep + 1 < args.repeats:  # what a run stopped at its time limit leaves
            write_json(args.json, summarise(rep + 1)[0])
    result, table, equal, verdict, auto, others = summarise(args.repeats)
    c_acc, d_acc, bar = acceptance
    warning = busy_warning(others)
    if warning:
        console.print(warning)
    for key, row in table.items():
        console.print(f"{key:22s} aggregate {row['aggregate']['median']:7.1f} tok/s "
                      f"({row['aggregate']['min']:.1f}-{row['aggregate']['max']:.1f}), per stream "
                      f"{row['per_stream']['median']:6.1f}, TTFT {row['ttft']['median'] * 1e3:6.0f} ms, "
                      f"{row['per_cpu_s']['median']:6.1f} tok per CPU s  {equal.get(key)}")
    if verdict:
        console.print(f"acceptance: batched c{c_acc} d{d_acc} / separate c1 d{d_acc} = {verdict['ratio_of_medians']:.2f}x "
                      f"(bar {bar}), outputs equal alone: {verdict['outputs_equal_alone']} -> "
                      f"{'held' if verdict['held'] else 'not held'}")
    for c, v in auto.items():
        console.print(f"auto at {c} streams: {v['ratio']:.3f}x the best fixed depth ({v['best_fixed']}; bar "
                      f"{AUTO_BAR}) -> {'held' if v['held'] else 'not held'}; within each repetition, median "
                      f"{v['median_of_per_repetition_ratios']:.3f}x")
    write_results(result, args.json, args.png, plot, console)
    for e in batched.values():
        e.close()
    for e in separate:
        e.close()
    if drafter is not None:
        drafter.close()
    target.close()
    return 0


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = result["cells"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for kind, style in (("batched", "-"), ("separate", "--")):
        for depth, color in zip([str(d) for d in result["depths"]], plt.rcParams["axes.prop_cycle"].by_key()["color"]):
            keys = sorted((k for k in cells if k.startswith(kind) and k.endswith(f"d{depth}")),
                          key=lambda k: int(k.split()[1][1:]))
            if not keys:
                continue
            xs = [int(k.split()[1][1:]) for k in keys]
            label = f"{kind}, {'plain' if depth == '0' else f'depth {depth}'}"
            axes[0].errorbar(xs, [cells[k]["aggregate"]["median"] for k in keys],
                             yerr=[[cells[k]["aggregate"]["median"] - cells[k]["aggregate"]["min"] for k in keys],
                                   [cells[k]["aggregate"]["max"] - cells[k]["aggregate"]["median"] for k in keys]],
                             linestyle=style, color=color, marker="o", capsize=3, label=label)
            axes[1].plot(xs, [cells[k]["ttft"]["median"] * 1e3 for k in keys], linestyle=style, color=color,
                         marker="o", label=label)
    axes[0].set(xlabel="concurrent streams", ylabel="aggregate tokens/s (median, min-max)", xscale="log", xticks=[1, 2, 4, 8])
    axes[1].set(xlabel="concurrent streams", ylabel="time to first token, ms (median)", xscale="log", xticks=[1, 2, 4, 8])
    for ax in axes:
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticklabels(["1", "2", "4", "8"])
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    cpu = result["cpu"]
    what = "bundled code pair" if result["pair"] == "code" else result["target"]
    where = "both models on the GPU" if result.get("device") == "cuda" else f"-t {result['threads']}"
    fig.suptitle(f"{what}, {where}, {result['requests']} x {result['n_predict']} tokens, "
                 f"{cpu['model']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
