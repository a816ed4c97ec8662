"""A whole agent session against two servers: laguna-run serve and ik_llama.cpp's llama-server.

    python -m scripts.bench.bench_agent_server record --out scripts/bench/data/agent-session.json
    scripts/bench/build_peer.sh ik       # once: ik_llama.cpp's llama-server, outside the repo
    python -m scripts.bench.bench_agent_server replay --json docs/results/agent-server/agent-server.json --png docs/results/agent-server/agent-server.png
    python -m scripts.bench.bench_agent_server replay --api chat,messages ...   # also through /v1/messages

``record`` runs an agent (the loop of ``examples/agent.py``: thinking on, the tools run for real
over the standard library) through the agent pair's held-out tasks in ONE growing conversation
against ``laguna-run serve`` at depth 0 (the target's own greedy replies), and writes every
request it sent and every reply it got.

``replay`` sends the recorded requests again, in order, streamed, as an agent would: request k is
the recorded conversation up to reply k (recorded history, not the server's own earlier replies,
so every server answers exactly the same requests). ``--api messages`` sends each turn as an
Anthropic Messages request instead (system apart, thinking/text/tool_use blocks, tool results as
user turns; thinking enabled when the recording's is on), through the official ``anthropic`` client,
to both servers' /v1/messages; every API is its own configurations and verdict. Each configuration is a fresh server process
on the same GGUF pair, the same chat template (the target GGUF's), greedy, the same threads, an F16
KV cache (both servers' default; ik_llama.cpp's CPU flash attention has no F32 cache), a 16k
context and its prompt cache on (a slot keeps the last prompt):

- laguna-run serve: each ``--ours`` depth (0: plain, no drafter);
- ik_llama.cpp llama-server ``--jinja``: each ``--ik`` depth, ``--spec-type dflash:n_max=N`` (0:
  plain, no drafter).

Every request says ``parallel_tool_calls: true``, OpenAI's default, which laguna-run serve also
assumes when it is absent; llama-server assumes false and keeps only the first of several calls.

Per turn: time to first token (request sent to the first streamed delta of reasoning, content or a
tool call), decode tokens/s ((completion tokens - 1) / first delta to the end of the stream),
prompt and cached tokens (the server's ``usage``), and whether the parsed tool calls equal the
recorded ones (name and JSON arguments), whether the whole reply does, and whether it equals the
same server's plain reply (first repetition; speculation should change nothing). The session's wall
time is the sum of its requests' times (client side: the agent's own tool time is not in it).

Fixed before a run: the recording, the configurations, ``--repetitions`` (>= 5 for a result), all
configurations once per repetition, the order rotated by one each repetition. Statistic: the
median over repetitions of each session's wall time, min and max beside it; a server's best depth
is its configuration with the lowest median wall time, and the verdict is laguna-run's best over
ik's best. Per-turn figures are medians over the repetitions.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from scripts.arguments import int_list
from scripts.bench.bench_server import ServeProcess, stop
from scripts.recorded import command_line, write_json
from tests.helpers.ik_interop import ik_named_copy, peer_root, peer_snapshot

REPO = Path(__file__).resolve().parents[2]

OURS, IK = "laguna-run", "ik_llama.cpp"
CONTEXT = 16384
MAX_TOKENS = 256
THINKING = {"enable_thinking": True}


# --------------------------------------------------------------------------------------- record

def record(args) -> int:
    import openai
    from examples.agent import _whole
    from examples.agent_tools import TOOLS, Workspace, parse_arguments

    from tests.helpers.agent_tasks import held_out_tasks, stdlib_dir

    ws = Workspace(stdlib_dir())
    tasks = held_out_tasks(args.tasks)
    flags = ["--bundled", "agent", "--n-max", "0", "--cache-type", "f16", "-c", str(CONTEXT), "-t", str(args.threads)]
    server = ServeProcess(*flags)
    messages: list[dict] = []
    turns: list[dict] = []
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=600)
        model = client.models.list().data[0].id
        for k, task in enumerate(tasks):
            messages.append({"role": "user", "content": task.user})
            for _ in range(args.max_steps):
                request = dict(model=model, messages=messages, tools=TOOLS, temperature=0, max_tokens=MAX_TOKENS,
                               extra_body={"chat_template_kwargs": THINKING})
                message, finish_reason, _ = _whole(client, request)
                turns.append({"task": k + 1, "history": len(messages), "finish_reason": finish_reason})
                messages.append(message)
                calls = message.get("tool_calls", [])
                for call in calls:
                    f = call["function"]
                    messages.append({"role": "tool", "tool_call_id": call["id"],
                                     "content": ws.call(f["name"], parse_arguments(f["arguments"]))})
                print(f"turn {len(turns):2d} (task {k + 1}): {len(calls)} tool call(s), {finish_reason}", flush=True)
                if not calls:
                    break
    finally:
        server.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, {
        "command": command_line(__file__), "server_flags": flags, "tools": TOOLS,
        "chat_template_kwargs": THINKING, "max_tokens": MAX_TOKENS, "tasks": len(tasks), "turns": turns,
        "messages": messages}, indent=1)
    print(f"{len(turns)} turns, {len(messages)} messages: {args.out}")
    return 0


# --------------------------------------------------------------------------------------- servers

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class IkServer:
    """ik_llama.cpp's ``llama-server`` on a free loopback port, its log in a temporary file."""

    def __init__(self, binary: Path, *flags: str) -> None:
        import httpx

        port = free_port()
        self.log = tempfile.NamedTemporaryFile("w+", prefix="ik-server-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([str(binary), "--host", "127.0.0.1", "--port", str(port), *flags],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("llama-server did not start:\n" + Path(self.log.name).read_text()[-3000:])
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)

    def close(self) -> None:
        stop(self.proc)


@dataclass(frozen=True)
class Config:
    server: str
    depth: int | str  # 0: plain (no drafter)
    api: str = "chat"  # chat: /v1/chat/completions; messages: /v1/messages (Anthropic)

    @property
    def name(self) -> str:
        api = "" if self.api == "chat" else f" ({self.api})"
        return f"{self.server} {'plain' if self.depth == 0 else self.depth}{api}"

    @property
    def plain(self) -> "Config":
        return Config(self.server, 0, self.api)


def ik_server_binary() -> Path | None:
    binary = Path(os.environ.get("IK_LLAMA_BIN", peer_root() / "ik_llama.cpp" / "build" / "bin")) / "llama-server"
    return binary if binary.is_file() else None


def start(config: Config, threads: int, ik_binary: Path | None, ik_drafter: Path | None):
    from laguna_dflash.runtime import assets

    common = ["-c", str(CONTEXT), "-t", str(threads)]
    if config.server == OURS:
        flags = ["-m", str(assets.AGENT_TARGET), "--cache-type", "f16", *common]
        if config.depth != 0:
            flags += ["-md", str(assets.converted_agent_drafter()), "--n-max", str(config.depth)]
        return ServeProcess(*flags)
    flags = ["-m", str(assets.AGENT_TARGET), "--jinja", "-np", "1", "-ctk", "f16", "-ctv", "f16", "-tb", str(threads),
             "--chat-template-kwargs", json.dumps(THINKING), *common]
    if config.depth != 0:
        flags += ["-md", str(ik_drafter), "--spec-type", f"dflash:n_max={config.depth}"]
    return IkServer(ik_binary, *flags)


# --------------------------------------------------------------------------------------- replay

def calls_of(message: dict) -> list[tuple[str, object]]:
    """A reply's tool calls as (name, arguments as JSON values); unparsable arguments stay text."""
    out = []
    for call in message.get("tool_calls") or ():
        f = call["function"]
        try:
            arguments = json.loads(f["arguments"]) if isinstance(f["arguments"], str) else f["arguments"]
        except json.JSONDecodeError:
            arguments = f["arguments"]
        out.append((f["name"], arguments))
    return out


def said(message: dict) -> tuple:
    """What a reply says: its text, its reasoning and its calls (not the ids servers draw)."""
    return message.get("content") or "", message.get("reasoning_content") or "", calls_of(message)


def send(client, model: str, recording: dict, history: list[dict]) -> dict:
    """One streamed request: its timings, usage and the reply it parsed."""
    from examples.agent import read_stream

    seen: dict = {"first": None, "usage": None}

    def timed(chunks):
        for chunk in chunks:
            seen["usage"] = chunk.usage or seen["usage"]
            if seen["first"] is None and any(
                    c.delta.content or (c.delta.model_extra or {}).get("reasoning_content") or c.delta.tool_calls
                    for c in chunk.choices):
                seen["first"] = time.perf_counter()
            yield chunk

    t0 = time.perf_counter()
    reply, _, _ = read_stream(timed(client.chat.completions.create(
        model=model, messages=history, tools=recording["tools"], temperature=0, max_tokens=recording["max_tokens"],
        stream=True, stream_options={"include_usage": True}, parallel_tool_calls=True,
        extra_body={"chat_template_kwargs": recording["chat_template_kwargs"]})))
    end = time.perf_counter()
    first, usage = seen["first"] or end, seen["usage"]
    n = usage.completion_tokens if usage else 0
    cached = (usage.prompt_tokens_details.cached_tokens or 0) if usage and usage.prompt_tokens_details else 0
    return {"wall_s": end - t0, "ttft_s": first - t0,
            "tokens_per_s": (n - 1) / (end - first) if n > 1 and end > first else None,
            "prompt_tokens": usage.prompt_tokens if usage else None, "cached_tokens": cached, "completion_tokens": n,
            "reply": reply}


def anthropic_request(recording: dict, history: list[dict]) -> dict:
    """The same turn as Anthropic Messages: the system text apart, assistant replies as thinking,
    text and tool_use blocks, each run of tool results as one user turn of tool_result blocks."""
    system, messages = [], []

    def turn(role: str) -> list:
        if not messages or messages[-1]["role"] != role:
            messages.append({"role": role, "content": []})
        return messages[-1]["content"]

    for m in history:
        if m["role"] == "system":
            system.append(m["content"])
        elif m["role"] == "user":
            turn("user").append({"type": "text", "text": m["content"]})
        elif m["role"] == "tool":
            turn("user").append({"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]})
        else:
            blocks = turn("assistant")
            if m.get("reasoning_content"):
                blocks.append({"type": "thinking", "thinking": m["reasoning_content"], "signature": ""})
            if m.get("content"):
                blocks.append({"type": "text", "text": m["content"]})
            for call in m.get("tool_calls") or ():
                f = call["function"]
                blocks.append({"type": "tool_use", "id": call["id"], "name": f["name"],
                               "input": json.loads(f["arguments"]) if isinstance(f["arguments"], str) else f["arguments"]})
    tools = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
              "input_schema": t["function"]["parameters"]} for t in recording["tools"]]
    thinking = ({"type": "enabled", "budget_tokens": recording["max_tokens"]}
                if recording["chat_template_kwargs"].get("enable_thinking") else {"type": "disabled"})
    # greedy: Anthropic's default temperature is 1; the client (2.x) takes it only as an extra field
    request = dict(messages=messages, tools=tools, max_tokens=recording["max_tokens"], thinking=thinking,
                   extra_body={"temperature": 0})
    if system:
        request["system"] = "\n\n".join(system)
    return request


def send_messages(client, model: str, recording: dict, history: list[dict]) -> dict:
    """One streamed /v1/messages request: its timings, usage and the reply as a chat message
    (so that it compares with the recorded one)."""
    first = None
    text, reasoning, calls, usage = [], [], [], {}
    t0 = time.perf_counter()
    with client.messages.create(model=model, stream=True, **anthropic_request(recording, history)) as stream:
        for event in stream:
            if event.type == "message_start":
                usage.update(event.message.usage.model_dump())
            elif event.type == "content_block_start" and event.content_block.type == "tool_use":
                calls.append({"id": event.content_block.id, "type": "function",
                              "function": {"name": event.content_block.name, "arguments": ""}})
            elif event.type == "content_block_delta":
                first = first or time.perf_counter()
                delta = event.delta
                if delta.type == "text_delta":
                    text.append(delta.text)
                elif delta.type == "thinking_delta":
                    reasoning.append(delta.thinking)
                elif delta.type == "input_json_delta":
                    calls[-1]["function"]["arguments"] += delta.partial_json
            elif event.type == "message_delta":  # the final usage: the prefix cache is read by then
                usage.update({k: v for k, v in event.usage.model_dump().items() if v is not None})
    end = time.perf_counter()
    first = first or end
    for call in calls:  # a call without arguments streams no delta
        call["function"]["arguments"] = call["function"]["arguments"] or "{}"
    reply = {"role": "assistant", "content": "".join(text) or None}
    if reasoning:
        reply["reasoning_content"] = "".join(reasoning)
    if calls:
        reply["tool_calls"] = calls
    n = usage.get("output_tokens") or 0
    cached = usage.get("cache_read_input_tokens") or 0
    return {"wall_s": end - t0, "ttft_s": first - t0,
            "tokens_per_s": (n - 1) / (end - first) if n > 1 and end > first else None,
            "prompt_tokens": (usage.get("input_tokens") or 0) + cached, "cached_tokens": cached,
            "completion_tokens": n, "reply": reply}


def replay_session(config: Config, recording: dict, threads: int, ik_binary, ik_drafter) -> list[dict]:
    import anthropic
    import openai

    server = start(config, threads, ik_binary, ik_drafter)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=600, max_retries=0)
        model = client.models.list().data[0].id
        if config.api == "messages":
            # a new connection per request: on a kept-alive one, ik's llama-server drops a later
            # streamed /v1/messages request unanswered (turn 6 of run 4, turn 10 in a later probe)
            client = anthropic.Anthropic(base_url=server.url, api_key="unused", timeout=600, max_retries=0,
                                         default_headers={"Connection": "close"})
        ask = send_messages if config.api == "messages" else send
        messages = recording["messages"]
        out = []
        for turn in recording["turns"]:
            got = ask(client, model, recording, messages[:turn["history"]])
            want = messages[turn["history"]]
            got["calls_right"] = calls_of(got["reply"]) == calls_of(want)
            got["same_reply"] = said(got["reply"]) == said(want)
            got["n_calls"] = len(got["reply"].get("tool_calls", ()))
            out.append(got)
        return out
    finally:
        server.close()


def replay(args) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from laguna_dflash.runtime import assets

    console = Console(width=max(Console().width, 120))
    recording = args.recording_data
    ik_binary = ik_server_binary()
    configs = [Config(OURS, d, api) for api in args.api for d in args.ours]
    ik_drafter = None
    if ik_binary is None:
        console.print("ik_llama.cpp's llama-server is not built (scripts/bench/build_peer.sh ik): laguna-run only")
    else:
        drafter = assets.converted_agent_drafter()
        ik_drafter = ik_named_copy(drafter)
        configs += [Config(IK, d, api) for api in args.api for d in args.ik]
    runs: dict[str, list[list[dict]]] = {c.name: [] for c in configs}
    load = {"before": os.getloadavg(), "per_repetition": []}
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task("sessions", total=args.repetitions * len(configs))
        for rep in range(args.repetitions):
            shift = rep % len(configs)
            for config in configs[shift:] + configs[:shift]:
                progress.update(task, description=f"repetition {rep + 1}: {config.name}")
                runs[config.name].append(replay_session(config, recording, args.threads, ik_binary, ik_drafter))
                progress.advance(task)
            load["per_repetition"].append(os.getloadavg()[0])
    result = summarise(recording, configs, runs)
    result.update({"command": command_line(__file__), "threads": args.threads, "repetitions": args.repetitions,
                   "context": CONTEXT, "load_average": load, "machine_cores": os.cpu_count(),
                   "peer_snapshot": {IK: peer_snapshot(ik_binary.parent) if ik_binary else None}})
    show(console, result, Table)
    if args.json:
        write_json(args.json, result, indent=1)
    if args.png:
        plot(result, args.png)
    return 0


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(recording: dict, configs: list[Config], runs: dict[str, list[list[dict]]]) -> dict:
    sessions, per_turn = {}, {}
    for c in configs:
        reps = runs[c.name]
        walls = [sum(t["wall_s"] for t in rep) for rep in reps]
        turns = []
        for k in range(len(recording["turns"])):
            at = [rep[k] for rep in reps]
            rates = [t["tokens_per_s"] for t in at if t["tokens_per_s"]]
            turns.append({"ttft_s": statistics.median(t["ttft_s"] for t in at),
                          "tokens_per_s": statistics.median(rates) if rates else None,
                          "wall_s": statistics.median(t["wall_s"] for t in at),
                          "prompt_tokens": at[0]["prompt_tokens"], "cached_tokens": at[0]["cached_tokens"],
                          "completion_tokens": at[0]["completion_tokens"], "n_calls": at[0]["n_calls"],
                          "calls_right_every_repetition": all(t["calls_right"] for t in at),
                          "same_reply_every_repetition": all(t["same_reply"] for t in at),
                          "same_as_own_plain": (said(at[0]["reply"]) == said(runs[c.plain.name][0][k]["reply"])
                                                if c.plain.name in runs else None)})
            if not turns[-1]["calls_right_every_repetition"]:
                turns[-1]["reply_first_repetition"] = at[0]["reply"]
        per_turn[c.name] = turns
        sessions[c.name] = {
            "server": c.server, "depth": c.depth, "api": c.api, "wall_s": spread(walls),
            "turns_calls_right": sum(t["calls_right_every_repetition"] for t in turns),
            "turns_same_reply": sum(t["same_reply_every_repetition"] for t in turns),
            "turns_same_as_own_plain": (sum(bool(t["same_as_own_plain"]) for t in turns)
                                        if c.plain.name in runs else None),  # None: plain not run
            "ttft_s_median_over_turns": statistics.median(t["ttft_s"] for t in turns),
            "tokens_generated": sum(t["completion_tokens"] for t in turns),
            "cached_share": (sum(t["cached_tokens"] or 0 for t in turns) / sum(t["prompt_tokens"] or 0 for t in turns)
                             if any(t["prompt_tokens"] for t in turns) else None)}
    best, verdicts = {}, {}
    for api in dict.fromkeys(c.api for c in configs):
        best_here = {}
        for server in (OURS, IK):
            mine = [n for n, s in sessions.items() if s["server"] == server and s["api"] == api]
            if mine:
                best_here[server] = min(mine, key=lambda n: sessions[n]["wall_s"]["median"])
        best.update({f"{server} ({api})" if api != "chat" else server: n for server, n in best_here.items()})
        verdicts[api] = _verdict(recording, sessions, best_here)
    last = recording["turns"][-1]
    return {"session": {"turns": len(recording["turns"]), "tasks": recording["tasks"],
                        "tool_calls": sum(len(m.get("tool_calls") or ()) for m in recording["messages"]),
                        "last_history_messages": last["history"]},
            "sessions": sessions, "best": best, "verdict": verdicts.get("chat"), "verdicts": verdicts,
            "per_turn": per_turn}


def _verdict(recording: dict, sessions: dict, best: dict) -> dict | None:
    """laguna-run's best against ik's best on one API (None without both)."""
    verdict = None
    if len(best) == 2:
        ours, theirs = sessions[best[OURS]], sessions[best[IK]]
        verdict = {"ours_best": best[OURS], "ik_best": best[IK],
                   "wall_ratio": ours["wall_s"]["median"] / theirs["wall_s"]["median"],
                   "bound": 0.8, "ours_calls_right_every_turn": ours["turns_calls_right"] == len(recording["turns"]),
                   "ik_calls_right_every_turn": theirs["turns_calls_right"] == len(recording["turns"])}
        verdict["met"] = verdict["wall_ratio"] <= 0.8 and verdict["ours_calls_right_every_turn"]
    return verdict


def show(console, result: dict, Table) -> None:
    n = result["session"]["turns"]
    table = Table(title=f"one agent session, {n} turns, {result['repetitions']} repetitions")
    for col in ("configuration", "wall s (median)", "min-max", "TTFT median", "tokens", "cached share",
                f"calls right (of {n})", "same reply", "= own plain"):
        table.add_column(col, justify="right" if col != "configuration" else "left")
    for name, s in result["sessions"].items():
        w = s["wall_s"]
        table.add_row(name, f"{w['median']:.2f}", f"{w['min']:.2f}-{w['max']:.2f}",
                      f"{s['ttft_s_median_over_turns'] * 1000:.0f} ms", str(s["tokens_generated"]),
                      f"{s['cached_share']:.1%}" if s["cached_share"] is not None else "-",
                      str(s["turns_calls_right"]), str(s["turns_same_reply"]),
                      "-" if s["turns_same_as_own_plain"] is None else str(s["turns_same_as_own_plain"]))
    console.print(table)
    for api, v in result["verdicts"].items():
        if not v:
            continue
        console.print(f"{api}: best: {v['ours_best']} vs {v['ik_best']}: wall ratio {v['wall_ratio']:.3f} (bound 0.8), "
                      f"laguna-run calls right every turn: {v['ours_calls_right_every_turn']}, "
                      f"ik: {v['ik_calls_right_every_turn']} -> {'met' if v['met'] else 'NOT met'}")


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [n for n in result["sessions"] if result["sessions"][n]["depth"] == 0] + list(result["best"].values())
    shown = list(dict.fromkeys(shown))
    fig, (a, b, c) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for name in shown:
        turns = result["per_turn"][name]
        x = range(1, len(turns) + 1)
        a.plot(x, [t["ttft_s"] * 1000 for t in turns], ".-", label=name)
        b.plot(x, [t["tokens_per_s"] or float("nan") for t in turns], ".-", label=name)
        total, cumulative = 0.0, []
        for t in turns:
            total += t["wall_s"]
            cumulative.append(total)
        c.plot(x, cumulative, "-", label=name)
    a.set_ylabel("time to first token (ms)")
    a.set_yscale("log")
    b.set_ylabel("decode tokens/s")
    c.set_ylabel("session wall time (s)")
    c.set_xlabel("turn")
    a.legend(fontsize=8)
    fig.suptitle("one agent session replayed: medians over repetitions")
    fig.tight_layout()
    fig.savefig(png)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record one agent session against laguna-run serve at depth 0")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--tasks", type=int, default=38, help="held-out tasks in the one session")
    rec.add_argument("--max-steps", type=int, default=4, help="replies per task at most")
    rec.add_argument("-t", "--threads", type=int, default=2)
    rep = sub.add_parser("replay", help="replay a recorded session against both servers")
    rep.add_argument("--recording", type=Path, default=REPO / "scripts" / "bench" / "data" / "agent-session.json")
    rep.add_argument("--ours", type=int_list(0, 15, ("auto",)), default=(0, 1, 2, 3, 4, "auto"),
                     help="laguna-run serve depths (comma-separated; 0: plain, auto: tuned online)")
    rep.add_argument("--ik", type=int_list(0, 15), default=(0, 1, 2, 3, 4),
                     help="ik_llama.cpp dflash n_max values (comma-separated; 0: plain)")
    rep.add_argument("--api", type=lambda v: tuple(dict.fromkeys(v.split(","))), default=("chat",),
                     help="APIs to replay through, comma-separated: chat (/v1/chat/completions), messages "
                          "(/v1/messages, Anthropic's; the same turns as Messages requests)")
    rep.add_argument("--repetitions", type=int, default=5, help="interleaved repetitions (>= 5 for a result)")
    rep.add_argument("-t", "--threads", type=int, default=2)
    rep.add_argument("--json", type=Path)
    rep.add_argument("--png", type=Path)
    args = ap.parse_args(argv)
    if args.command == "replay":
        if not set(args.api) <= {"chat", "messages"}:
            ap.error(f"--api {','.join(args.api)}: expected chat, messages or both (comma-separated)")
        args.recording_data = read_recording(args.recording, ap)
    elif args.tasks < 1 or args.max_steps < 1:
        ap.error(f"--tasks {args.tasks} --max-steps {args.max_steps}: expected both >= 1")
    elif args.out.is_dir() or not os.access(args.out.parent if args.out.parent.exists() else Path.cwd(), os.W_OK):
        ap.error(f"--out {args.out}: cannot write a file there")  # before the session, not after it
    return record(args) if args.command == "record" else replay(args)


def read_recording(path: Path, ap: argparse.ArgumentParser) -> dict:
    """The recorded session, or argparse's one-line error (exit 2) naming what is wrong."""
    try:
        recording = json.loads(path.read_text())
    except OSError as e:
        ap.error(f"--recording {path}: cannot read it ({e.strerror or e})")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        ap.error(f"--recording {path}: expected a session written by `record`, found no JSON ({e})")
    needed = ("tools", "chat_template_kwargs", "max_tokens", "tasks", "turns", "messages")
    if not isinstance(recording, dict) or any(k not in recording for k in needed):
        ap.error(f"--recording {path}: expected a session written by `record` (keys {', '.join(needed)})")
    n = len(recording["messages"]) if isinstance(recording["messages"], list) else 0
    for k, turn in enumerate(recording["turns"] if isinstance(recording["turns"], list) else [None]):
        if not (isinstance(turn, dict) and isinstance(turn.get("history"), int) and 0 < turn["history"] < n):
            ap.error(f"--recording {path}: turns[{k}].history: expected the index of a recorded reply in "
                     f"1..{n - 1}, found {turn.get('history') if isinstance(turn, dict) else turn!r}")
    return recording


if __name__ == "__main__":
    raise SystemExit(main())
