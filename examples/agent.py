#!/usr/bin/env python3
"""A small tool-calling agent on an OpenAI-compatible server, with the official ``openai`` client.

    laguna-run serve --bundled agent --port 8080 &
    python examples/agent.py "Where is the function `urljoin` defined?"
    python examples/agent.py --thinking "What is 17 * 23?"
    python examples/agent.py --held-out          # the agent pair's 10 held-out tasks, scored

The loop (:func:`run_task`): send the conversation with the tools of ``agent_tools.py``; run each
tool call of the reply in a :class:`agent_tools.Workspace` (reads confined to one directory,
``run_python`` in a time-limited subprocess) and append the results as ``tool`` messages; stop at
a reply without calls, or after ``--max-steps`` replies.

Each task runs twice: with speculation (the server's draft depth, or ``--n-max``) and without
(``n_max`` 0, an extra body field of ``laguna-run serve``). Every turn then shows the drafter's
accepted tokens per round and the decode speedup, both taken from the ``timings`` object the
server adds to each response, measured in this run.
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import openai
from rich.console import Console
from rich.markup import escape

try:  # run as a file, or imported with examples/ on the path (the tests)
    from agent_tools import TOOLS, Workspace, parse_arguments
except ModuleNotFoundError:  # imported as examples.agent from the repository root (the lab, scripts/)
    from .agent_tools import TOOLS, Workspace, parse_arguments

DEFAULT_URL = "http://127.0.0.1:8080/v1"
SHOWN_CHARS = 160  # of each tool result, when printed


@dataclass
class Turn:
    """One assistant reply: the message as sent back to the server, the tool messages answering
    its calls, and the server's ``timings`` for it."""
    message: dict
    results: list[dict]
    timings: dict
    finish_reason: str


@dataclass
class AgentRun:
    turns: list[Turn] = field(default_factory=list)

    @property
    def transcript(self) -> list[dict]:
        """The conversation after the user's message, in OpenAI's message shapes."""
        return [m for t in self.turns for m in (t.message, *t.results)]

    @property
    def answer(self) -> str | None:
        last = self.turns[-1] if self.turns else None
        return last.message["content"] if last and not last.message.get("tool_calls") else None


def run_task(client: openai.OpenAI, task: str, workspace: Workspace, *, model: str, n_max: int | None = None,
             thinking: bool = False, stream: bool = False, max_steps: int = 6, max_tokens: int = 256) -> AgentRun:
    """Solve ``task`` with the tools: greedy replies until one has no tool call or ``max_steps``
    replies were made. ``n_max`` None leaves the draft depth to the server."""
    extra_body: dict = {"chat_template_kwargs": {"enable_thinking": thinking}}
    if n_max is not None:
        extra_body["n_max"] = n_max
    messages: list[dict] = [{"role": "user", "content": task}]
    run = AgentRun()
    for _ in range(max_steps):
        request = dict(model=model, messages=messages, tools=TOOLS, temperature=0, max_tokens=max_tokens,
                       extra_body=extra_body)
        message, finish_reason, timings = (_streamed if stream else _whole)(client, request)
        results = [{"role": "tool", "tool_call_id": call["id"],
                    "content": workspace.call(call["function"]["name"], parse_arguments(call["function"]["arguments"]))}
                   for call in message.get("tool_calls", [])]
        run.turns.append(Turn(message, results, timings, finish_reason))
        messages += [message, *results]
        if not results:
            break
    return run


def _whole(client: openai.OpenAI, request: dict) -> tuple[dict, str, dict]:
    completion = client.chat.completions.create(**request)
    reply = completion.choices[0]
    calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
             for c in reply.message.tool_calls or ()]
    reasoning = (reply.message.model_extra or {}).get("reasoning_content")
    return (_message(reply.message.content, reasoning, calls), reply.finish_reason,
            completion.model_extra.get("timings", {}))


def _streamed(client: openai.OpenAI, request: dict) -> tuple[dict, str, dict]:
    return read_stream(client.chat.completions.create(stream=True, **request))


def read_stream(chunks) -> tuple[dict, str, dict]:
    """The reply a stream of chat completion chunks spells (a call's id and name come in its
    first delta, its arguments in pieces), its finish reason and the server's timings."""
    content, reasoning, calls, finish_reason, timings = [], [], {}, None, {}
    for chunk in chunks:
        timings = chunk.model_extra.get("timings") or timings  # laguna-run serve: on the last chunk
        for choice in chunk.choices:
            delta = choice.delta
            content.append(delta.content or "")
            reasoning.append((delta.model_extra or {}).get("reasoning_content") or "")
            for piece in delta.tool_calls or ():
                call = calls.setdefault(piece.index, {"id": piece.id, "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                if piece.function:
                    call["function"]["name"] += piece.function.name or ""
                    call["function"]["arguments"] += piece.function.arguments or ""
            finish_reason = choice.finish_reason or finish_reason
    return _message("".join(content), "".join(reasoning), [calls[i] for i in sorted(calls)]), finish_reason, timings


def _message(content: str | None, reasoning: str | None, calls: list[dict]) -> dict:
    """The assistant message to send back: its reasoning too (Laguna's template shows earlier
    reasoning when thinking is on)."""
    message = {"role": "assistant", "content": content or ""}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message


def numbered_ids(transcript: list[dict]) -> list[dict]:
    """The transcript with its call ids replaced by their order (the server draws them at
    random), so that two runs compare equal when they said and did the same."""
    ids: dict[str, str] = {}
    out = []
    for m in transcript:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "id": ids.setdefault(c["id"], f"call_{len(ids)}")} for c in m["tool_calls"]]
        if m.get("tool_call_id"):
            m["tool_call_id"] = ids.get(m["tool_call_id"], m["tool_call_id"])
        out.append(m)
    return out


# ---------------------------------------------------------------------------------------- printing


def _short(text: str, limit: int = SHOWN_CHARS) -> str:
    one_line = " | ".join(line.strip() for line in text.strip().splitlines())
    return one_line if len(one_line) <= limit else one_line[:limit - 3] + "..."


def _call_text(call: dict) -> str:
    args = parse_arguments(call["function"]["arguments"])
    shown = ", ".join(f"{k}={v!r}" for k, v in args.items()) if isinstance(args, dict) else call["function"]["arguments"]
    return f"{call['function']['name']}({shown})"


def _rate(timings: list[dict]) -> float:
    """Decode tokens per second over some turns (prefill excluded)."""
    ms = sum(t.get("predicted_ms", 0.0) for t in timings)
    return sum(t.get("predicted_n", 0) for t in timings) / ms * 1e3 if ms > 0 else 0.0


def _accepted_per_round(timings: list[dict]) -> float:
    rounds = sum(t.get("rounds", 0) for t in timings)
    return sum(t.get("draft_n_accepted", 0) for t in timings) / rounds if rounds else 0.0


def show(console: Console, spec: AgentRun, plain: AgentRun) -> None:
    """Each step of the speculative run, and per turn its acceptance and its speedup against the
    same turn of the plain run."""
    for i, turn in enumerate(spec.turns):
        m = turn.message
        if m.get("reasoning_content"):
            console.print(f"  [dim italic]thinking: {escape(_short(m['reasoning_content'], 400))}[/]")
        for call in m.get("tool_calls", []):
            console.print(f"  [cyan]-> {escape(_call_text(call))}[/]")
        for result in turn.results:
            style = "red" if result["content"].startswith("Error:") else "green"
            console.print(f"  [{style}]<- {escape(_short(result['content']))}[/]")
        if not m.get("tool_calls"):
            console.print(f"  [bold]answer:[/] {escape(m['content'])}")
        t = turn.timings
        line = (f"  [dim]turn {i + 1}: {t.get('predicted_n', 0)} tokens, "
                f"{t.get('accepted_per_round', 0.0):.2f} accepted/round, {t.get('predicted_per_second', 0.0):.0f} tok/s")
        if i < len(plain.turns):
            base = plain.turns[i].timings.get("predicted_per_second", 0.0)
            if base > 0:
                line += f" vs {base:.0f} tok/s plain: {t.get('predicted_per_second', 0.0) / base:.2f}x"
        console.print(line + "[/]")


def summary(console: Console, runs: list[tuple[AgentRun, AgentRun]]) -> None:
    spec = [t.timings for s, _ in runs for t in s.turns]
    plain = [t.timings for _, p in runs for t in p.turns]
    speedup = _rate(spec) / _rate(plain) if _rate(plain) > 0 else 0.0
    console.print(f"[bold]decode: {_rate(spec):.0f} tok/s speculative vs {_rate(plain):.0f} tok/s plain "
                  f"({speedup:.2f}x), {_accepted_per_round(spec):.2f} accepted tokens per round over "
                  f"{len(spec)} turns[/]")


# ---------------------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", nargs="?", help="what to ask the agent (or --held-out)")
    parser.add_argument("--held-out", action="store_true", help="run the agent pair's 10 held-out tasks and score them")
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", DEFAULT_URL),
                        help=f"the server's OpenAI API (default: $OPENAI_BASE_URL or {DEFAULT_URL})")
    parser.add_argument("--api-key", default=os.environ.get("LAGUNA_API_KEY", "unused"))
    parser.add_argument("--model", help="model id (default: the server's first)")
    parser.add_argument("--workspace", type=Path, help="the directory the tools may read (default: the standard library)")
    parser.add_argument("--thinking", action="store_true", help="reason before acting (chat_template_kwargs enable_thinking)")
    parser.add_argument("--n-max", type=int, help="draft depth of the speculative run (default: the server's)")
    parser.add_argument("--max-steps", type=int, default=6, help="replies per task at most")
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens per reply at most")
    parser.add_argument("--stream", action="store_true", help="stream every reply")
    args = parser.parse_args(argv)
    console = Console(highlight=False)

    def refuse(message: str) -> int:
        print(f"agent.py: {message}", file=sys.stderr)
        return 2

    if args.held_out == bool(args.task):
        return refuse("give a task, or --held-out (not both)")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    root = args.workspace or stdlib
    if not root.is_dir():
        return refuse(f"--workspace: expected a directory, found {root}")
    if args.held_out and root.resolve() != stdlib.resolve():
        return refuse(f"--workspace: the held-out tasks are about the standard library ({stdlib}), found {root}")
    if args.n_max is not None and args.n_max < 1:
        return refuse(f"--n-max: expected a draft depth >= 1 (the plain run is n_max 0), found {args.n_max}")
    for flag, value in (("--max-steps", args.max_steps), ("--max-tokens", args.max_tokens)):
        if value < 1:
            return refuse(f"{flag}: expected at least 1, found {value}")
    workspace = Workspace(root)
    if args.held_out:
        # the held-out tasks and their scoring live with the repository's tests, beside this folder
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from helpers.agent_tasks import held_out_tasks, score, well_formed

        tasks = held_out_tasks(10)
    else:
        tasks, score, well_formed = [args.task], None, None

    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=600)
    runs, solved, formed = [], 0, 0
    try:
        models = [m.id for m in client.models.list().data]
        if not (args.model or models):
            return refuse(f"--base-url: the server at {args.base_url} lists no model; give --model")
        options = dict(model=args.model or models[0], thinking=args.thinking, stream=args.stream,
                       max_steps=args.max_steps, max_tokens=args.max_tokens)
        for i, task in enumerate(tasks, 1):
            text = task.user if score else task
            console.rule(f"task {i}/{len(tasks)}: {escape(text)}" if len(tasks) > 1 else escape(text))
            spec = run_task(client, text, workspace, n_max=args.n_max, **options)
            plain = run_task(client, text, workspace, n_max=0, **options)
            runs.append((spec, plain))
            show(console, spec, plain)
            if numbered_ids(spec.transcript) != numbered_ids(plain.transcript):
                console.print("  [yellow]the plain run's transcript differs from the speculative one[/]")
            if score:
                ok, why = score(task, spec.transcript)
                solved += ok
                formed += well_formed(task, spec.transcript)[0]
                console.print(f"  [{'green' if ok else 'red'}]{'solved' if ok else 'not solved'}: {escape(why)}[/]")
    except openai.APIConnectionError:
        return refuse(f"--base-url: no OpenAI API answers at {args.base_url} (start one: laguna-run serve --bundled agent)")
    except openai.APIStatusError as e:
        return refuse(f"the server at {args.base_url} answered {e.status_code}: {e.message}")
    console.rule()
    if score:
        console.print(f"[bold]solved {solved}/{len(tasks)}[/] (the right tool, well-formed calls and an answer: "
                      f"{formed}/{len(tasks)})")
    summary(console, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
