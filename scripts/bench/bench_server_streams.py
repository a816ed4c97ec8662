#!/usr/bin/env python3
"""Concurrent streams through a server: ``laguna-run serve --parallel C`` against ik_llama.cpp's
``llama-server -np C`` on the same files (the bundled code pair), issue 48.

    scripts/bench/build_peer.sh ik       # once: ik_llama.cpp's llama-server, outside the repo
    python -m scripts.bench.bench_server_streams --streams 4 --depth 4 --threads 2 --repeats 5 \\
        --json docs/results/concurrency/server-streams.json

Each server runs in its own process on a loopback port with ``C`` slots, an F16 cache, ``-t``
threads, the drafter at ``--depth`` (ik: ``--ik-depth``, ``--spec-type dflash:n_max=N``, its drafter
under the name ik looks for; ik's llama-server refuses a drafter with more than one slot, "limited
to a single server slot", so with several streams ik decodes plain, its only way at -np > 1) and, for laguna-run, no prompt cache (ik's slots keep theirs: every prompt
here is new to every slot's last one but for their shared first tokens). ``C`` client threads
send ``--requests`` greedy ``/v1/completions`` of ``--n-predict`` tokens on the first
``--prompt-tokens`` tokens of the code prompts (as text), each taking the next request when its
last one ends. A run's aggregate is the completion tokens the servers report over the run's wall
time. Statistic, fixed before the run: per server the median aggregate over ``--repeats``
repetitions, the servers alternating within each, with min-max; the ratio laguna-run / ik of the
medians.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

from scripts.bench.bench_agent_server import IkServer, ik_server_binary
from scripts.bench.bench_server import ServeProcess
from scripts.recorded import command_line, write_json
from tests.helpers.ik_interop import ik_named_copy, peer_snapshot

OURS, IK = "laguna-run", "ik_llama.cpp"


def start(server: str, streams: int, depth: int, threads: int, n_ctx: int, ik_binary: Path | None, lanes: int = 1):
    from laguna_dflash.runtime import assets

    drafter = assets.converted_tiny_drafter()
    if server == OURS:
        flags = ["-m", str(assets.TINY_TARGET), "--cache-type", "f16", "-c", str(n_ctx), "-t", str(threads),
                 "--parallel", str(streams), "--lanes", str(lanes), "--no-prompt-cache", "--n-max", str(depth)]
        if depth:
            flags += ["-md", str(drafter)]
        return ServeProcess(*flags)
    # -no-fa: with several slots ik's CPU flash attention aborts on this sliding-window target
    # ("found empty attention mask", iqk_flash_attn.cpp); laguna-run does not use flash attention either
    flags = ["-m", str(assets.TINY_TARGET), "-np", str(streams), "-c", str(n_ctx * streams), "-ctk", "f16",
             "-ctv", "f16", "-t", str(threads), "-tb", str(threads), "-no-fa"]
    if depth:
        flags += ["-md", str(ik_named_copy(drafter)), "--spec-type", f"dflash:n_max={depth}"]
    return IkServer(ik_binary, *flags)


def closed_loop(url: str, prompts: list[str], streams: int, n_predict: int) -> dict:
    import httpx

    queue = list(range(len(prompts)))
    lock = threading.Lock()
    tokens = [0] * len(prompts)
    texts = [""] * len(prompts)
    errors: list[BaseException] = []

    def client() -> None:
        with httpx.Client(timeout=600) as http:
            while True:
                with lock:
                    if not queue:
                        return
                    i = queue.pop(0)
                try:
                    r = http.post(url + "/v1/completions", json={"prompt": prompts[i], "max_tokens": n_predict,
                                                                 "temperature": 0})
                    r.raise_for_status()
                    body = r.json()
                    tokens[i] = body["usage"]["completion_tokens"]
                    texts[i] = body["choices"][0]["text"]
                except BaseException as e:
                    errors.append(e)
                    return

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return {"aggregate": sum(tokens) / wall, "tokens": sum(tokens), "wall": wall, "texts": texts}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--ik-depth", type=int, default=None,
                    help="ik_llama.cpp's dflash n_max (default: --depth with one stream, 0 with several)")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lanes", type=int, default=1, help="laguna-run serve --lanes (at most --streams)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ctx", type=int, default=1024, help="context per slot")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path, help="per-repetition aggregates of both servers")
    args = ap.parse_args(argv)
    for flag, value in (("--depth", args.depth), ("--ik-depth", args.ik_depth)):
        if value is not None and not 0 <= value <= 15:
            ap.error(f"{flag} {value}: expected a draft depth in 0..15 (0: plain)")
    if not 1 <= args.lanes <= args.streams:
        ap.error(f"--lanes {args.lanes}: expected 1..{args.streams} (at most --streams)")
    ik_depth = args.ik_depth if args.ik_depth is not None else (args.depth if args.streams == 1 else 0)
    if ik_depth and args.streams > 1:
        ap.error(f"--ik-depth {ik_depth}: ik_llama.cpp's llama-server speculates only with one slot; expected 0 "
                 f"with --streams {args.streams}")
    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.cores import CpuMeter
    from laguna_dflash.runtime.llama import Model

    ik_binary = ik_server_binary()
    servers = [OURS] + ([IK] if ik_binary else [])
    if not ik_binary:
        print("ik_llama.cpp's llama-server is not built (scripts/bench/build_peer.sh ik): laguna-run only")
    target = Model(assets.TINY_TARGET)
    texts = assets.read_prompts(assets.CODE_PROMPTS)
    prompts = [target.detokenize(target.tokenize(texts[i % len(texts)], add_special=False)[:args.prompt_tokens])
               .decode("utf-8", errors="replace") for i in range(args.requests)]
    target.close()
    depths = {OURS: args.depth, IK: ik_depth}
    procs = {s: start(s, args.streams, depths[s], args.threads, args.ctx, ik_binary, args.lanes) for s in servers}
    runs: dict[str, list[dict]] = {s: [] for s in servers}
    meter = CpuMeter()
    before = meter.snapshot()
    try:
        for rep in range(args.repeats):
            for s in servers:
                r = closed_loop(procs[s].url, prompts, args.streams, args.n_predict)
                runs[s].append(r)
                print(f"rep {rep + 1}/{args.repeats} {s}: {r['aggregate']:.1f} tok/s ({r['tokens']} tokens)", flush=True)
    finally:
        for p in procs.values():
            p.close()
    others = meter.others_busy_cores(before, meter.snapshot())
    table = {s: {"median": statistics.median(r["aggregate"] for r in rs), "min": min(r["aggregate"] for r in rs),
                 "max": max(r["aggregate"] for r in rs), "per_repetition": [r["aggregate"] for r in rs],
                 "tokens": [r["tokens"] for r in rs]} for s, rs in runs.items()}
    same = None
    if IK in runs:
        same = sum(a == b for a, b in zip(runs[OURS][0]["texts"], runs[IK][0]["texts"]))
    result = {"command": command_line(__file__, argv), "streams": args.streams, "depth": args.depth, "ik_depth": ik_depth,
              "threads": args.threads, "lanes": args.lanes, "requests": args.requests,
              "n_predict": args.n_predict,
              "prompt_tokens": args.prompt_tokens, "repeats": args.repeats, "others_busy_cores": others,
              "ik_snapshot": peer_snapshot(ik_binary.parent) if ik_binary else None, "servers": table,
              "texts_equal_between_servers": None if same is None else f"{same}/{len(prompts)}",
              "ratio_laguna_over_ik": table[OURS]["median"] / table[IK]["median"] if IK in table else None}
    for s, row in table.items():
        print(f"{s:14s} {row['median']:7.1f} tok/s ({row['min']:.1f}-{row['max']:.1f})")
    if result["ratio_laguna_over_ik"] is not None:
        print(f"laguna-run / ik: {result['ratio_laguna_over_ik']:.2f}x; texts equal: {result['texts_equal_between_servers']}")
    if args.json:
        write_json(args.json, result)
    if args.png:
        plot(result, args.png)
    return 0


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, row in result["servers"].items():
        depth = result["depth"] if name == OURS else result["ik_depth"]
        ax.plot(range(1, len(row["per_repetition"]) + 1), row["per_repetition"], "o-",
                label=f"{name} ({'plain' if depth == 0 else f'depth {depth}'}): median {row['median']:.0f}")
    ax.set_xlabel("repetition")
    ax.set_ylabel("aggregate tokens/s")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.set_title(f"{result['streams']} concurrent streams, -t {result['threads']}")
    fig.tight_layout()
    fig.savefig(png)


if __name__ == "__main__":
    raise SystemExit(main())
