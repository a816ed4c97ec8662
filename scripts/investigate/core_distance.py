#!/usr/bin/env python3
"""Two threads' pace against how far apart the host has put the two CPUs.

On a VM the host places and moves the virtual CPUs; a pass on two threads meets a barrier after
every operation, and a barrier costs about one round trip of a cache line between the two cores.
Each sample measures that round trip (scripts/bench/core_round_trip.c, compiled here with ``cc``,
its threads pinned to CPUs 0 and 1) and then times bursts of one-row steps of the tiny target in
one context on one thread and one on two (the order alternating, the first step of a burst
untimed), then the round trip again. Per sample the median ms of each burst; samples are split
by the round trip (both measurements under ``--near-ns``: near, both over: far, else mixed), and
per class the median ms on one and on two threads and their ratio.

    python -m scripts.investigate.core_distance --samples 40 --json core-distance.json
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from scripts.arguments import require_at_least
from scripts.recorded import command_line, write_json

SOURCE = Path(__file__).resolve().parents[1] / "bench" / "core_round_trip.c"


def build_round_trip(folder: Path) -> Path:
    if shutil.which("cc") is None:
        raise SystemExit("core_distance: needs a C compiler (cc) for scripts/bench/core_round_trip.c")
    binary = folder / "core_round_trip"
    subprocess.run(["cc", "-O2", "-pthread", str(SOURCE), "-o", str(binary)], check=True)
    return binary


def add_round_trip_args(ap: argparse.ArgumentParser) -> None:
    """The round trip's flags, as every probe that classes its samples by it takes them."""
    ap.add_argument("--rounds", type=int, default=200000, help="round trips per measurement")
    ap.add_argument("--near-ns", type=float, default=200.0, help="a round trip under this is near")


def round_trip_ns(binary: Path, rounds: int) -> float:
    out = subprocess.run([str(binary), "0", "1", str(rounds)], check=True, capture_output=True, text=True)
    return float(out.stdout)


def by_class(samples: list[dict]) -> dict[str, list[dict]]:
    """The samples of each class that has any, near first."""
    groups = {cls: [s for s in samples if s["class"] == cls] for cls in ("near", "far", "mixed")}
    return {cls: rows for cls, rows in groups.items() if rows}


def classify(before: float, after: float, near_ns: float) -> str:
    if before < near_ns and after < near_ns:
        return "near"
    if before >= near_ns and after >= near_ns:
        return "far"
    return "mixed"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--steps", type=int, default=60, help="one-row steps per burst")
    add_round_trip_args(ap)
    ap.add_argument("--pause", type=float, default=2.0, help="seconds between samples")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    require_at_least(ap, args, samples=1, steps=2, rounds=2)

    from rich.progress import Progress

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.cores import cpu_facts
    from laguna_dflash.runtime.llama import Context, ContextParams, Model

    samples: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp, Model(assets.TINY_TARGET) as model:
        binary = build_round_trip(Path(tmp))
        prompt = model.tokenize(assets.read_prompts(assets.CODE_PROMPTS)[0])[:96]
        contexts = {t: Context(model, ContextParams(n_ctx=1024, n_threads=t, kv_type="f16")) for t in (1, 2)}
        t_start = time.perf_counter()

        def burst(ctx) -> float:
            ctx.clear()
            ctx.decode(prompt, list(range(len(prompt))), logits="last")
            times = []
            for i in range(args.steps + 1):
                t0 = time.perf_counter()
                ctx.step(100 + i % 50, len(prompt) + i)
                times.append(time.perf_counter() - t0)
            return 1e3 * statistics.median(times[1:])

        try:
            with Progress() as progress:
                task = progress.add_task("samples", total=args.samples)
                for k in range(args.samples):
                    before = round_trip_ns(binary, args.rounds)
                    order = (1, 2) if k % 2 == 0 else (2, 1)
                    ms = {t: burst(contexts[t]) for t in order}
                    after = round_trip_ns(binary, args.rounds)
                    samples.append({"t_s": round(time.perf_counter() - t_start, 2), "round_trip_ns": [before, after],
                                    "class": classify(before, after, args.near_ns),
                                    "step_ms_1_thread": ms[1], "step_ms_2_threads": ms[2]})
                    progress.advance(task)
                    time.sleep(args.pause)
        finally:
            for ctx in contexts.values():
                ctx.close()

    summary = {}
    for cls, rows in by_class(samples).items():
        one = statistics.median(s["step_ms_1_thread"] for s in rows)
        two = statistics.median(s["step_ms_2_threads"] for s in rows)
        ratios = [s["step_ms_2_threads"] / s["step_ms_1_thread"] for s in rows]
        summary[cls] = {"samples": len(rows), "round_trip_ns_median": statistics.median(
            x for s in rows for x in s["round_trip_ns"]), "step_ms_1_thread": one, "step_ms_2_threads": two,
            "two_over_one": two / one, "two_over_one_per_sample": [min(ratios), max(ratios)]}
        print(f"{cls:5s} {len(rows):3d} samples, round trip {summary[cls]['round_trip_ns_median']:6.1f} ns: "
              f"one thread {one:.3f} ms, two {two:.3f} ms, two/one {two / one:.2f} "
              f"(per sample {min(ratios):.2f}-{max(ratios):.2f})")
    if args.json:
        write_json(args.json, {"command": command_line(__file__, argv), "cpu": cpu_facts(), "steps": args.steps,
                               "rounds": args.rounds, "near_ns": args.near_ns, "summary": summary,
                               "samples": samples})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
