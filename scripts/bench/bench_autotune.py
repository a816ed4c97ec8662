"""How close `--n-max auto` comes to the best fixed depth, measured in one process.

    python -m scripts.bench.bench_autotune --json docs/results/autotune/autotune.json --png docs/results/autotune/autotune.png

Three workloads on the bundled laguna-tiny pair (greedy, one engine per drafter):

- ``code``: the held-out code prompts with the shipped drafter (speculation wins);
- ``prose``: the prose prompts with the shipped drafter (a pair trained on Python only);
- ``degraded``: the code prompts with a drafter degraded on purpose (its weights mixed with
  random ones, ``--degrade``), where every fixed depth loses to plain decoding.

For each workload, prompt by prompt and repeat by repeat, every fixed depth 0..15 and ``auto``
run in turn (interleaved, so the machine's noise falls on all alike). ``auto`` runs with one
tuner per workload and repeat, fresh at the workload's first prompt and carried across its
prompts, as one engine serving a stream of requests does. Reported per workload: tokens/s of
each depth, ``auto`` against the best fixed depth (0 included) and against plain decoding (also
with each prompt's time the median of its repeats, which one stall cannot move, and a 90%
bootstrap interval over whole repeats, which says how far another run could land), the
quality of the tuner's choices from round 64 on (the mean fixed-depth speed of the depths it
exploited, relative to the best fixed depth), the strict settling round (from it on, every
exploiting round uses a depth within 5% of the best), and the tuner's own bookkeeping as a share
of the generation time.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from scripts.recorded import command_line, write_results


def degraded_drafter(mix: float, seed: int = 0) -> Path:
    """The shipped drafter with every weight w replaced by (1-mix) w + mix r, where r is random
    with w's per-tensor spread (norm weights are mixed towards one), converted to Q8_0."""
    import torch
    from safetensors.torch import load_file, save_file

    from laguna_dflash.convert import converter
    from laguna_dflash.convert.target import read_target
    from laguna_dflash.runtime import assets

    out = (assets.cache_dir() / "demo"
           / f"Laguna-Tiny-DFlash-degraded{mix:g}-s{seed}-q8_0-{assets.drafter_digest()}.gguf")
    if out.exists():
        return out
    gen = torch.Generator().manual_seed(seed)
    weights = load_file(str(assets.TINY_DRAFTER_HF / "model.safetensors"))
    mixed = {}
    for name, w in weights.items():
        w32 = w.float()
        if "norm" in name:
            r = torch.ones_like(w32)
        else:
            r = torch.randn(w32.shape, generator=gen) * w32.std()
        mixed[name] = ((1 - mix) * w32 + mix * r).to(w.dtype).contiguous()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "Laguna-Tiny-DFlash-degraded"
        d.mkdir()
        shutil.copy(assets.TINY_DRAFTER_HF / "config.json", d / "config.json")
        save_file(mixed, str(d / "model.safetensors"), metadata={"format": "pt"})
        out.parent.mkdir(parents=True, exist_ok=True)
        converter.convert(d, read_target(assets.TINY_TARGET), out, converter.OutType.Q8_0)
    return out


def run_workload(engine, prompts: list[str], depths: list[int], n_predict: int, repeats: int, progress, task) -> dict:
    from laguna_dflash.runtime.engine import GenerateOptions
    from tests.helpers.depth_replay import GOOD_FRACTION, choice_quality, ratio_over_repeats, repeat_interval, settle_round
    from laguna_dflash.runtime.tuner import AutoDepth

    rounds, accepted = defaultdict(int), defaultdict(int)
    per_prompt = defaultdict(list)  # (depth, prompt index) -> [(tokens, seconds) per repeat]
    auto_runs = []
    plain_fixed_s: list[float] = []  # round times of fixed depth 0, for auto's time split
    engine.generate(prompts[0], GenerateOptions(n_predict=8, n_max=0))  # warm-up
    for rep in range(repeats):
        tuner = AutoDepth(engine.drafter.spec.max_draft, window=engine.drafter.spec.sliding_window,
                          graph_replay=engine.graph_replay)
        trace: list[dict] = []
        t_policy = t_gen = 0.0
        n_rounds = 0
        for i, prompt in enumerate(prompts):
            for depth in [*depths, "auto"]:
                opts = GenerateOptions(n_predict=n_predict, n_max=tuner if depth == "auto" else depth)
                # every run pays for the same trace callback; auto's records are kept, and the
                # round times of plain decoding (a round's time: from the last callback to this)
                sink = trace if depth == "auto" else []
                opts.trace = lambda r, base=n_rounds, sink=sink, gen=(rep, i): sink.append(
                    {**r, "round": base + r["round"], "t": time.perf_counter(), "gen": gen})
                s = engine.generate(prompt, opts).stats
                if depth == 0:
                    plain_fixed_s += [b["t"] - a["t"] for a, b in zip(sink, sink[1:])]
                key = str(depth)
                per_prompt[key, i].append((s.n_generated, s.t_total))
                rounds[key] += s.rounds
                accepted[key] += s.accepted
                if depth == "auto":
                    n_rounds += s.rounds
                    t_policy += s.t_policy
                    t_gen += s.t_total
                progress.advance(task)
        auto_runs.append({"trace": trace, "t_policy": t_policy, "t_generate": t_gen, "rounds": n_rounds,
                          "final": tuner.describe()})
    keys = [str(d) for d in [*depths, "auto"]]

    def rate(key: str, combine) -> float:
        """tokens/s of ``key``, each prompt's repeats combined by ``combine``"""
        runs = [per_prompt[key, i] for i in range(len(prompts))]
        return sum(combine([n for n, _ in r]) for r in runs) / sum(combine([t for _, t in r]) for r in runs)

    tps = {k: rate(k, sum) for k in keys}
    # the same, with each prompt's time the median of its repeats: a stall of the machine during
    # one run moves no depth (runs are short, and one depth's stall is another depth's luck)
    tps_median = {k: rate(k, statistics.median) for k in keys}
    fixed_median = {int(k): v for k, v in tps_median.items() if k != "auto"}
    fixed = {int(k): v for k, v in tps.items() if k != "auto"}
    best_depth = max(fixed, key=fixed.get)
    good = {d for d, v in fixed.items() if v >= GOOD_FRACTION * fixed[best_depth]}
    # depths the tuner may pick but that were not timed fixed: good if both timed neighbours are
    timed = sorted(fixed)
    for d in range(max(timed) + 1):
        if d not in fixed:
            lo = max(t for t in timed if t < d)
            hi = min(t for t in timed if t > d)
            if lo in good and hi in good:
                good.add(d)
    # each repeat's totals over the prompts: the unit of the bootstrap interval
    rep_tokens = {k: [sum(per_prompt[k, i][r][0] for i in range(len(prompts))) for r in range(repeats)] for k in keys}
    rep_seconds = {k: [sum(per_prompt[k, i][r][1] for i in range(len(prompts))) for r in range(repeats)] for k in keys}
    fixed_keys = [k for k in keys if k != "auto"]
    chosen = [([r["depth"] for r in run["trace"]], [r.get("why", "") for r in run["trace"]]) for run in auto_runs]
    settles = [settle_round(d, w, good) for d, w in chosen]
    quality = [choice_quality(d, w, fixed) for d, w in chosen]
    return {
        "tokens_per_s": tps,
        "mean_accepted": {k: accepted[k] / rounds[k] if rounds[k] and k != "0" else 0.0 for k in keys},
        "best_fixed_depth": best_depth,
        "good_depths": sorted(good),
        "auto_vs_best_fixed": tps["auto"] / fixed[best_depth],
        # 90% bootstrap interval over repeats (the best fixed depth chosen again in each resample)
        "auto_vs_best_fixed_interval": repeat_interval(rep_tokens, rep_seconds, "auto", fixed_keys),
        "auto_vs_plain_interval": repeat_interval(rep_tokens, rep_seconds, "auto", ["0"]),
        # each repeat alone, against the depth that was fastest in that repeat
        "auto_vs_best_fixed_per_repeat": [ratio_over_repeats(rep_tokens, rep_seconds, "auto", fixed_keys, [r])
                                          for r in range(repeats)],
        # the machine's load shows in plain decoding's speed repeat by repeat
        "tokens_per_s_per_repeat": {k: [n / t for n, t in zip(rep_tokens[k], rep_seconds[k])] for k in keys},
        "tokens_per_s_median_of_repeats": tps_median,
        "auto_vs_best_fixed_median_of_repeats": tps_median["auto"] / max(fixed_median.values()),
        "auto_vs_plain_median_of_repeats": tps_median["auto"] / fixed_median[0],
        "auto_vs_plain": tps["auto"] / fixed[0],
        "best_fixed_vs_plain": fixed[best_depth] / fixed[0],
        "settle_round": settles,
        "choice_quality_after_64": quality,
        "auto_rounds": [run["rounds"] for run in auto_runs],
        "policy_share": sum(r["t_policy"] for r in auto_runs) / sum(r["t_generate"] for r in auto_runs),
        "policy_us_per_round": 1e6 * sum(r["t_policy"] for r in auto_runs) / max(1, sum(r["rounds"] for r in auto_runs)),
        "auto_final": [run["final"] for run in auto_runs],
        "auto_traces": [[{k: r[k] for k in ("round", "depth", "why")} for r in run["trace"]] for run in auto_runs],
        "auto_time_split": time_split([run["trace"] for run in auto_runs], plain_fixed_s),
    }


def time_split(traces: list[list[dict]], plain_fixed_s: list[float]) -> dict:
    """Where auto's time goes, by kind of round (a round's time: from the trace callback of the
    round before, within one generation): plain steps that follow plain steps, drafting rounds,
    and first rounds at another depth (after plain steps, including the drafter's catch-up; back
    to plain steps; between drafting depths); against fixed plain decoding's mean round."""
    kinds: dict[str, list[float]] = {"plain": [], "drafting": [], "first drafting after plain": [],
                                     "first plain after drafting": [], "first at another drafting depth": []}
    for trace in traces:
        for a, b in zip(trace, trace[1:]):
            if b["gen"] != a["gen"]:
                continue  # a new generation: its first round has no start mark
            if b["depth"] == a["depth"]:
                kind = "plain" if b["depth"] == 0 else "drafting"
            elif a["depth"] == 0:
                kind = "first drafting after plain"
            elif b["depth"] == 0:
                kind = "first plain after drafting"
            else:
                kind = "first at another drafting depth"
            kinds[kind].append(b["t"] - a["t"])
    out = {k: {"rounds": len(v), "mean_ms": 1e3 * statistics.fmean(v) if v else None, "total_s": sum(v)}
           for k, v in kinds.items()}
    out["fixed plain"] = {"rounds": len(plain_fixed_s),
                          "mean_ms": 1e3 * statistics.fmean(plain_fixed_s) if plain_fixed_s else None}
    return out


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["workloads"])
    fig, axes = plt.subplots(2, len(names), figsize=(4.2 * len(names), 6.4), dpi=110, squeeze=False)
    for j, name in enumerate(names):
        w = result["workloads"][name]
        plain = w["tokens_per_s"]["0"]
        depths = sorted(int(k) for k in w["tokens_per_s"] if k != "auto")
        ax = axes[0][j]
        ax.plot(depths, [w["tokens_per_s"][str(d)] / plain for d in depths], "o-", label="fixed depth")
        ax.axhline(w["tokens_per_s"]["auto"] / plain, color="tab:red", label="auto")
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_title(f"{name}: auto {w['auto_vs_best_fixed']:.2f}x best fixed, {w['auto_vs_plain']:.2f}x plain",
                     fontsize=9)
        ax.set_xlabel("n_max")
        ax.set_ylabel("speedup vs plain decoding")
        ax.legend(fontsize=7)
        ax = axes[1][j]
        tr = w["auto_traces"][0]
        ax.plot([r["round"] for r in tr], [r["depth"] for r in tr], ".", markersize=2)
        settle = w["settle_round"][0]
        if settle is not None:
            ax.axvline(settle, color="tab:green", linestyle=":", label=f"settled at round {settle}")
            ax.legend(fontsize=7)
        ax.set_xlabel("round (first repeat)")
        ax.set_ylabel("depth chosen by auto")
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-predict", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--depths", default="0,1,2,3,4,5,6,8,15", help="fixed depths to time (0 always included)")
    ap.add_argument("--degrade", type=float, default=0.6, help="weight mix of the degraded drafter (0: shipped, 1: random)")
    ap.add_argument("--workloads", default="code,prose,degraded")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where both models run (cuda: every layer)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path)
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.engine import Engine, EngineConfig
    from laguna_dflash.runtime.llama import Model
    from laguna_dflash.runtime.placement import resolve

    placement = resolve(args.device)

    depths = sorted({0, *(int(d) for d in args.depths.split(","))})
    shipped = assets.converted_tiny_drafter()
    plan = {
        "code": (shipped, assets.read_prompts(assets.CODE_PROMPTS)),
        "prose": (shipped, assets.read_prompts(assets.PROMPTS_DIR / "prose.txt")),
        "degraded": (None, assets.read_prompts(assets.CODE_PROMPTS)),
    }
    plan = {k: plan[k] for k in args.workloads.split(",")}
    if "degraded" in plan:
        plan["degraded"] = (degraded_drafter(args.degrade), plan["degraded"][1])
    result = {"command": command_line(__file__, argv),
              "n_predict": args.n_predict, "repeats": args.repeats, "degrade": args.degrade, "workloads": {}}
    console = Console()
    result["placement"] = placement.describe()
    with Model(assets.TINY_TARGET, n_gpu_layers=placement.n_gpu_layers) as target, Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console, transient=True) as progress:
        for name, (drafter, prompts) in plan.items():
            task = progress.add_task(name, total=len(prompts) * (len(depths) + 1) * args.repeats)
            with Engine(target, drafter, EngineConfig(n_ctx=2048, n_threads=args.threads,
                                                      n_gpu_layers_draft=placement.n_gpu_layers_draft)) as eng:
                result["workloads"][name] = run_workload(eng, prompts, depths, args.n_predict, args.repeats,
                                                         progress, task)
    t = Table(title="--n-max auto vs fixed depths (greedy, one process, interleaved)", title_justify="left")
    for col in ("workload", "plain tok/s", "best fixed", "best vs plain", "auto vs best", "auto vs plain",
                "90% interval over repeats (vs best; vs plain)",
                "auto vs best (median of repeats)", "auto vs plain (median of repeats)",
                "choices after round 64", "strictly settled at round", "auto rounds", "bookkeeping"):
        t.add_column(col, justify="right")
    for name, w in result["workloads"].items():
        t.add_row(name, f"{w['tokens_per_s']['0']:.1f}", str(w["best_fixed_depth"]), f"{w['best_fixed_vs_plain']:.2f}x",
                  f"{w['auto_vs_best_fixed']:.3f}", f"{w['auto_vs_plain']:.3f}",
                  "{:.3f}-{:.3f}; {:.3f}-{:.3f}".format(*w["auto_vs_best_fixed_interval"], *w["auto_vs_plain_interval"]),
                  f"{w['auto_vs_best_fixed_median_of_repeats']:.3f}", f"{w['auto_vs_plain_median_of_repeats']:.3f}",
                  ", ".join(f"{q:.3f}" for q in w["choice_quality_after_64"]),
                  ", ".join("never" if s is None else str(s) for s in w["settle_round"]),
                  ", ".join(str(r) for r in w["auto_rounds"]),
                  f"{100 * w['policy_share']:.2f}% ({w['policy_us_per_round']:.0f} us/round)")
    console.print(t)
    d = Table(title="tokens/s by depth", title_justify="left")
    d.add_column("workload")
    keys = [str(x) for x in depths] + ["auto"]
    for k in keys:
        d.add_column(k, justify="right")
    for name, w in result["workloads"].items():
        d.add_row(name, *(f"{w['tokens_per_s'][k]:.0f}" for k in keys))
        d.add_row("  accepted", "-", *(f"{w['mean_accepted'][k]:.2f}" for k in keys[1:]))
    console.print(d)
    for name, w in result["workloads"].items():
        split = w["auto_time_split"]
        console.print(f"{name}: auto's rounds, mean ms (count): " + ", ".join(
            f"{k} {v['mean_ms']:.3f} ({v['rounds']})" for k, v in split.items() if v["mean_ms"] is not None))
    write_results(result, args.json, args.png, plot, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
