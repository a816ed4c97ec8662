"""How the thread count copes with a busy machine: laguna-run with and without one competing
CPU-bound process, at the default thread count and at each fixed one.

    python scripts/bench/bench_busy.py --repeats 3 --json docs/busy-machine.json

A run is the README's command on the bundled pair (``laguna-run -f runtime/assets/prompts/demo.py
-n 96 --n-max 4 -t T --json``), timed whole (process start to exit, model load included) and by
its own decode tokens/s. The competitor is one Python busy loop, started before and stopped
after each run. Configurations run interleaved, ``--repeats`` rounds; reported: the median
(min-max) per configuration and, per situation, the default's median wall time over the best
fixed ``-t``'s (issue 32's bound: at most 2x with one competitor).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(1, str(ROOT / "scripts"))
from recorded import command_line  # noqa: E402

THREADS = {"default": 0, "-t 1": 1, "-t 2": 2}


def one_run(threads: int, busy: bool) -> tuple[float, float]:
    competitor = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        time.sleep(0.3 if busy else 0)
        t0 = time.perf_counter()
        out = subprocess.run([str(ROOT / ".venv/bin/laguna-run"), "-f", str(ROOT / "runtime/assets/prompts/demo.py"),
                              "-n", "96", "--n-max", "4", "-t", str(threads), "--json"],
                             capture_output=True, text=True, timeout=600)
        wall = time.perf_counter() - t0
    finally:
        if competitor:
            competitor.kill()
            competitor.wait()
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    return wall, json.loads(out.stdout)["stats"]["tokens_per_s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = {(b, name): [] for b in (False, True) for name in THREADS}
    for rep in range(args.repeats):
        for (busy, name) in results:
            results[(busy, name)].append(one_run(THREADS[name], busy))
        print(f"repetition {rep + 1} done", flush=True)
    rows = []
    for (busy, name), runs in results.items():
        walls, tps = [w for w, _ in runs], [t for _, t in runs if t is not None]
        rows.append({"competitor": busy, "threads": name, "wall_s": statistics.median(walls),
                     "wall_min": min(walls), "wall_max": max(walls),
                     "tokens_per_s": statistics.median(tps) if tps else None})
        print(f"| {'one busy loop' if busy else 'none'} | {name} | {rows[-1]['wall_s']:.2f} ({min(walls):.2f}-{max(walls):.2f}) | "
              f"{rows[-1]['tokens_per_s']} |")
    bound = {}
    for busy in (False, True):
        mine = {r["threads"]: r["wall_s"] for r in rows if r["competitor"] == busy}
        best = min(v for k, v in mine.items() if k != "default")
        bound["busy" if busy else "idle"] = round(mine["default"] / best, 3)
    print("default / best fixed -t (median wall):", bound)
    if args.json:
        args.json.write_text(json.dumps({"command": command_line(__file__), "rows": rows,
                                         "default_over_best": bound}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
