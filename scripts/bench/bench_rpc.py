"""Plain and speculative tokens/s with the target local and over llama.cpp's RPC backend on
loopback, with an added per-call latency, measured in one run.

    python -m scripts.bench.bench_rpc --json docs/results/rpc/rpc.json --png docs/results/rpc/rpc.png

The bundled laguna-tiny pair (greedy, F16 cache). Configurations, all loaded at once and run in
turn (interleaved: prompt by prompt, repeat by repeat, so the machine's noise falls on all):

- ``local``: the target on this process's CPU (``-t 1``);
- ``rpc``: every target layer on a laguna-rpc-server (``--threads 1``) reached directly;
- ``rpc+Nms``: the same through scripts/bench/delay_proxy.py, which delays everything the client
  sends by N ms (so each command that waits for an answer costs N ms more) and counts bytes;
- ``rpc[LABEL]`` for each ``--server LABEL=PATH``: the same as ``rpc`` on that rpc-server binary
  (e.g. another wheel's ``llama_cpp/lib/ggml-rpc-server``, for an A/B of a server patch in one run).

The drafter and the target's head stay in the client (laguna-run's default with --rpc). For
each configuration and depth: tokens/s of each repeat (generated tokens over generation time,
summed over the prompts), reported as min/median/max over repeats; for the proxied ones, the
bytes sent each way per generated token. The speculative/plain ratio is taken per repeat.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scripts.bench.delay_proxy import DelayProxy
from scripts.recorded import command_line, write_results


def start_server(port: int, threads: int, binary: Path | None = None) -> subprocess.Popen:
    from laguna_dflash.runtime import rpc

    script = Path(sys.executable).parent / "laguna-rpc-server"
    if binary is not None:
        cmd = [str(binary), "--host", "127.0.0.1"]
    elif script.exists():
        cmd = [str(script)]
    else:
        cmd = [sys.executable, "-m", "laguna_dflash.runtime.rpc_server"]
    proc = subprocess.Popen([*cmd, "--port", str(port), "--threads", str(threads)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            rpc.probe(f"127.0.0.1:{port}", timeout=1.0)
            return proc
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.05)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spread(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "runs": values}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--latencies", default="0,1,5", help="added per-call latencies in ms (proxied configurations)")
    ap.add_argument("--depths", default="0,2,4,auto")
    ap.add_argument("-n", "--n-predict", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=5, help="how many of the bundled code prompts")
    ap.add_argument("-t", "--threads", type=int, default=1, help="client threads, and each server's")
    ap.add_argument("--server", action="append", default=[], metavar="LABEL=PATH",
                    help="another rpc-server binary, run as configuration rpc[LABEL] (repeatable)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path)
    args = ap.parse_args()

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions

    console = Console(stderr=True)
    latencies = [float(x) for x in args.latencies.split(",") if x]  # "": no proxied configurations
    servers = [tuple(spec.split("=", 1)) for spec in args.server]
    for spec in servers:
        if len(spec) != 2 or not Path(spec[1]).is_file():
            ap.error(f"--server: expected LABEL=PATH of an rpc-server binary, found {'='.join(spec)!r}")
    depths = [d if d == "auto" else int(d) for d in args.depths.split(",")]
    prompts = assets.read_prompts(assets.CODE_PROMPTS)[:args.prompts]
    target, drafter = assets.default_pair(None)
    load_before = os.getloadavg()

    procs, proxies, engines = [], [], {}
    try:
        base = dict(n_ctx=2048, n_threads=args.threads, prompt_cache=False)
        engines["local"] = Engine.load(target, drafter, EngineConfig(**base))
        port = free_port()
        procs.append(start_server(port, args.threads))
        engines["rpc"] = Engine.load(target, drafter, EngineConfig(**base, rpc=(f"127.0.0.1:{port}",)))
        for label, binary in servers:
            port = free_port()
            procs.append(start_server(port, args.threads, Path(binary)))
            engines[f"rpc[{label}]"] = Engine.load(target, drafter, EngineConfig(**base, rpc=(f"127.0.0.1:{port}",)))
        for ms in latencies:
            port = free_port()
            procs.append(start_server(port, args.threads))
            proxy = DelayProxy(f"127.0.0.1:{port}", ms)
            proxies.append((f"rpc+{ms:g}ms", proxy))
            engines[f"rpc+{ms:g}ms"] = Engine.load(target, drafter, EngineConfig(**base, rpc=(proxy.endpoint,)))
        proxy_of = dict(proxies)
        names = list(engines)
        # warm-up: one generation per configuration and depth, not recorded
        for name in names:
            for d in depths:
                engines[name].generate(prompts[0], GenerateOptions(n_predict=8, n_max=d))

        tokens = {(n, str(d)): [0] * args.repeats for n in names for d in depths}
        seconds = {(n, str(d)): [0.0] * args.repeats for n in names for d in depths}
        traffic = {(n, str(d)): [0, 0] for n in proxy_of for d in depths}
        outputs = {}
        total = args.repeats * len(prompts) * len(names) * len(depths)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as bar:
            task = bar.add_task("rpc bench", total=total)
            for r in range(args.repeats):
                for i, prompt in enumerate(prompts):
                    for name in names:
                        for d in depths:
                            bar.update(task, description=f"repeat {r + 1} prompt {i + 1} {name} n_max {d}")
                            proxy = proxy_of.get(name)
                            c0 = proxy.counters() if proxy else (0, 0)
                            res = engines[name].generate(prompt, GenerateOptions(n_predict=args.n_predict, n_max=d))
                            key = (name, str(d))
                            tokens[key][r] += res.stats.n_generated
                            seconds[key][r] += res.stats.t_total
                            if proxy:
                                c1 = proxy.counters()
                                traffic[key][0] += c1[0] - c0[0]
                                traffic[key][1] += c1[1] - c0[1]
                            if d == 0 and r == 0:
                                outputs.setdefault(i, {})[name] = res.tokens
                            bar.advance(task)
    finally:
        for e in engines.values():
            e.close()
        for _, p in proxies:
            p.close()
        for p in procs:
            p.kill()
            p.wait(10)
    load_after = os.getloadavg()

    rows = []
    for name in names:
        for d in depths:
            key = (name, str(d))
            tps = [t / s for t, s in zip(tokens[key], seconds[key])]
            plain = [t / s for t, s in zip(tokens[(name, "0")], seconds[(name, "0")])] if 0 in depths else None
            row = {"config": name, "n_max": d, "tokens_per_s": spread(tps)}
            if plain and d != 0:
                row["vs_plain"] = spread([a / b for a, b in zip(tps, plain)])
            if key in traffic:
                n_tok = sum(tokens[key])
                row["bytes_per_token"] = {"sent": traffic[key][0] / n_tok, "received": traffic[key][1] / n_tok}
            rows.append(row)
    same = all(len({tuple(v) for v in per.values()}) == 1 for per in outputs.values())
    result = {
        "command": command_line(__file__),
        "pair": {"target": Path(target).name, "drafter": Path(drafter).name},
        "n_predict": args.n_predict, "repeats": args.repeats, "prompts": len(prompts), "threads": args.threads,
        "statistic": "per repeat: generated tokens / generation time, summed over the prompts; min/median/max "
                     "over repeats",
        "plain_outputs_equal_across_configs": same,
        "loadavg_before": load_before, "loadavg_after": load_after,
        "rows": rows,
    }
    print_table(result, console)
    write_results(result, args.json, args.png, plot, console)
    return 0


def print_table(result: dict, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    t = Table(title="tokens/s (median of repeats; min-max)")
    t.add_column("config")
    t.add_column("n_max")
    t.add_column("tok/s", justify="right")
    t.add_column("vs plain", justify="right")
    t.add_column("bytes/token sent/recv", justify="right")
    for row in result["rows"]:
        s = row["tokens_per_s"]
        v = row.get("vs_plain")
        b = row.get("bytes_per_token")
        t.add_row(escape(row["config"]), str(row["n_max"]), f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})",
                  f"{v['median']:.2f}x" if v else "", f"{b['sent']:.0f} / {b['received']:.0f}" if b else "")
    console.print(t)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    configs = list(dict.fromkeys(r["config"] for r in rows))
    depths = list(dict.fromkeys(str(r["n_max"]) for r in rows))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for d in depths:
        ys = [next(r for r in rows if r["config"] == c and str(r["n_max"]) == d)["tokens_per_s"] for c in configs]
        ax1.errorbar(range(len(configs)), [y["median"] for y in ys],
                     yerr=[[y["median"] - y["min"] for y in ys], [y["max"] - y["median"] for y in ys]],
                     marker="o", capsize=3, label=f"n_max {d}")
        if d != "0":
            vs = [next(r for r in rows if r["config"] == c and str(r["n_max"]) == d).get("vs_plain") for c in configs]
            ax2.plot(range(len(configs)), [v["median"] for v in vs], marker="o", label=f"n_max {d}")
    for ax in (ax1, ax2):
        ax.set_xticks(range(len(configs)), configs)
        ax.grid(alpha=0.3)
        ax.legend()
    ax1.set_ylabel("tokens/s (median, min-max over repeats)")
    ax2.set_ylabel("speculative / plain (median)")
    ax2.axhline(1.0, color="grey", lw=0.8)
    fig.suptitle("laguna-tiny over llama.cpp RPC on loopback, added per-call latency")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
