#!/usr/bin/env python3
"""laguna-run against its peer ik_llama.cpp and the vendored llama.cpp's C++ decode, same GGUF pair.

    scripts/bench/build_peer.sh                                           # once: the peers, outside the repo
    python -m scripts.bench.bench_peer --json docs/results/peer/peer.json --png docs/results/peer/peer.png

On the bundled laguna-tiny pair (the drafter converted by ``laguna-gguf convert``), the first
``--prompts`` code prompts of runtime/data/prompts/code.txt, ``-n`` greedy tokens each, ``-t``
threads everywhere:

- laguna-run: plain decoding (n_max 0, drafter loaded), each ``--depths`` and ``auto``, in this
  process (one engine, as ``laguna-run bench`` does);
- ik_llama.cpp: ``llama-spec-bench`` without a drafter, and with ``--spec-type dflash:n_max=N``,
  one process per configuration (a short warm-up prompt first, left out of the figures);
- the C++ floor: the vendored llama.cpp's ``llama-bench -p 0 -n N -d D`` on the target alone, D
  the prompts' mean length (the context a generated token sees, on average, starts there).

Each repetition runs every system and configuration once, in a fixed order (interleaved, so a
busy spell of the shared machine falls on all alike). Tokens/s of one run = tokens generated
over the prompts / their generation time (prefill excluded, as both engines report it); the
statistic is the median over repetitions, the spread min/max. Also: speculative/plain ratio
(of medians), mean accepted drafts per round, and whether each system's speculative output
equals its own plain output in every repetition (token ids for laguna-run, text for ik).

``--baseline-lib DIR`` adds an earlier build of laguna-run's libraries (a copy of an installed
``llama_cpp/lib``) as one more system, "laguna-run (baseline)", run in a worker process with
``LLAMA_CPP_LIB_PATH=DIR`` in the same interleaved order, so a kernel change is judged against
the build before it on the same machine in the same minutes. ``--baseline-matrix-attention``
runs the baseline's target without flash attention, as the engine did before it used it.

Skips (exit 0, with a message) when ik_llama.cpp is not built. ik refuses drafters whose
pre-FFN norms are named ``blk.N.ffn_norm``; ``--rename-ffn-norm`` gives ik a copy with ik's name
(``check_ik_interop.py``) while laguna-run keeps the converter's file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scripts.recorded import command_line, write_results
from tests.helpers.ik_interop import (
    IkFailed, ik_bin_dir, ik_command, ik_named_copy, legacy_norm_tensors, peer_snapshot, run_ik, vendored_bin_dir)

OURS, IK, FLOOR = "laguna-run", "ik_llama.cpp", "llama.cpp C++ (vendored)"
BASELINE = "laguna-run (baseline)"
WARMUP_TOKENS = 8


def run_ours(engine, config, prompts: list[str], n_predict: int) -> dict:
    """One laguna-run configuration over the prompts: tokens, seconds, outputs, drafts accepted
    and speculative rounds."""
    from laguna_dflash.runtime.engine import GenerateOptions

    out = {"n": 0, "t": 0.0, "tokens": [], "accepted": 0, "rounds": 0}
    for p in prompts:
        res = engine.generate(p, GenerateOptions(n_predict=n_predict, n_max=config))
        out["n"] += res.stats.n_generated
        out["t"] += res.stats.t_total
        out["tokens"].append(res.tokens)
        if config != 0:
            out["accepted"] += res.stats.accepted
            out["rounds"] += sum(v for d, v in res.stats.depth_rounds.items() if d > 0)
    return out


def serve_configs(target: Path, drafter: Path, threads: int, matrix_attention: bool = False) -> int:
    """The baseline's worker: one engine, then one JSON request a line on stdin ({"config",
    "prompts", "n_predict"}) answered with run_ours's result on stdout."""
    from laguna_dflash.runtime import engine as engine_module
    from laguna_dflash.runtime.engine import Engine, EngineConfig

    if matrix_attention:
        engine_module.target_flash_attn = lambda cfg: False

    with Engine.load(target, drafter, EngineConfig(n_threads=threads)) as engine:
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            req = json.loads(line)
            print(json.dumps(run_ours(engine, req["config"], req["prompts"], req["n_predict"])), flush=True)
    return 0


class BaselineWorker:
    """laguna-run over an earlier build's libraries, in a process of its own."""

    def __init__(self, lib_dir: Path, target: Path, drafter: Path, threads: int, matrix_attention: bool = False) -> None:
        env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(lib_dir)}
        cmd = [sys.executable, "-m", "scripts.bench.bench_peer", "--serve-configs", "--drafter", str(drafter),
               "--target", str(target), "-t", str(threads)]
        if matrix_attention:
            cmd.append("--matrix-attention")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        if not self._reply().get("ready"):
            raise RuntimeError(f"the baseline worker over {lib_dir} did not start")

    def _reply(self) -> dict:
        """The worker's next JSON line (lines a library printed to stdout are passed over)."""
        for line in self.proc.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError("the baseline worker ended")

    def run(self, config, prompts: list[str], n_predict: int) -> dict:
        request = json.dumps({"config": config, "prompts": prompts, "n_predict": n_predict})
        self.proc.stdin.write(request + "\n")  # a line to the worker's pipe, not a result file
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def label(config) -> str:
    return "plain" if config == 0 else str(config)


def floor_command(bin_dir: Path, target: Path, n_predict: int, depth: int, threads: int) -> list[str]:
    return [str(bin_dir / "llama-bench"), "-m", str(target), "-p", "0", "-n", str(n_predict), "-d", str(depth),
            "-t", str(threads), "-r", "1", "-o", "json"]


def run_floor(cmd: list[str]) -> float:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"llama-bench exited with {r.returncode}: {r.stderr.strip().splitlines()[-1:]}")
    rows = json.loads(r.stdout)
    return float(rows[0]["avg_ts"])


def machine_lines(cpu: dict, peers: dict[str, Path | None], snapshots: dict[str, str | None]) -> list[str]:
    """What the figures were measured on, printed before them: the CPU (``cpu_facts``) and each
    peer build's snapshot (``peer_snapshot``)."""
    lines = [f"CPU: {cpu['model']}, {cpu['cores']} cores ({cpu['affinity_cores']} this process may use), "
             f"flags: {' '.join(cpu['flags']) or 'none'}"]
    for name, bin_dir in peers.items():
        if bin_dir is not None:
            lines.append(f"{name}: {snapshots[name] or 'snapshot unknown (not built by build_peer.sh)'} ({bin_dir})")
    return lines


def summarise(samples: list[float]) -> dict:
    return {"min": min(samples), "median": statistics.median(samples), "max": max(samples)}


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = [s for s in (OURS, BASELINE, IK) if s in result["systems"]]
    configs = list(result["systems"][OURS])
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=110)
    width = 0.8 / len(systems)
    for j, name in enumerate(systems):
        rows = result["systems"][name]
        xs, med, lo, hi = [], [], [], []
        for i, c in enumerate(configs):
            if c in rows:
                r = rows[c]
                xs.append(i + (j - (len(systems) - 1) / 2) * width)
                med.append(r["median"])
                lo.append(r["median"] - r["min"])
                hi.append(r["max"] - r["median"])
        ax.bar(xs, med, width, yerr=[lo, hi], capsize=3, label=name)
    floor = result.get("cpp_floor")
    if floor:
        ax.axhline(floor["median"], color="black", linestyle="--", linewidth=1,
                   label=f"{FLOOR} plain ({floor['median']:.0f})")
    ax.set_xticks(range(len(configs)), configs)
    ax.set_xlabel("draft depth (n_max)")
    ax.set_ylabel("tokens/s (median; bars: min-max)")
    s = result["settings"]
    load = result["machine"]["load_average"]["before"][1]
    ax.set_title(f"laguna-tiny, {s['prompts']} code prompts x {s['n_predict']} greedy tokens, -t {s['threads']}, "
                 f"{s['repetitions']} interleaved repetitions\n(5-min load average {load:.1f} on "
                 f"{result['machine']['cpus']} CPUs at the start)", fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repetitions", type=int, default=5, help="interleaved repetitions (>= 5 for a result)")
    ap.add_argument("--prompts", type=int, default=5, help="how many of runtime/data/prompts/code.txt's prompts")
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--depths", default="1,2,4,8", help="draft depths besides plain decoding (laguna-run also runs auto)")
    ap.add_argument("--drafter", type=Path, help="drafter GGUF (default: the bundled one, converted by laguna-gguf convert)")
    ap.add_argument("--rename-ffn-norm", action="store_true",
                    help="give ik a copy with blk.N.ffn_norm renamed to its blk.N.post_attention_norm")
    ap.add_argument("--baseline-lib", type=Path,
                    help="an earlier build's llama_cpp/lib, run as one more laguna-run system (a worker process)")
    ap.add_argument("--baseline-matrix-attention", action="store_true",
                    help="the baseline runs its target without flash attention")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path)
    ap.add_argument("--serve-configs", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--matrix-attention", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--target", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_configs:
        return serve_configs(args.target, args.drafter, args.threads, args.matrix_attention)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    console = Console(width=max(Console().width, 120))
    ik_bin = ik_bin_dir()
    if ik_bin is None:
        print("ik_llama.cpp is not built (scripts/bench/build_peer.sh builds it; IK_LLAMA_BIN names its bin "
                      "directory): peer benchmark skipped")
        return 0
    if args.repetitions < 1 or args.prompts < 1 or args.n_predict < 1:
        console.print("--repetitions, --prompts and -n: expected >= 1")
        return 2
    if args.baseline_lib and not (args.baseline_lib / "libllama.so").is_file():
        console.print(f"--baseline-lib {args.baseline_lib}: expected a llama_cpp/lib folder holding libllama.so")
        return 2
    depths = [int(d) for d in args.depths.split(",") if d.strip()]

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.cores import cpu_facts
    from laguna_dflash.runtime.engine import Engine, EngineConfig

    target = assets.TINY_TARGET
    drafter = args.drafter or assets.converted_tiny_drafter()
    ik_drafter = drafter
    if legacy_norm_tensors(drafter) and args.rename_ffn_norm:
        ik_drafter = ik_named_copy(drafter)
    prompts = assets.read_prompts(assets.CODE_PROMPTS)[:args.prompts]
    floor_bin = vendored_bin_dir()
    if floor_bin is None:
        console.print("the vendored llama.cpp's llama-bench is not built (scripts/bench/build_peer.sh vendored): "
                      "no C++ floor")
    peers = {IK: ik_bin, FLOOR: floor_bin}
    snapshots = {name: peer_snapshot(bin_dir) for name, bin_dir in peers.items()}
    for line in machine_lines(cpu_facts(), peers, snapshots):
        console.print(line, highlight=False, markup=False)

    ours_configs: list = [0, *depths, "auto"]
    ik_configs = [0, *depths]
    ours_systems = [OURS, BASELINE] if args.baseline_lib else [OURS]
    system_configs = [*((s, ours_configs) for s in ours_systems), (IK, ik_configs)]
    tps = {s: {label(c): [] for c in cfgs} for s, cfgs in system_configs}
    rounds = {s: {label(c): [0, 0] for c in cfgs} for s, cfgs in system_configs}
    equal = {s: {label(c): True for c in cfgs if c != 0} for s, cfgs in system_configs}
    same_plain_text = True  # ik's plain text equals laguna-run's plain text, every prompt
    floor_tps: list[float] = []
    load = {"before": os.getloadavg(), "per_repetition": []}  # 1-, 5-, 15-minute; 1-minute after each repetition

    baseline = (BaselineWorker(args.baseline_lib, target, drafter, args.threads, args.baseline_matrix_attention)
                if args.baseline_lib else None)
    with Engine.load(target, drafter, EngineConfig(n_threads=args.threads)) as engine:
        runners = {OURS: lambda c, ps, n: run_ours(engine, c, ps, n)}
        if baseline:
            runners[BASELINE] = baseline.run
        prompt_tokens = [len(engine.tokenize(p)) for p in prompts]
        floor_depth = round(statistics.mean(prompt_tokens))
        floor_cmd = floor_command(floor_bin, target, args.n_predict, floor_depth, args.threads) if floor_bin else None
        try:  # one short ik run first: a refused drafter ends the benchmark here, with ik's own words
            run_ik(ik_bin, target, ik_drafter, depths[0] if depths else 0, prompts[:1], WARMUP_TOKENS, args.threads)
        except IkFailed as e:
            console.print(f"[bold red]ik_llama.cpp refused the pair[/] ({ik_drafter}):", highlight=False)
            for line in e.lines:
                console.print(f"  ik: {line}", highlight=False, markup=False)
            if legacy_norm_tensors(ik_drafter):
                console.print("the drafter names its pre-FFN norms blk.N.ffn_norm; --rename-ffn-norm gives ik "
                              "a copy with its post_attention_norm name")
            return 1
        for c in ours_configs:  # warm-up: graph reservation and cold caches, as laguna-run bench does
            for run in runners.values():
                run(c, prompts[:1], WARMUP_TOKENS)

        per_rep = len(ours_configs) * len(runners) + len(ik_configs) + (1 if floor_cmd else 0)
        t_start = time.time()
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=True) as progress:
            task = progress.add_task("peer bench", total=args.repetitions * per_rep)
            for rep in range(args.repetitions):
                plain_ours = plain_ik = None
                for name, run in runners.items():
                    plain_tokens = None
                    for c in ours_configs:
                        progress.update(task, description=f"rep {rep + 1}: {name} {label(c)}")
                        res = run(c, prompts, args.n_predict)
                        tps[name][label(c)].append(res["n"] / res["t"])
                        if c != 0:
                            rounds[name][label(c)][0] += res["accepted"]
                            rounds[name][label(c)][1] += res["rounds"]
                        if c == 0:
                            plain_tokens = res["tokens"]
                            if name == OURS:
                                plain_ours = [engine.detokenize(o) for o in plain_tokens], plain_tokens
                        elif res["tokens"] != plain_tokens:
                            equal[name][label(c)] = False
                        progress.advance(task)
                for c in ik_configs:
                    progress.update(task, description=f"rep {rep + 1}: {IK} {label(c)}")
                    runs = run_ik(ik_bin, target, ik_drafter if c else None, c, prompts, args.n_predict,
                                  args.threads, warmup_tokens=WARMUP_TOKENS)
                    tps[IK][label(c)].append(sum(a.generated for a in runs) / sum(a.decode_s for a in runs))
                    texts = [a.text for a in runs]
                    if c == 0:
                        plain_ik = texts
                        same_plain_text &= texts == plain_ours[0]
                    else:
                        rounds[IK][label(c)][0] += sum(a.accepted for a in runs)
                        rounds[IK][label(c)][1] += sum(a.rounds for a in runs)
                        if texts != plain_ik:
                            equal[IK][label(c)] = False
                    progress.advance(task)
                if floor_cmd:
                    progress.update(task, description=f"rep {rep + 1}: {FLOOR}")
                    floor_tps.append(run_floor(floor_cmd))
                    progress.advance(task)
                load["per_repetition"].append(os.getloadavg()[0])
        wall = time.time() - t_start
    if baseline:
        baseline.close()
    load["after"] = os.getloadavg()

    systems: dict = {}
    for name in tps:
        plain = statistics.median(tps[name]["plain"])
        systems[name] = {}
        for cfg, samples in tps[name].items():
            row = {**summarise(samples), "samples": samples, "ratio_to_plain": statistics.median(samples) / plain}
            if cfg != "plain":
                acc, n_rounds = rounds[name][cfg]
                row.update(mean_accepted=acc / n_rounds if n_rounds else 0.0, equal_to_plain=equal[name][cfg])
            systems[name][cfg] = row
    # the best fixed depth of each (ik has no autotune here; laguna-run's auto is reported beside)
    best = {name: max((c for c in rows if c.isdigit()), key=lambda c: rows[c]["median"])
            for name, rows in systems.items()}
    verdict = {
        "ours_best_over_ik_best": systems[OURS][best[OURS]]["median"] / systems[IK][best[IK]]["median"],
        "ours_auto_over_ik_best": systems[OURS]["auto"]["median"] / systems[IK][best[IK]]["median"],
        "best_depth": best,
        "ours_plain_over_ik_plain": systems[OURS]["plain"]["median"] / systems[IK]["plain"]["median"],
        "ik_plain_text_equals_ours": same_plain_text,
    }
    if baseline:
        verdict["ours_over_baseline"] = {c: systems[OURS][c]["median"] / systems[BASELINE][c]["median"]
                                         for c in systems[OURS]}
    result = {
        "command": command_line(__file__, argv),
        "statistic": "median over repetitions of tokens generated / generation seconds (prefill excluded) "
                     "over all prompts; spread min/max; ratio_to_plain = median / plain median of the same system",
        "settings": {"prompts": len(prompts), "prompt_tokens": prompt_tokens, "n_predict": args.n_predict,
                     "threads": args.threads, "repetitions": args.repetitions, "depths": depths,
                     "baseline_lib": str(args.baseline_lib) if args.baseline_lib else None,
                     "baseline_matrix_attention": bool(args.baseline_lib and args.baseline_matrix_attention),
                     "target": target.name, "drafter": drafter.name, "ik_drafter": ik_drafter.name},
        "peer_snapshot": snapshots,
        "commands": {IK: ik_command(ik_bin, target, ik_drafter, 4, Path("PROMPTS.jsonl"), args.n_predict,
                                    args.threads),
                     FLOOR: floor_cmd},
        "machine": {"cpus": os.cpu_count(), "load_average": load, "wall_s": wall},
        "systems": systems,
        "verdict": verdict,
    }
    if floor_tps:
        result["cpp_floor"] = {**summarise(floor_tps), "samples": floor_tps, "n_depth": floor_depth}
        verdict["ours_plain_over_cpp_floor"] = systems[OURS]["plain"]["median"] / result["cpp_floor"]["median"]

    table = Table(title=f"tokens/s, {len(prompts)} code prompts x {args.n_predict} greedy tokens, -t {args.threads}, "
                        f"{args.repetitions} interleaved repetitions (median, min-max)", title_justify="left")
    for col in ("system", "n_max", "median", "min", "max", "vs plain", "mean accepted", "= plain"):
        table.add_column(col, justify="left" if col == "system" else "right")
    for name, rows in systems.items():
        for cfg, r in rows.items():
            table.add_row(name, cfg, f"{r['median']:.1f}", f"{r['min']:.1f}", f"{r['max']:.1f}",
                          f"{r['ratio_to_plain']:.2f}x", f"{r['mean_accepted']:.2f}" if "mean_accepted" in r else "-",
                          ("yes" if r["equal_to_plain"] else "NO") if "equal_to_plain" in r else "-")
    if floor_tps:
        f = result["cpp_floor"]
        table.add_row(FLOOR, "plain", f"{f['median']:.1f}", f"{f['min']:.1f}", f"{f['max']:.1f}", "-", "-", "-")
    console.print(table)
    console.print(f"laguna-run plain / ik plain, medians: {verdict['ours_plain_over_ik_plain']:.2f}x")
    if baseline:
        console.print("laguna-run / its baseline build, medians: " + ", ".join(
            f"{c} {r:.2f}x" for c, r in verdict["ours_over_baseline"].items()))
    console.print(f"laguna-run best fixed depth ({best[OURS]}) / ik best depth ({best[IK]}), medians: "
                  f"{verdict['ours_best_over_ik_best']:.2f}x (laguna-run auto: "
                  f"{systems[OURS]['auto']['median'] / systems[IK][best[IK]]['median']:.2f}x)")
    if floor_tps:
        console.print(f"laguna-run plain / C++ floor, medians: {verdict['ours_plain_over_cpp_floor']:.2f}x")
    console.print(f"ik plain text equals laguna-run plain text on every prompt: {'yes' if same_plain_text else 'no'}")
    write_results(result, args.json, args.png, plot, console, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
