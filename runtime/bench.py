"""Benchmarks measured in one process: plain decoding and each draft depth on the same prompts.

Runs are interleaved (prompt by prompt, every depth in turn, repeated) so that the machine's
noise falls on every configuration alike; speedups are ratios to plain decoding measured in the
same run. Greedy outputs are compared with plain decoding on the way: ``exact`` says whether
every speculative output equalled it token for token. ``machine_busy_cores`` says how many
cores' worth of CPU time other processes used meanwhile (runtime/cores.py): beside another job
the configurations compete for the cores unevenly, and the ratios mean less.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .cores import CpuMeter
from .engine import Engine, GenerateOptions, GenerationResult


def run_bench(engine: Engine, prompt_sets: dict[str, list[str]], depths: list, n_predict: int,
              repeats: int = 1, console: Console | None = None,
              should_stop: Callable[[], bool] | None = None, meter: CpuMeter | None = None) -> dict:
    """Measure every depth on every prompt. When ``should_stop`` says so (Ctrl-C), the prompt in
    progress is dropped and the result holds the prompts every depth completed
    (``"interrupted": true``), so the ratios still compare the same work. ``meter``: the load
    meter of the machine (default: this process's cores, from /proc)."""
    configs = [0] + [d for d in depths if d != 0]
    tokens = defaultdict(int)
    seconds = defaultdict(float)
    rounds = defaultdict(int)
    accepted = defaultdict(int)
    drafted = defaultdict(int)
    exact = defaultdict(lambda: True)
    depth_rounds: dict = defaultdict(lambda: defaultdict(int))
    # per position and per accepted count, summed element-wise over the prompts
    drafted_at: dict = defaultdict(list)
    accepted_at: dict = defaultdict(list)
    histogram: dict = defaultdict(list)
    measured = defaultdict(int)
    stop = should_stop or (lambda: False)
    interrupted = False
    meter = meter or CpuMeter()
    load_before = meter.snapshot()

    def generate(prompt: str, n: int, depth) -> GenerationResult | None:
        res = engine.generate(prompt, GenerateOptions(n_predict=n, n_max=depth, should_stop=should_stop))
        return None if res.stop_reason == "interrupted" or stop() else res

    # warm-up: the first decodes of a process pay for graph reservation and cold caches
    first = next(iter(prompt_sets.values()))[0]
    for depth in configs:
        if generate(first, 8, depth) is None:
            interrupted = True
            break
    order = [(content, prompt) for _ in range(repeats) for content, prompts in prompt_sets.items()
             for prompt in prompts]
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task("bench", total=len(order) * len(configs))
        for content, prompt in order if not interrupted else ():
            results = []
            for depth in configs:
                progress.update(task, description=f"{content} n_max={depth}")
                res = generate(prompt, n_predict, depth)
                if res is None:
                    break
                results.append((depth, res))
                progress.advance(task)
            if len(results) < len(configs):
                interrupted = True
                break
            measured[content] += 1
            plain = results[0][1].tokens
            for depth, res in results:
                key = (content, str(depth))
                s = res.stats
                tokens[key] += s.n_generated
                seconds[key] += s.t_total
                if depth != 0:
                    rounds[key] += s.rounds
                    accepted[key] += s.accepted
                    drafted[key] += s.drafted
                    for k, v in s.depth_rounds.items():
                        depth_rounds[key][k] += v
                    add_counts(drafted_at[key], s.drafted_at)
                    add_counts(accepted_at[key], s.accepted_at)
                    add_counts(histogram[key], s.accepted_histogram)
                    if res.tokens != plain:
                        exact[key] = False
    others_busy = meter.others_busy_cores(load_before, meter.snapshot())
    rows = []
    for content in prompt_sets:
        if not measured[content]:
            continue
        base = tokens[(content, "0")] / seconds[(content, "0")] if seconds[(content, "0")] else 0.0
        for depth in configs:
            key = (content, str(depth))
            tps = tokens[key] / seconds[key] if seconds[key] else 0.0
            row = {"content": content, "n_max": depth, "tokens_per_s": tps, "speedup": tps / base if base else 0.0,
                   "tokens": tokens[key], "seconds": seconds[key]}
            if depth != 0:
                row.update(mean_accepted=accepted[key] / rounds[key] if rounds[key] else 0.0,
                           acceptance_rate=accepted[key] / drafted[key] if drafted[key] else 0.0,
                           exact=exact[key], rounds=rounds[key],
                           depth_rounds={str(k): v for k, v in sorted(depth_rounds[key].items())},
                           accepted_histogram=histogram[key],
                           acceptance_by_position=[a / d if d else 0.0
                                                   for a, d in zip(accepted_at[key], drafted_at[key])])
            rows.append(row)
    result = {"rows": rows, "n_predict": n_predict, "repeats": repeats,
              "prompts": {k: len(v) for k, v in prompt_sets.items()},
              "machine_busy_cores": None if others_busy is None else round(others_busy, 2)}
    if interrupted:
        result["interrupted"] = True
        result["prompts_measured"] = {k: measured[k] for k in prompt_sets}
    return result


def add_counts(total: list[int], counts: list[int]) -> None:
    """Add ``counts`` into ``total`` element by element, lengthening it as needed."""
    total.extend([0] * (len(counts) - len(total)))
    for i, c in enumerate(counts):
        total[i] += c


def bench_table(result: dict) -> Table:
    t = Table(title="laguna-run bench (greedy; speedup vs plain decoding in the same process)",
              title_justify="left")
    for col in ("content", "n_max", "tokens/s", "speedup", "mean accepted", "exact"):
        t.add_column(col, justify="left" if col == "content" else "right")
    for r in result["rows"]:
        t.add_row(r["content"], str(r["n_max"]), f"{r['tokens_per_s']:.1f}", f"{r['speedup']:.2f}x",
                  f"{r['mean_accepted']:.2f}" if "mean_accepted" in r else "-",
                  ("yes" if r["exact"] else "NO") if "exact" in r else "-")
    return t


def acceptance_table(result: dict) -> Table:
    """Per content and depth: how many drafts each round accepted, and how often each position was."""
    t = Table(title="% of rounds that accepted 0, 1, 2, ... drafts; % of drafts accepted at position 1, 2, ...",
              title_justify="left")
    for col in ("content", "n_max", "rounds", "mean accepted", "% rounds by accepted", "% accepted by position"):
        t.add_column(col, justify="right" if col in ("n_max", "rounds", "mean accepted") else "left")
    for r in result["rows"]:
        if "accepted_histogram" not in r:
            continue
        rounds = r["rounds"] or 1
        t.add_row(r["content"], str(r["n_max"]), str(r["rounds"]), f"{r['mean_accepted']:.2f}",
                  " ".join(f"{100 * n / rounds:.0f}" for n in r["accepted_histogram"]),
                  " ".join(f"{100 * a:.0f}" for a in r["acceptance_by_position"]))
    return t


SWEEP_DEPTHS = [1, 2, 4, 8, 15, "auto"]
SWEEP_CONTENT = ("code", "table", "prose")


def plot(result: dict, png, format: str | None = None) -> None:
    """Three panels: speedup over plain decoding per content kind and depth; the share of rounds
    by drafts accepted; acceptance by draft position (one line per content kind and depth)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    contents = list(dict.fromkeys(r["content"] for r in result["rows"]))
    depths = [d for d in dict.fromkeys(r["n_max"] for r in result["rows"]) if d != 0]
    speed = {(r["content"], r["n_max"]): r["speedup"] for r in result["rows"]}
    spec = [r for r in result["rows"] if "accepted_histogram" in r]
    width_bars = 1.6 + 1.4 * len(contents) * max(1, len(depths)) / 4
    fig, (ax, ax_hist, ax_pos) = plt.subplots(1, 3, figsize=(width_bars + 9, 4.2), dpi=110,
                                              gridspec_kw={"width_ratios": [width_bars, 4.5, 4.5]})
    width = 0.8 / max(1, len(depths))
    for j, d in enumerate(depths):
        xs = [i + (j - (len(depths) - 1) / 2) * width for i in range(len(contents))]
        ax.bar(xs, [speed.get((c, d), 0.0) for c in contents], width, label=f"n_max {d}")
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
    ax.set_xticks(range(len(contents)), contents)
    ax.set_ylabel("speedup vs plain decoding")
    ax.set_title(result.get("title", "laguna-run bench"))
    ax.legend(fontsize=7, ncol=2)
    # a depth has its bars' colour in every panel; a content kind its line style and marker
    looks = {c: look for c, look in zip(contents, [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D")] * 8)}
    for r in spec:
        style, marker = looks[r["content"]]
        line = dict(color=f"C{depths.index(r['n_max']) % 10}", linestyle=style, marker=marker, markersize=3,
                    label=f"{r['content']} n_max {r['n_max']}")
        rounds = r["rounds"] or 1
        hist = r["accepted_histogram"]
        ax_hist.plot(range(len(hist)), [n / rounds for n in hist], **line)
        pos = r["acceptance_by_position"]
        ax_pos.plot(range(1, len(pos) + 1), pos, **line)
    for a in (ax_hist, ax_pos):
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_hist.set_xlabel("drafts accepted in a round")
    ax_hist.set_ylabel("share of rounds")
    ax_hist.set_title("accepted per round")
    ax_pos.set_xlabel("draft position")
    ax_pos.set_ylabel("accepted when drafted")
    ax_pos.set_ylim(0, 1.02)
    ax_pos.set_title("acceptance by position")
    if spec:
        ax_pos.legend(fontsize=6, ncol=1 + len(spec) // 8)
    fig.tight_layout()
    fig.savefig(png, format=format)
    plt.close(fig)
