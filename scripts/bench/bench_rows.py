#!/usr/bin/env python3
"""Pass time per row count at XS widths: llama-bench builds side by side, interleaved.

A verify of k drafts is one target pass of k+1 rows; what speculation gains on a CPU depends on
how that pass's time grows with the rows. This runs ``llama-bench -p ROWS -n 0`` for each
configuration in turn (A, B, C, A, B, C, ...), ``--rounds`` times with ``-r`` repetitions each,
collects every sample from llama-bench's JSON, and reports per configuration and row count the
median, min and max ms per pass and the median over the median one-row pass. The statistic
(median; spread min..max) is fixed here, before any run. Beside it, the statistic the kernel
judgments declare: per configuration and row count the median over the rounds of each round's
mean (its min-max), and against one configuration (``--against``, the last by default) the
ratio of those medians and the range of the rounds' own ratios.

A configuration is ``NAME=BINARY[:LIBDIR][:EXTRA ARGS]``: LIBDIR (optional) is put first on
LD_LIBRARY_PATH, before BINARY's folder, so one llama-bench binary can run over several builds of
libggml-cpu. Before it runs, each configuration's libggml-cpu is resolved as the loader will
(``ldd``); one that LIBDIR does not provide is an error, and the JSON records each file's path
and hash.

    python -m scripts.bench.bench_rows -m ~/.cache/laguna-dflash/costmodel/*/laguna-xs-shapes-L5-Q4_K_M.gguf \\
        --config "vendored=/work/kbuild/bench/llama-bench:/work/kbuild/libA" \\
        --config "patched=/work/kbuild/bench/llama-bench:/work/kbuild/libB" \\
        --config "ik=$HOME/.cache/laguna-dflash/peer/ik_llama.cpp/build/bin/llama-bench" \\
        --config "ik-rtr=$HOME/.cache/laguna-dflash/peer/ik_llama.cpp/build/bin/llama-bench::-rtr 1" \\
        --rounds 6 --json rows.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from scripts.recorded import command_line, write_json
from tests.helpers.ik_interop import peer_snapshot


@dataclass
class Config:
    name: str
    binary: str
    libdir: str
    extra: list[str]

    @classmethod
    def parse(cls, spec: str) -> "Config":
        name, _, rest = spec.partition("=")
        parts = rest.split(":", 2)
        binary = os.path.expanduser(parts[0])
        libdir = parts[1] if len(parts) > 1 else ""
        extra = shlex.split(parts[2]) if len(parts) > 2 else []
        if not name or not Path(binary).exists():
            raise SystemExit(f"--config {spec!r}: expected NAME=BINARY[:LIBDIR][:ARGS] with an existing BINARY")
        return cls(name, binary, libdir, extra)

    def env(self) -> dict[str, str]:
        """The environment BINARY runs in: LIBDIR first on LD_LIBRARY_PATH. The binary's own folder
        comes after it, for the tools' libraries (libllama-common); put first, a build folder's own
        libggml-cpu would shadow LIBDIR's."""
        env = dict(os.environ)
        if self.libdir:
            env["LD_LIBRARY_PATH"] = ":".join(p for p in (self.libdir, str(Path(self.binary).parent),
                                                          env.get("LD_LIBRARY_PATH", "")) if p)
        return env

    def ggml_cpu(self) -> dict[str, str | None]:
        """The libggml-cpu BINARY loads in ``env()``, as ``ldd`` resolves it (without LIBDIR, a
        build with ggml in one library, as ik_llama.cpp's, gives its libggml, and a binary with
        none, None): path and sha256 (16 hex digits). With a LIBDIR, a library from anywhere else
        exits with an error."""
        r = subprocess.run(["ldd", self.binary], env=self.env(), capture_output=True, text=True)
        resolved = {ln.split("=>", 1)[0].strip().split(".so", 1)[0]: ln.split("=>", 1)[1].split("(", 1)[0].strip()
                    for ln in r.stdout.splitlines() if "=>" in ln}
        found = resolved.get("libggml-cpu") or ("" if self.libdir else resolved.get("libggml"))
        if not found or not Path(found).is_file():
            if not self.libdir:
                return {"path": None, "sha256": None}
            raise SystemExit(f"--config {self.name}: {self.binary}: ldd finds no libggml-cpu")
        lib = Path(found).resolve()
        if self.libdir and Path(self.libdir).resolve() != lib.parent:
            raise SystemExit(f"--config {self.name}: {self.binary} loads {lib}, expected the libggml-cpu of LIBDIR "
                             f"{self.libdir}")
        return {"path": str(lib), "sha256": hashlib.sha256(lib.read_bytes()).hexdigest()[:16]}


def run_once(cfg: Config, model: Path, rows: list[int], threads: int, reps: int, fa: int, gen: int = 0
             ) -> tuple[dict[int, list[float]], str | None]:
    """Milliseconds per pass by row count, and the build's commit as llama-bench reports it.

    gen > 0: one-row passes of token generation (``-p 0 -n GEN``, each repetition's mean per token),
    under row count 1."""
    env = cfg.env()
    work = ["-p", "0", "-n", str(gen)] if gen else ["-p", ",".join(map(str, rows)), "-n", "0"]
    fa_arg = [] if "-fa" in cfg.extra else ["-fa", str(fa)]  # a configuration's own -fa wins
    cmd = [cfg.binary, "-m", str(model), *work, "-t", str(threads),
           "-r", str(reps), *fa_arg, "-o", "json", *cfg.extra]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{cfg.name}: {shlex.join(cmd)} failed:\n{r.stderr[-2000:]}")
    out: dict[int, list[float]] = {}
    build = None
    for test in json.loads(r.stdout):
        n = 1 if gen else int(test["n_prompt"])
        out.setdefault(n, []).extend(ns / 1e6 / max(gen, 1) for ns in test["samples_ns"])
        build = test.get("build_commit", build)
    return out, build


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=Path, required=True)
    ap.add_argument("--config", action="append", required=True, help="NAME=BINARY[:LIBDIR][:EXTRA ARGS]")
    ap.add_argument("--rows", default="1,2,3,4,5,8,9,16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds over all configurations")
    ap.add_argument("--reps", type=int, default=3, help="llama-bench -r per round")
    ap.add_argument("--gen", type=int, default=0,
                    help="time token generation instead: llama-bench -p 0 -n GEN, ms per step (--rows ignored)")
    ap.add_argument("--fa", type=int, default=1, help="llama-bench -fa (both builds' default resolves to 1)")
    ap.add_argument("--against", help="the configuration the round statistic's ratios divide by (default: the last)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path, help="ms per pass and ratio to one row, per configuration")
    ap.add_argument("--replot", type=Path, help="draw --png from a saved --json instead of running")
    if argv is None and "--replot" in sys.argv:  # -m and --config are not needed then
        argv = sys.argv[1:]
    if argv and "--replot" in argv:
        r = argparse.ArgumentParser()
        r.add_argument("--replot", type=Path, required=True)
        r.add_argument("--png", type=Path, required=True)
        a = r.parse_args(argv)
        d = json.loads(a.replot.read_text())
        configs = [Config(**c) for c in d["configs"]]
        table = {c: {int(n): e for n, e in t.items()} for c, t in d["table"].items()}
        plot(a.png, configs, sorted(next(iter(table.values()))), table, d["threads"])
        return 0
    args = ap.parse_args(argv)
    configs = [Config.parse(s) for s in args.config]
    against = args.against or configs[-1].name
    if against not in {c.name for c in configs}:
        ap.error(f"--against: expected one of the configurations' names {[c.name for c in configs]}, found {against!r}")
    libraries = {c.name: c.ggml_cpu() for c in configs}
    for name, lib in libraries.items():
        print(f"{name}: {lib['path']} (sha256 {lib['sha256']})")
    rows = [1] if args.gen else [int(x) for x in args.rows.split(",")]
    samples: dict[str, dict[int, list[float]]] = {c.name: {n: [] for n in rows} for c in configs}
    round_means: dict[str, dict[int, list[float]]] = {c.name: {n: [] for n in rows} for c in configs}
    t0 = time.time()
    load_avg = [os.getloadavg()]
    builds: dict[str, str | None] = {}
    for i in range(args.rounds):
        for c in configs:
            per_rows, builds[c.name] = run_once(c, args.model, rows, args.threads, args.reps, args.fa, args.gen)
            for n, v in per_rows.items():
                samples[c.name][n].extend(v)
                round_means[c.name][n].append(statistics.fmean(v))
        load_avg.append(os.getloadavg())
        if args.json:  # the samples so far, in case a later round is cut off
            write_json(args.json.with_suffix(".partial.json"),
                       {"rounds_done": i + 1, "load_avg_per_round": load_avg, "samples_ms": samples}, indent=None)
        print(f"round {i + 1}/{args.rounds} ({time.time() - t0:.0f} s, load {load_avg[-1][0]:.2f})", flush=True)
    table = {}
    for c in configs:
        base = statistics.median(samples[c.name][1]) if 1 in rows else None
        table[c.name] = {n: {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v),
                             "n": len(v), "x_one_row": statistics.median(v) / base if base else None}
                         for n, v in samples[c.name].items()}
    def by_sample(name: str, n: int) -> str:
        e = table[name][n]
        ratio = f" ({e['x_one_row']:.2f})" if e["x_one_row"] and n > 1 else ""
        return f"{e['median_ms']:.2f}{ratio} [{e['min_ms']:.2f}-{e['max_ms']:.2f}]"

    by_round = round_statistic(round_means, against)

    def by_round_mean(name: str, n: int) -> str:
        e = by_round[name][n]
        ratio = (f" ({e['x_against']:.3f} [{e['x_against_min']:.2f}-{e['x_against_max']:.2f}])"
                 if name != against else "")
        return f"{e['median_ms']:.2f} [{e['min_ms']:.2f}-{e['max_ms']:.2f}]{ratio}"

    print_table(configs, rows, by_sample)
    print(f"\nthe median over rounds of each round's mean, ms [rounds' min-max]; x {against}'s [rounds' ratios]")
    print_table(configs, rows, by_round_mean)
    if args.json:
        write_json(args.json, {"command": command_line(__file__, argv), "model": str(args.model),
                               "threads": args.threads, "gen": args.gen, "fa": args.fa,
                               "load_avg_per_round": load_avg, "wall_s": time.time() - t0,
                               "configs": [c.__dict__ for c in configs], "libggml_cpu": libraries,
                               "build_commit": builds,
                               "peer_snapshot": {c.name: peer_snapshot(Path(c.binary).parent) for c in configs},
                               "table": table, "against": against, "round_table": by_round,
                               "round_means_ms": round_means, "samples_ms": samples}, indent=1)
        args.json.with_suffix(".partial.json").unlink(missing_ok=True)  # the full record replaces it
    if args.png:
        plot(args.png, configs, rows, table, args.threads)
    return 0


def print_table(configs: list[Config], rows: list[int], cell) -> None:
    """A markdown table: a line per row count, a column per configuration, ``cell(name, rows)``."""
    print("| rows | " + " | ".join(c.name for c in configs) + " |")
    print("|---|" + "---|" * len(configs))
    for n in rows:
        print(f"| {n} | " + " | ".join(cell(c.name, n) for c in configs) + " |")


def round_statistic(round_means: dict[str, dict[int, list[float]]], against: str) -> dict:
    """Per configuration and row count: the median of the rounds' means and their min-max; and
    the ratio of that median to AGAINST's, with the range of the rounds' own ratios (round i of
    each configuration ran within the same round of the interleaving)."""
    out = {}
    for name, per_rows in round_means.items():
        out[name] = {}
        for n, means in per_rows.items():
            base = round_means[against][n]
            ratios = [m / b for m, b in zip(means, base)]
            out[name][n] = {"median_ms": statistics.median(means), "min_ms": min(means), "max_ms": max(means),
                            "rounds": len(means),
                            "x_against": statistics.median(means) / statistics.median(base),
                            "x_against_min": min(ratios), "x_against_max": max(ratios)}
    return out


def plot(path: Path, configs: list[Config], rows: list[int], table: dict, threads: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    # without a one-row pass (prompt passes only) the right panel compares the configurations
    # with the first one instead
    first = table[configs[0].name]
    for c in configs:
        t = table[c.name]
        med = [t[n]["median_ms"] for n in rows]
        err = [[m - t[n]["min_ms"] for n, m in zip(rows, med)], [t[n]["max_ms"] - m for n, m in zip(rows, med)]]
        ax1.errorbar(rows, med, yerr=err, marker="o", capsize=3, label=c.name)
        if 1 in rows:
            ax2.plot(rows, [t[n]["x_one_row"] for n in rows], marker="o", label=c.name)
        else:
            ax2.plot(rows, [m / first[n]["median_ms"] for n, m in zip(rows, med)], marker="o", label=c.name)
    ax1.set(xlabel="rows in the pass", ylabel="ms per pass (median, bars min-max)", title=f"pass time, {threads} thread(s)")
    if 1 in rows:
        ax2.set(xlabel="rows in the pass", ylabel="x the one-row pass", title="growth with rows")
    else:
        ax2.set(xlabel="rows in the pass", ylabel=f"median x {configs[0].name}'s", title=f"against {configs[0].name}")
    for ax in (ax1, ax2):
        ax.set_xticks(rows)
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
