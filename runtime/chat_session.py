"""A multi-turn chat with a Laguna target in the terminal (``laguna-run chat``, as
``llama-cli -cnv``), and the one-shot ``laguna-run --chat``.

Each turn re-renders the whole conversation with the chat template (as a server's client
does), so the engine's prompt cache finds the earlier turns and prefills only the new part;
the reply is read with :mod:`runtime.chat` (reasoning apart from the answer, tool calls) and
goes back into the history as the template expects it (``reasoning_content``, ``tool_calls``).

Standard output carries the answers only; the reasoning (dim) and a per-turn line of
statistics go to standard error, so ``laguna-run chat < questions.txt > answers.txt`` keeps
the answers. With ``--json`` each turn is one JSON line on standard output: the message
(``content``, ``reasoning_content``, ``tool_calls``), the finish reason and the statistics.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from .chat import message_from_deltas
from .chat_template import ChatTemplate
from .conversation import ChatTurn, end_of_turn_tokens, finish_reason

#: lines the interactive session reads as commands, not as a user's message
COMMANDS = {"/exit": "end the session", "/reset": "forget the conversation (the system prompt stays)",
            "/help": "this list"}


@dataclass
class TurnResult:
    text: str  # as generated, special tokens as their text
    message: dict[str, Any]  # content, reasoning_content, tool_calls
    finish_reason: str
    stop_reason: str
    stats: Any  # engine Stats
    n_prompt: int


class ChatSession:
    """The conversation so far and how to extend it by one turn."""

    def __init__(self, engine, template: ChatTemplate, *, system: str | None = None,
                 template_kwargs: Mapping[str, Any] | None = None,
                 tools: Iterable[Mapping[str, Any]] | None = None) -> None:
        self.engine = engine
        self.template = template
        self.template_kwargs = dict(template_kwargs or {})
        self.tools = list(tools or ()) or None
        self.system = system
        self.end_tokens = end_of_turn_tokens(engine.target)
        self.bos = engine.target.special_text("bos")
        self.eos = engine.target.special_text("eos")
        self.messages: list[dict[str, Any]] = []
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system is not None else []

    def render(self) -> ChatTurn:
        return ChatTurn.render(self.template, self.messages, tools=self.tools, template_kwargs=self.template_kwargs,
                               bos_token=self.bos, eos_token=self.eos)

    def ask(self, text: str, options, on_delta: Callable[[dict], None] | None = None) -> TurnResult:
        """One user message and the model's reply (``options``: the engine's GenerateOptions);
        ``on_delta`` sees the reply's OpenAI deltas as they are generated."""
        self.messages.append({"role": "user", "content": text})
        try:
            turn = self.render()
            prompt = self.engine.target.tokenize(turn.prompt, add_special=not (self.bos and turn.prompt.startswith(
                self.bos)), parse_special=True)
            opts = dataclasses.replace(options, end_tokens=self.end_tokens, special_text=True)
            parser, deltas, pieces = turn.parser(), [], []
            for piece in self.engine.stream(prompt, opts):
                pieces.append(piece)
                for delta in parser.feed(piece):
                    deltas.append(delta)
                    if on_delta is not None:
                        on_delta(delta)
            for delta in parser.finish():
                deltas.append(delta)
                if on_delta is not None:
                    on_delta(delta)
        except BaseException:
            self.messages.pop()  # a turn that did not happen is not history
            raise
        message = message_from_deltas(deltas)
        self.messages.append(history_message(message))
        stats, stop = self.engine.last_stats, self.engine.last_stop_reason
        return TurnResult("".join(pieces), message, finish_reason(stop, bool(message["tool_calls"])), stop, stats,
                          len(prompt))


def history_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A reply as the next turn's template reads it (what an OpenAI client sends back)."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("reasoning_content"):
        out["reasoning_content"] = message["reasoning_content"]
    if message.get("tool_calls"):
        out["tool_calls"] = [dict(c) for c in message["tool_calls"]]
    return out


def turn_json(result: TurnResult) -> dict[str, Any]:
    return {"message": result.message, "finish_reason": result.finish_reason, "stop_reason": result.stop_reason,
            "stats": result.stats.as_dict()}


def turn_summary(result: TurnResult) -> str:
    """One line per turn: what was generated, how fast, how much drafting paid, what the prompt cache saved."""
    s = result.stats
    parts = [f"{s.n_generated} tokens", f"{s.tokens_per_s:.1f} tok/s"]
    if s.drafted:
        parts.append(f"accepted {s.accepted}/{s.drafted} drafts ({s.accepted / s.drafted:.0%}), "
                     f"{s.mean_accepted:.2f} per round")
    parts.append(f"prompt {result.n_prompt} tokens, {s.n_cached} cached")
    if result.finish_reason != "stop":
        parts.append(result.finish_reason)
    return "[" + "; ".join(parts) + "]"


class TerminalPrinter:
    """Writes a reply's deltas as they come: the answer to ``out``, and its tool calls there at
    the end of the turn (they are the answer too); the reasoning to ``err``, dim on a terminal."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self._dim = self.err.isatty()
        self._in_reasoning = False
        self._calls: dict[int, dict[str, str]] = {}

    def __call__(self, delta: dict) -> None:
        if delta.get("reasoning_content"):
            if not self._in_reasoning:
                self.err.write("\x1b[2m" if self._dim else "")
                self.err.write("thinking: ")
                self._in_reasoning = True
            self.err.write(delta["reasoning_content"])
            self.err.flush()
            return
        self._end_reasoning()
        if delta.get("content"):
            self.out.write(delta["content"])
            self.out.flush()
        for item in delta.get("tool_calls") or ():
            call = self._calls.setdefault(item["index"], {"name": "", "arguments": ""})
            function = item.get("function") or {}
            call["name"] += function.get("name") or ""
            call["arguments"] += function.get("arguments") or ""

    def _end_reasoning(self) -> None:
        if self._in_reasoning:
            self.err.write("\x1b[0m\n" if self._dim else "\n")
            self.err.flush()
            self._in_reasoning = False

    def end_turn(self) -> None:
        self._end_reasoning()
        for call in self._calls.values():
            self.out.write(f"\ntool call: {call['name']}({call['arguments']})")
        self._calls.clear()
        self.out.write("\n")
        self.out.flush()


def run_session(session: ChatSession, options, lines: Iterable[str], *, json_lines: bool = False,
                out: TextIO | None = None, err: TextIO | None = None, prompt_marker: str = "> ") -> int:
    """Read user messages from ``lines`` (one per line; ``/exit``, ``/reset``, ``/help``) until
    the end; returns the number of turns."""
    out, err = out or sys.stdout, err or sys.stderr
    interactive = getattr(sys.stdin, "isatty", lambda: False)() and not json_lines
    n_turns = 0
    if interactive:
        err.write("chat: one message per line; " + ", ".join(COMMANDS) + "\n" + prompt_marker)
        err.flush()
    for line in lines:
        text = line.rstrip("\n")
        command = text.strip()
        if command in COMMANDS:
            if command == "/exit":
                break
            if command == "/reset":
                session.reset()
            if command == "/help":
                err.write("".join(f"  {k}  {v}\n" for k, v in COMMANDS.items()))
        elif command:
            if json_lines:
                result = session.ask(text, options)
                out.write(json.dumps(turn_json(result), ensure_ascii=False) + "\n")
                out.flush()
            else:
                printer = TerminalPrinter(out, err)
                result = session.ask(text, options, printer)
                printer.end_turn()
                err.write(turn_summary(result) + "\n")
            n_turns += 1
            if options.should_stop is not None and options.should_stop():  # Ctrl-C: the session ends
                break
        if interactive:
            err.write(prompt_marker)
            err.flush()
    return n_turns
