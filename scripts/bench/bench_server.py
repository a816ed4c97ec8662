"""laguna-run serve against the Python API, and the prompt cache's time to first token.

    python -m scripts.bench.bench_server --json docs/results/server/server-bench.json

Two measurements on the bundled laguna-tiny pair, greedy, n_max 4, each with the server a
separate process (``laguna-run serve`` on 127.0.0.1, an ephemeral port) and this process the
client:

1. **Overhead.** The held-out code prompts, ``--n-predict`` tokens each, through the Python
   API (``Engine.generate`` in this process) and through HTTP (``/v1/completions``, non-streamed
   and streamed), with the same flags and the prompt cache off on both sides, one at a time
   (the two never run together). Per repetition and way: tokens / wall time measured around the
   call at the client (prefill, generation, HTTP and JSON included), summed over the prompts.
   Statistic, fixed before the run: the median over repetitions of the per-repetition ratio
   HTTP / Python API; spread: its min and max. The order of the three ways rotates. Beside it,
   the CPU time per generated token of each way (this process's for the Python API; the server
   process's plus this client's for HTTP), which a busy machine's other work moves less.
2. **Time to first token of a chat's turns 2..5**, streamed, against a server with the prompt
   cache and one with ``--no-prompt-cache``. Each user turn is a held-out code prompt; each
   assistant turn is what the server answered (``--turn-tokens``), sent back in the next
   request, as chat clients do. TTFT = request sent to the first content chunk received.
   Statistic: the median over ``--repeats`` conversations per turn, min and max beside it; the
   two servers alternate conversation by conversation.
"""

from __future__ import annotations

import argparse
import json
import queue
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from scripts.recorded import command_line, write_json

REPO = Path(__file__).resolve().parents[2]

# Laguna-style turns for the bundled target, whose GGUF carries no chat template
TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


class ServeProcess:
    """``laguna-run serve`` in a subprocess on an ephemeral port."""

    def __init__(self, *flags: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "laguna_dflash.runtime.cli", "serve", "--port", "0", *flags],
                                     stderr=subprocess.PIPE, text=True, cwd=REPO)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(ln) for ln in self.proc.stderr], daemon=True).start()
        deadline, seen = time.monotonic() + 300, []
        while True:
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("laguna-run serve did not start:\n" + "".join(seen)) from None
                continue
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", seen[-1])
            if m:
                self.url = m.group(1)
                return

    def cpu_s(self) -> float:
        """User + system CPU seconds of the server process so far."""
        import os

        f = open(f"/proc/{self.proc.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        stop(self.proc)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 30 s: a server that ignores its signal still goes."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def overhead(args, prompts, flags) -> dict:
    import httpx

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions

    engine = Engine.load(assets.TINY_TARGET, assets.converted_tiny_drafter(),
                         EngineConfig(n_ctx=args.ctx, n_threads=args.threads, prompt_cache=False))
    srv = ServeProcess(*flags, "--no-prompt-cache")
    ways = ["python", "http", "http-stream"]
    reps = []
    try:
        with httpx.Client(base_url=srv.url, timeout=600) as h:
            def http(prompt, stream):
                body = {"prompt": prompt, "max_tokens": args.n_predict, "n_max": 4, "stream": stream}
                if not stream:
                    r = h.post("/v1/completions", json=body).json()
                    return r["usage"]["completion_tokens"], r["choices"][0]["text"]
                text, n = [], 0
                with h.stream("POST", "/v1/completions", json=body) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: {"):
                            chunk = json.loads(line[6:])
                            text.append(chunk["choices"][0]["text"])
                            n = chunk.get("usage", {}).get("completion_tokens", n)
                return n, "".join(text)

            def python(prompt):
                res = engine.generate(prompt, GenerateOptions(n_predict=args.n_predict, n_max=4))
                return len(res.tokens), res.text

            http(prompts[0], False)  # warm both sides once
            python(prompts[0])
            for rep in range(args.repeats):
                tokens = dict.fromkeys(ways, 0)
                secs = dict.fromkeys(ways, 0.0)
                cpu = dict.fromkeys(ways, 0.0)
                for i, prompt in enumerate(prompts):
                    order = ways[(rep + i) % 3:] + ways[:(rep + i) % 3]
                    texts = {}
                    for way in order:
                        c0 = time.process_time() + (0.0 if way == "python" else srv.cpu_s())
                        t0 = time.perf_counter()
                        n, texts[way] = python(prompt) if way == "python" else http(prompt, way == "http-stream")
                        secs[way] += time.perf_counter() - t0
                        cpu[way] += time.process_time() + (0.0 if way == "python" else srv.cpu_s()) - c0
                        tokens[way] += n
                    if len(set(texts.values())) != 1:
                        print(f"  note: outputs differ between ways on prompt {i} (F16 cache near-tie)", file=sys.stderr)
                tps = {w: tokens[w] / secs[w] for w in ways}
                tps.update({f"{w}_cpu_ms_per_token": cpu[w] / tokens[w] * 1e3 for w in ways})
                reps.append(tps)
                print(f"  overhead rep {rep + 1}: " + ", ".join(f"{w} {tps[w]:.1f} tok/s" for w in ways), file=sys.stderr)
    finally:
        srv.close()
        engine.close()
    out = {"repeats": reps}
    for way in ("http", "http-stream"):
        ratios = [r[way] / r["python"] for r in reps]
        cpu = [r[f"{way}_cpu_ms_per_token"] / r["python_cpu_ms_per_token"] for r in reps]
        out[way] = {"median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios),
                    "median_tokens_per_s": statistics.median(r[way] for r in reps),
                    "median_cpu_ratio": statistics.median(cpu), "min_cpu_ratio": min(cpu), "max_cpu_ratio": max(cpu),
                    "median_cpu_ms_per_token": statistics.median(r[f"{way}_cpu_ms_per_token"] for r in reps)}
    out["python"] = {"median_tokens_per_s": statistics.median(r["python"] for r in reps),
                     "median_cpu_ms_per_token": statistics.median(r["python_cpu_ms_per_token"] for r in reps)}
    return out


def ttft(args, turns, flags) -> dict:
    import httpx

    servers = {"cache": ServeProcess(*flags), "no-cache": ServeProcess(*flags, "--no-prompt-cache")}
    results = {k: [] for k in servers}  # mode -> conversations -> turns
    try:
        clients = {k: httpx.Client(base_url=s.url, timeout=600) for k, s in servers.items()}
        for rep in range(args.repeats):
            for mode in (("cache", "no-cache") if rep % 2 == 0 else ("no-cache", "cache")):
                h = clients[mode]
                # a distinct system line per conversation, so no conversation finds another's turns cached
                messages = [{"role": "system", "content": f"Conversation {rep}: you complete Python code."}]
                conv = []
                for user in turns:
                    messages.append({"role": "user", "content": user})
                    body = {"messages": messages, "max_tokens": args.turn_tokens, "n_max": 4, "stream": True}
                    t0 = time.perf_counter()
                    first, text, usage = None, [], {}
                    with h.stream("POST", "/v1/chat/completions", json=body) as r:
                        for line in r.iter_lines():
                            if not line.startswith("data: {"):
                                continue
                            chunk = json.loads(line[6:])
                            delta = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
                            if delta and first is None:
                                first = time.perf_counter() - t0
                            if delta:
                                text.append(delta)
                            usage = chunk.get("usage", usage)
                    messages.append({"role": "assistant", "content": "".join(text)})
                    conv.append({"ttft_s": first, "prompt_tokens": usage.get("prompt_tokens"),
                                 "cached_tokens": usage.get("prompt_tokens_details", {}).get("cached_tokens")})
                results[mode].append(conv)
                print(f"  ttft rep {rep + 1} {mode}: " + ", ".join(
                    f"{t['ttft_s'] * 1e3:.0f} ms ({t['prompt_tokens']}/{t['cached_tokens']})" for t in conv),
                    file=sys.stderr)
        for c in clients.values():
            c.close()
    finally:
        for s in servers.values():
            s.close()
    summary = {}
    for mode, convs in results.items():
        rows = []
        for t in range(len(turns)):
            vals = [c[t]["ttft_s"] for c in convs if c[t]["ttft_s"] is not None]
            rows.append({"turn": t + 1, "median_ms": statistics.median(vals) * 1e3, "min_ms": min(vals) * 1e3,
                         "max_ms": max(vals) * 1e3,
                         "prompt_tokens": statistics.median(c[t]["prompt_tokens"] for c in convs),
                         "cached_tokens": statistics.median(c[t]["cached_tokens"] for c in convs)})
        summary[mode] = rows
    return {"conversations": results, "summary": summary}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=6, help="held-out code prompts in the overhead run")
    ap.add_argument("--turn-tokens", type=int, default=48)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip", choices=["overhead", "ttft"], help="leave one measurement out")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from laguna_dflash.runtime import assets

    code = assets.read_prompts(assets.CODE_PROMPTS)
    tmp = Path(tempfile.mkdtemp())
    (tmp / "chat.jinja").write_text(TEMPLATE)
    flags = ["-c", str(args.ctx), "-t", str(args.threads), "--n-max", "4", "--chat-template-file", str(tmp / "chat.jinja")]
    result = {"command": command_line(__file__), "flags": flags[:-2] + ["--chat-template-file", "<Laguna-style>"],
              "statistic": "median over repeats; min and max beside it", "repeats": args.repeats}
    if args.skip != "overhead":
        result["overhead"] = overhead(args, code[:args.prompts], flags)
        for way in ("http", "http-stream"):
            o = result["overhead"][way]
            print(f"{way}: {o['median_ratio']:.3f} of the Python API's tokens/s "
                  f"(min {o['min_ratio']:.3f}, max {o['max_ratio']:.3f}); CPU per token "
                  f"{o['median_cpu_ratio']:.3f} of the Python API's (min {o['min_cpu_ratio']:.3f}, "
                  f"max {o['max_cpu_ratio']:.3f})")
    if args.skip != "ttft":
        result["ttft"] = ttft(args, code[:5], flags)
        print("| turn | prompt tokens | TTFT with cache (ms) | cached | TTFT without (ms) |")
        for a, b in zip(result["ttft"]["summary"]["cache"], result["ttft"]["summary"]["no-cache"]):
            print(f"| {a['turn']} | {a['prompt_tokens']:.0f} | {a['median_ms']:.0f} ({a['min_ms']:.0f}-{a['max_ms']:.0f}) "
                  f"| {a['cached_tokens']:.0f} | {b['median_ms']:.0f} ({b['min_ms']:.0f}-{b['max_ms']:.0f}) |")
    if args.json:
        write_json(args.json, result, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
