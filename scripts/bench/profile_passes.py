#!/usr/bin/env python3
"""Where a llama-bench pass spends its time, per kernel: perf samples per symbol, builds side by side.

For each configuration (``NAME=BINARY[:LIBDIR][:EXTRA ARGS]``, as in bench_rows.py), model and row
count, ``perf record`` runs ``llama-bench -p ROWS -n 0`` twice, with ``-r SHORT`` and ``-r LONG``
repetitions; a symbol's samples in the short run (model load, repack, warm-up, teardown, SHORT
passes) are subtracted from the long run's, leaving LONG - SHORT passes: ms per pass per symbol,
with no guess about where the load ends. Symbols of the load and of the C/C++ runtime (the
operating system's, repack_*, mem*, malloc, std::, the vocabulary) are left out of the table and
its total: their share of the load varies from run to run by more than a pass costs; the operating
system's samples are summed apart (``os_ms_per_pass``: where threads wait in the kernel). The pass
time llama-bench measured in the long run is printed next to the total for comparison. ``--gen N``
profiles token generation instead (``-p 0 -n N``: N one-row steps a repetition, as plain decoding
runs them), per step. With ``--threads 2`` a sample is one thread's: the per-symbol sum is time on
the cores, up to twice the wall time.
perf's sampling clock is ``cpu-clock`` where the machine has no hardware counters (a VM), so a
sample is time on a core, not cycles. LIBDIR goes first on LD_LIBRARY_PATH, before BINARY's
folder (bench_rows.Config.env).

    python -m scripts.bench.profile_passes -m ~/.cache/laguna-dflash/costmodel/*/laguna-xs-shapes-L5-Q4_K_M.gguf \\
        --config "ours=$BUILD/llama-bench:$LIBDIR" \\
        --config "ik-rtr=$HOME/.cache/laguna-dflash/peer/ik_llama.cpp/build/bin/llama-bench::-rtr 1" \\
        --rows 1,5 --json profile.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from scripts.bench.bench_rows import Config
from scripts.recorded import command_line, write_json

#: "  12.34%   5678  libfoo.so  [.] symbol" lines of `perf report -n --sort dso,sym --stdio`
_LINE = re.compile(r"^\s*[\d.]+%\s+(\d+)\s+(\S+)\s+\[(.)\]\s+(.+?)\s*$")
#: user-space symbols of the model load and the runtime libraries, not of a pass's kernels
_LOAD = re.compile(r"^(repack_|__mem|mem(cpy|set|move|cmp)|_int_|malloc|free|std::|llama_vocab|llama_model_loader)")

#: the operating system's samples, summed (futex waits and wake-ups of a barrier among them), reported apart
OS = "[kernel]"


def samples(cfg: Config, model: Path, rows: int, reps: int, threads: int, freq: int, fa: int, gen: int = 0
            ) -> tuple[dict[str, int], float]:
    """Samples per kernel symbol of one llama-bench run under perf record, and its mean ms per pass.

    gen > 0: the passes are llama-bench's token generation (``-p 0 -n GEN``: GEN one-row passes a
    repetition, each after the last, the graph reused), not one ``-p ROWS`` batch."""
    env = cfg.env()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "perf.data"
        cmd = ["perf", "record", "-q", "-F", str(freq), "-o", str(data), "--", cfg.binary, "-m", str(model),
               *(["-p", "0", "-n", str(gen)] if gen else ["-p", str(rows), "-n", "0"]),
               "-t", str(threads), "-r", str(reps), *([] if "-fa" in cfg.extra else ["-fa", str(fa)]),
               "-o", "json", *cfg.extra]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{cfg.name}: {' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
        rep = subprocess.run(["perf", "report", "-i", str(data), "-n", "--sort", "dso,sym", "--stdio"],
                             capture_output=True, text=True, check=True).stdout
    out: dict[str, int] = {}
    for line in rep.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        # a library without symbols (libgomp: OpenMP's barrier) is summed under its name
        name = f"{m[2]} (no symbols)" if m[4].startswith("0x") else m[4]
        if m[3] == "k":
            out[OS] = out.get(OS, 0) + int(m[1])
        elif not _LOAD.match(name):
            out[name] = out.get(name, 0) + int(m[1])
    return out, json.loads(r.stdout)[0]["avg_ns"] / 1e6 / max(gen, 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=Path, action="append", required=True, help="one or more models")
    ap.add_argument("--config", action="append", required=True, help="NAME=BINARY[:LIBDIR][:EXTRA ARGS]")
    ap.add_argument("--rows", default="1,5")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--short", type=int, default=2, help="llama-bench -r of the run subtracted")
    ap.add_argument("--long", type=int, default=22, help="llama-bench -r of the run kept")
    ap.add_argument("--freq", type=int, default=4999, help="perf record -F (samples per second)")
    ap.add_argument("--gen", type=int, default=0,
                    help="profile token generation instead: llama-bench -p 0 -n GEN (one-row steps; --rows ignored)")
    ap.add_argument("--fa", type=int, default=1, help="llama-bench -fa (laguna-run's engine runs without: 0)")
    ap.add_argument("--top", type=int, default=8, help="symbols printed per run")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    configs = [Config.parse(s) for s in args.config]
    for c in configs:
        c.ggml_cpu()  # exits if LIBDIR does not provide the libggml-cpu the binary loads
    rows = [1] if args.gen else [int(x) for x in args.rows.split(",")]
    passes = (args.long - args.short) * max(args.gen, 1)
    ms_per_sample = 1e3 / args.freq
    results = []
    for model in args.model:
        for n in rows:
            for c in configs:
                long, pass_ms = samples(c, model, n, args.long, args.threads, args.freq, args.fa, args.gen)
                short, _ = samples(c, model, n, args.short, args.threads, args.freq, args.fa, args.gen)
                per_pass = {s: (v - short.get(s, 0)) * ms_per_sample / passes for s, v in long.items()}
                os_ms = per_pass.pop(OS, 0.0)
                total = sum(v for v in per_pass.values() if v > 0)
                top = sorted(per_pass.items(), key=lambda kv: -kv[1])
                results.append({"model": model.name, "rows": n, "config": c.name, "ms_per_pass_total": total,
                                "llama_bench_ms_per_pass": pass_ms,
                                "os_ms_per_pass": os_ms,
                                "ms_per_pass": {s: v for s, v in top if abs(v) >= min(0.05, 0.005 * total)}})
                print(f"{model.name} rows {n} {c.name}: {total:.3f} ms of kernel samples per pass (and {os_ms:.3f} "
                      f"in the OS), llama-bench {pass_ms:.3f} ms (load average {os.getloadavg()[0]:.2f})")
                for s, v in top[:args.top]:
                    print(f"  {v:7.3f} ms  {100 * v / total:5.1f}%  {s[:90]}")
    if args.json:
        write_json(args.json, {"command": command_line(__file__, argv), "threads": args.threads, "fa": args.fa,
                               "gen": args.gen, "passes": passes, "freq": args.freq,
                               "configs": [c.__dict__ for c in configs], "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
