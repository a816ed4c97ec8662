"""What speculation does on agent traffic: one long agent session on the bundled agent pair.

    python -m scripts.bench.bench_agent_session --tasks 14 --json docs/results/agent-pair/agent-session.json --png docs/results/agent-pair/agent-session.png

An agent (the loop of ``examples/agent.py``, in process) works through held-out tasks one after
the other in ONE growing conversation, thinking on, the tools run for real
(``examples/agent_tools.py`` over the standard library). Every turn is generated twice from the
same prompt by two engines that each keep their own prompt cache, as a server slot does: one
speculative (depth ``--n-max``), one plain; the speculative reply is the one appended to the
conversation, so both engines see the same conversation. Per turn: prompt tokens, cached tokens,
time to first token (prefill of the new part, the drafter's capture included), decode tokens/s
of each engine and their ratio. Per segment of the reply (reasoning, tool-call markup from
``<tool_call>`` to ``</tool_call>``, answer prose): mean accepted tokens per round and the
speedup, from per-round timings (the time between consecutive round callbacks; a reply's first
round is left out of the timing, its clock also ran through the prefill), a round counted in the
segment its first drafted token falls in.

One session is one measurement: the command fixes the task count, the seed and the depth; the
spread printed is across turns.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from examples.agent_tools import TOOLS, Workspace, parse_arguments
from scripts.recorded import command_line, write_json

SEGMENTS = ("reasoning", "tool call", "answer")


def depth(value: str) -> int | str:
    """--n-max: the runtime's depth rule (request.parse_n_max), and not 0: both engines would be plain."""
    from laguna_dflash.runtime.errors import RequestError
    from laguna_dflash.runtime.request import parse_n_max

    try:
        n_max = parse_n_max(value)
    except RequestError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if n_max == 0:
        raise argparse.ArgumentTypeError("expected a depth >= 1 or auto (0 makes the speculative engine plain)")
    return n_max


def segments_of(texts: list[str], in_reasoning: bool) -> list[str]:
    """The segment each generated token belongs to, from the tokens' texts in order."""
    out, state, seen = [], "reasoning" if in_reasoning else "answer", ""
    for t in texts:
        out.append("tool call" if "<tool_call>" in t else state)
        seen += t
        if state == "reasoning" and "</think>" in seen:
            state, seen = "answer", ""
        elif "<tool_call>" in seen and "</tool_call>" not in seen.split("<tool_call>")[-1]:
            state = "tool call"
        elif state == "tool call" and "</tool_call>" in seen:
            state, seen = "answer", ""
    return out


class RoundClock:
    """A trace callback: per round, its depth, accepted count, position and wall time."""

    def __init__(self) -> None:
        self.rounds: list[dict] = []
        self.last = time.perf_counter()

    def start(self) -> None:
        self.rounds.clear()
        self.last = time.perf_counter()

    def __call__(self, rec: dict) -> None:
        now = time.perf_counter()
        self.rounds.append({"depth": rec["depth"], "accepted": rec["accepted"], "seconds": now - self.last})
        self.last = now


def run_turn(engine, clock, prompt, options):
    clock.start()
    out = engine.generate(prompt, options)
    return out, list(clock.rounds)


def main() -> int:
    from laguna_dflash.runtime.drafter_cache import native_drafter_path
    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.chat_template import ChatTemplate
    from laguna_dflash.runtime.conversation import ChatTurn, end_of_turn_tokens
    from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions
    from laguna_dflash.runtime.llama import Model
    from tests.helpers.agent_tasks import held_out_tasks, stdlib_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=14, help="held-out tasks in the one session")
    ap.add_argument("--n-max", type=depth, default=4, help="the speculative engine's depth: 1.. or auto (tuned online)")
    ap.add_argument("--threads", "-t", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=4, help="assistant turns per task at most")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path)
    args = ap.parse_args()

    ws = Workspace(stdlib_dir())
    tasks = held_out_tasks(args.tasks)
    turns, seg = [], {s: {"rounds": 0, "accepted": 0, "tokens": 0, "seconds": 0.0, "plain_tokens": 0,
                          "plain_seconds": 0.0} for s in SEGMENTS}
    with Model(assets.AGENT_TARGET) as target:
        template = ChatTemplate(target.chat_template(), assets.AGENT_TARGET)
        drafter = native_drafter_path(assets.converted_agent_drafter(), target.path)
        cfg = EngineConfig(n_ctx=16384, n_threads=args.threads)
        spec_clock, plain_clock = RoundClock(), RoundClock()
        with Engine(target, drafter, cfg) as spec, Engine(target, drafter, cfg) as plain:
            bos = target.special_text("bos")
            end = end_of_turn_tokens(target)
            opt = dict(n_predict=256, end_tokens=end, special_text=True)
            spec_opt = GenerateOptions(n_max=args.n_max, trace=spec_clock, **opt)
            plain_opt = GenerateOptions(n_max=0, trace=plain_clock, **opt)
            messages: list[dict] = []
            n_call = 0
            for k, task in enumerate(tasks):
                messages.append({"role": "user", "content": task.user})
                for _ in range(args.max_steps):
                    turn = ChatTurn.render(template, messages, tools=TOOLS, template_kwargs={"enable_thinking": True},
                                           bos_token=bos)
                    prompt = target.tokenize(turn.prompt, add_special=not turn.prompt.startswith(bos), parse_special=True)
                    out, rounds = run_turn(spec, spec_clock, prompt, spec_opt)
                    pout, prounds = run_turn(plain, plain_clock, prompt, plain_opt)
                    texts = [target.token_bytes(t, special=True).decode("utf-8", "replace") for t in out.tokens]
                    where = segments_of(texts, turn.reasoning)
                    pos = 0
                    for i, r in enumerate(rounds):
                        s = where[min(pos + 1, len(where) - 1)] if where else "answer"
                        made = r["accepted"] + 1 if r["depth"] else 1
                        seg[s]["rounds"] += bool(r["depth"])
                        seg[s]["accepted"] += r["accepted"] if r["depth"] else 0
                        if i:  # the first round's clock also ran through the prefill
                            seg[s]["tokens"] += made
                            seg[s]["seconds"] += r["seconds"]
                        pos += made
                    pwhere = segments_of([target.token_bytes(t, special=True).decode("utf-8", "replace") for t in pout.tokens],
                                         turn.reasoning)
                    for i, r in enumerate(prounds[1:], 1):
                        s = pwhere[min(i, len(pwhere) - 1)] if pwhere else "answer"
                        seg[s]["plain_tokens"] += 1
                        seg[s]["plain_seconds"] += r["seconds"]
                    st, pst = out.stats, pout.stats
                    turns.append({"task": k + 1, "prompt_tokens": st.n_prompt, "cached_tokens": st.n_cached,
                                  "ttft_s": round(st.t_prefill, 4), "plain_ttft_s": round(pst.t_prefill, 4),
                                  "reply_tokens": len(out.tokens), "tokens_per_s": round(st.tokens_per_s, 1),
                                  "plain_tokens_per_s": round(pst.tokens_per_s, 1),
                                  "speedup": round(st.tokens_per_s / pst.tokens_per_s, 3) if pst.tokens_per_s else None,
                                  "accepted_per_round": round(st.mean_accepted, 3),
                                  "same_reply": list(out.tokens) == list(pout.tokens)})
                    t = turns[-1]
                    print(f"turn {len(turns):2d} (task {k + 1}): prompt {t['prompt_tokens']:5d}, cached "
                          f"{t['cached_tokens']:5d}, ttft {t['ttft_s'] * 1000:6.1f} ms, {t['reply_tokens']:3d} tokens, "
                          f"{t['tokens_per_s']:6.1f} tok/s vs plain {t['plain_tokens_per_s']:6.1f} "
                          f"({t['speedup']}x), accepted/round {t['accepted_per_round']:.2f}", flush=True)
                    message = turn.message(out.text)
                    back = {"role": "assistant", "content": message["content"] or "",
                            "reasoning_content": message["reasoning_content"] or ""}
                    if message["tool_calls"]:
                        back["tool_calls"] = message["tool_calls"]
                    messages.append(back)
                    if not message["tool_calls"]:
                        break
                    for call in message["tool_calls"]:
                        n_call += 1
                        f = call["function"]
                        messages.append({"role": "tool", "tool_call_id": call["id"],
                                         "content": ws.call(f["name"], parse_arguments(f["arguments"]))})
    speedups = [t["speedup"] for t in turns if t["speedup"]]
    by_segment = {s: {"rounds": v["rounds"], "accepted_per_round": round(v["accepted"] / v["rounds"], 3) if v["rounds"] else None,
                      "tokens": v["tokens"],
                      "tokens_per_s": round(v["tokens"] / v["seconds"], 1) if v["seconds"] else None,
                      "plain_tokens_per_s": round(v["plain_tokens"] / v["plain_seconds"], 1) if v["plain_seconds"] else None}
                  for s, v in seg.items()}
    for v in by_segment.values():
        v["speedup"] = round(v["tokens_per_s"] / v["plain_tokens_per_s"], 3) if v["tokens_per_s"] and v["plain_tokens_per_s"] else None
    summary = {"turns": len(turns), "tasks": len(tasks), "final_prompt_tokens": turns[-1]["prompt_tokens"] if turns else 0,
               "tool_calls": n_call, "median_speedup": statistics.median(speedups) if speedups else None,
               "speedup_min": min(speedups, default=None), "speedup_max": max(speedups, default=None),
               "median_ttft_s": statistics.median(t["ttft_s"] for t in turns) if turns else None,
               "same_reply_turns": sum(t["same_reply"] for t in turns)}
    print("\n| segment | rounds | accepted/round | tok/s | plain tok/s | speedup |\n|---|---|---|---|---|---|")
    for s, v in by_segment.items():
        print(f"| {s} | {v['rounds']} | {v['accepted_per_round']} | {v['tokens_per_s']} | {v['plain_tokens_per_s']} | "
              f"{v['speedup']} |")
    print(json.dumps(summary))
    if args.json:
        write_json(args.json, {"command": command_line(__file__), "n_max": args.n_max, "threads": args.threads,
                               "summary": summary, "segments": by_segment, "turns": turns}, indent=1)
    if args.png:
        plot(turns, args.png)
    return 0


def plot(turns: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = range(1, len(turns) + 1)
    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    a.plot(x, [t["tokens_per_s"] for t in turns], "o-", label="speculative")
    a.plot(x, [t["plain_tokens_per_s"] for t in turns], "s-", label="plain")
    a.set_ylabel("decode tokens/s")
    a.legend()
    b.plot(x, [t["ttft_s"] * 1000 for t in turns], "o-", label="time to first token (ms)")
    b2 = b.twinx()
    b2.plot(x, [t["prompt_tokens"] for t in turns], "k:", label="prompt tokens")
    b.set_ylabel("TTFT (ms)")
    b2.set_ylabel("prompt tokens")
    b.set_xlabel("turn")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
