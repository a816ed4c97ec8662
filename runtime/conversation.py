"""One chat turn: the conversation rendered, the generation's end, the answer read back.

The server's ``/v1/chat/completions`` and ``/apply-template`` and ``laguna-run chat`` share it:

    turn = ChatTurn.render(template, messages, tools=tools, template_kwargs={"enable_thinking": True},
                           bos_token=bos, eos_token=eos)
    ids = model.tokenize(turn.prompt)                       # generate with special tokens as text,
    text = generate(ids, end_tokens=end_of_turn_tokens(model))  # ending at the model's end of turn
    message = turn.message(text)                            # content, reasoning_content, tool_calls

Whether the output starts inside reasoning is read off the rendered prompt
(:func:`~runtime.chat.starts_in_reasoning`), so a template's default, a request's
``enable_thinking`` and a server's ``--chat-template-kwargs`` all decide it the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..convert.errors import UserError
from .chat import END_OF_TURN, ResponseParser, parse_response, starts_in_reasoning
from .chat_template import ChatTemplate

TOOL_CHOICES = ("auto", "none", "required")


def end_of_turn_tokens(model) -> tuple[int, ...]:
    """Ids of :data:`END_OF_TURN` that are single tokens of ``model``'s vocabulary."""
    ids = []
    for text in END_OF_TURN:
        tokens = model.tokenize(text, add_special=False, parse_special=True)
        if len(tokens) == 1 and model.token_bytes(tokens[0], special=True).decode("utf-8", "replace") == text:
            ids.append(tokens[0])
    return tuple(ids)


def check_tool_choice(tool_choice: Any) -> str | dict[str, Any]:
    """``auto`` (also for None), ``none``, ``required``, or a named function as OpenAI writes it,
    ``{"type": "function", "function": {"name": NAME}}`` (returned in that form). Whether the
    name is among the request's tools is the constraint's to say (runtime/constraint/)."""
    if tool_choice is None:
        return "auto"
    if isinstance(tool_choice, str) and tool_choice in TOOL_CHOICES:
        return tool_choice
    function = tool_choice.get("function") if isinstance(tool_choice, Mapping) else None
    if isinstance(function, Mapping) and tool_choice.get("type") == "function" and isinstance(function.get("name"), str):
        return {"type": "function", "function": {"name": function["name"]}}
    raise UserError("tool_choice: expected 'auto', 'none', 'required' or {'type': 'function', 'function': "
                    f"{{'name': NAME}}}}, found {tool_choice!r}")


def finish_reason(stop_reason: str, tool_calls: bool) -> str:
    """OpenAI's finish reason: ``length`` when the token budget cut the turn (even inside a
    call), ``tool_calls`` when it ended with calls, else ``stop``."""
    if stop_reason == "length":
        return "length"
    return "tool_calls" if tool_calls else "stop"


def response_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """An assistant message as OpenAI writes it: ``reasoning_content`` and ``tool_calls`` only when there are."""
    out = {"role": "assistant", "content": message["content"]}
    if message.get("reasoning_content") is not None:
        out["reasoning_content"] = message["reasoning_content"]
    if message.get("tool_calls"):
        out["tool_calls"] = list(message["tool_calls"])
    return out


@dataclass(frozen=True)
class ChatTurn:
    """A rendered conversation and how to read what the model answers to it."""

    prompt: str
    tools: tuple[dict[str, Any], ...] = ()
    reasoning: bool = False  # the prompt leaves the output inside reasoning
    tool_choice: str | dict[str, Any] = "auto"  # as check_tool_choice returns it
    parallel_tool_calls: bool = True

    @classmethod
    def render(cls, template: ChatTemplate, messages: Sequence[Mapping[str, Any]], *,
               tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None,
               parallel_tool_calls: bool | None = None, template_kwargs: Mapping[str, Any] | None = None,
               add_generation_prompt: bool = True, bos_token: str = "", eos_token: str = "") -> "ChatTurn":
        choice = check_tool_choice(tool_choice)
        prompt = template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                 bos_token=bos_token, eos_token=eos_token, template_kwargs=template_kwargs)
        return cls(prompt, tuple(tools or ()), starts_in_reasoning(prompt), choice, parallel_tool_calls is not False)

    @property
    def tool_calls(self) -> bool:
        """Whether ``<tool_call>`` blocks are read as calls (not for ``tool_choice: "none"``)."""
        return self.tool_choice != "none"

    def constraint(self):
        """The output constraint ``tool_choice`` asks for: Laguna's call markup for ``required``
        (one call with ``parallel_tool_calls: false``) or a named function (one call), after
        the reasoning when the prompt leaves the output inside it; None for ``auto``/``none``."""
        from .constraint import tool_choice_constraint

        return tool_choice_constraint(self.tools, self.tool_choice, parallel_tool_calls=self.parallel_tool_calls,
                                      after_reasoning=self.reasoning)

    def declared_calls(self):
        """With ``tool_choice: "auto"`` and tools: the constraint that holds a call, once opened,
        to the tools (free text otherwise); None else."""
        from .constraint import declared_calls_constraint

        if self.tool_choice != "auto":
            return None
        return declared_calls_constraint(self.tools, parallel_tool_calls=self.parallel_tool_calls,
                                         after_reasoning=self.reasoning)

    def parser(self) -> ResponseParser:
        return ResponseParser(self.tools, self.reasoning, tool_calls=self.tool_calls,
                              parallel_tool_calls=self.parallel_tool_calls)

    def message(self, text: str) -> dict[str, Any]:
        return parse_response(text, tools=self.tools, reasoning=self.reasoning, tool_calls=self.tool_calls,
                              parallel_tool_calls=self.parallel_tool_calls)


def merge_template_kwargs(default: Mapping[str, Any] | None, request: Mapping[str, Any] | None) -> dict[str, Any]:
    """A server's or session's default template variables, each replaced by the request's own."""
    return {**(default or {}), **(request or {})}
