"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``): an adapter
over the core's request path (:mod:`~runtime.server.core`), for Claude Code and Anthropic's
clients.

In: ``system`` (a string or text blocks), ``messages`` with text, ``tool_use``, ``tool_result``
and ``thinking`` blocks (and ``system`` messages between turns, which Claude Code sends), ``tools`` with ``input_schema``, ``tool_choice`` (``auto``, ``any``,
``tool``, ``none``; ``disable_parallel_tool_use``), ``stop_sequences``, ``max_tokens``,
``temperature``/``top_p``/``top_k``, ``thinking`` (``enabled`` with a budget, ``adaptive`` or
``disabled``: Laguna's ``enable_thinking``; the budget is not enforced, the reasoning ends when
the model writes ``</think>``), ``stream``; this server's ``n_max`` (the draft depth). Other
fields (``metadata``, ``cache_control`` on blocks, ``service_tier``...) are read and ignored;
tools without an ``input_schema`` (Anthropic's server tools: web search, code execution) are
left out with a log line, since nothing here runs them.

Out: content blocks ``thinking`` (with an empty ``signature``), ``text`` and ``tool_use``;
``stop_reason`` ``end_turn``, ``tool_use``, ``max_tokens`` or ``stop_sequence``; ``usage`` with
``input_tokens`` (the prompt's tokens not read from the cache), ``cache_read_input_tokens``
(those read from it) and ``output_tokens``; ``stop_sequence`` names the stop string that ended
the reply (a stream given several cannot tell which, and says null). Streaming sends Anthropic's events: message_start,
ping, content_block_start / content_block_delta (``text_delta``, ``thinking_delta``,
``input_json_delta``) / content_block_stop, message_delta (stop reason, usage), message_stop.
Errors: ``{"type": "error", "error": {"type", "message"}}``.

Claude Code's first system block, ``x-anthropic-billing-header: ...; cch=...``, changes on every
request; rendered, it would make every prompt differ from the cached one at its first tokens
and cost a whole prefill each turn. It carries nothing for the model, so it is dropped before
the prompt is rendered (a block, or a first line of a string system, that starts with it).
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from .core import ApiError, Call, Reply, Server, sse

PATH = "/v1/messages"
BILLING_HEADER = "x-anthropic-billing-header:"
#: request field -> its name in this API
PARAMS = {"stop": "stop_sequences", "prompt": "messages", "chat_template_kwargs": "thinking"}
#: HTTP status -> Anthropic's error type (types, not the OpenAI codes docs/server.md tabulates)
ERROR_TYPES = dict(((400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"),
                    (404, "not_found_error"), (413, "request_too_large"), (429, "rate_limit_error"),
                    (503, "overloaded_error")))

log = logging.getLogger("laguna_dflash.server")
_logged_tools: set[str] = set()


class _Body(BaseModel):
    # unknown fields are ignored (Claude Code sends fields this server has no use for); the
    # known ones are typed strictly
    model_config = ConfigDict(extra="ignore", strict=True)


class Message(_Body):
    role: Literal["user", "assistant", "system"]  # Claude Code sends system messages between turns
    content: str | list[dict[str, Any]]


class CountTokensRequest(_Body):
    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int  # its range: runtime/params.py's MAX_TOKENS
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n_max: int | Literal["auto"] | None = None


def is_path(path: str) -> bool:
    return path == PATH or path.startswith(PATH + "/")


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(error_body(err), err.status, headers=err.headers)


def error_body(err: ApiError) -> dict:
    kind = ERROR_TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


# ---------------------------------------------------------------------- request -> Call


def _bad(where: str, expected: str, found: Any) -> ApiError:
    return ApiError(400, f"{where}: expected {expected}, found {found!r}", param=where.split("[")[0],
                    code="invalid_value")


def system_text(system: str | list[dict[str, Any]] | None) -> str | None:
    """The system prompt as one text, Claude Code's per-request billing header left out."""
    if system is None:
        return None
    if isinstance(system, str):
        first, newline, rest = system.partition("\n")
        return rest if first.startswith(BILLING_HEADER) else system
    texts = []
    for j, block in enumerate(system):
        if block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise _bad(f"system[{j}]", "a text block {\"type\": \"text\", \"text\": ...}", block.get("type"))
        if not block["text"].startswith(BILLING_HEADER):
            texts.append(block["text"])
    return "\n\n".join(texts)


def _blocks(message: Message) -> list[dict[str, Any]]:
    return [{"type": "text", "text": message.content}] if isinstance(message.content, str) else message.content


def _tool_result_text(block: dict[str, Any], where: str) -> str:
    content = block.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise _bad(f"{where}.content", "a string or text blocks", type(content).__name__)
    texts = []
    for k, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise _bad(f"{where}.content[{k}]", "a text block (this model reads text only)",
                       part.get("type") if isinstance(part, dict) else part)
        texts.append(part["text"])
    return "\n".join(texts)


def chat_messages(body: CountTokensRequest) -> list[dict[str, Any]]:
    """Anthropic's conversation as OpenAI chat messages: a tool_result is a ``tool`` message,
    tool_use blocks an assistant's ``tool_calls``, thinking its ``reasoning_content``."""
    out: list[dict[str, Any]] = []
    system = system_text(body.system)
    if system is not None:
        out.append({"role": "system", "content": system})
    for i, message in enumerate(body.messages):
        texts: list[str] = []
        reasoning: list[str] = []
        calls: list[dict[str, Any]] = []
        for j, block in enumerate(_blocks(message)):
            where = f"messages[{i}].content[{j}]"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif message.role == "user" and kind == "tool_result":
                if texts:  # text before a result stays before it
                    out.append({"role": "user", "content": "".join(texts)})
                    texts = []
                out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")),
                            "content": _tool_result_text(block, where)})
            elif message.role == "assistant" and kind == "thinking" and isinstance(block.get("thinking"), str):
                reasoning.append(block["thinking"])
            elif message.role == "assistant" and kind == "redacted_thinking":
                continue  # encrypted by Anthropic: nothing this model can read
            elif message.role == "assistant" and kind == "tool_use":
                if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                    raise _bad(where, "a tool_use block with a name and an input object", block.get("name"))
                calls.append({"id": str(block.get("id", "")), "type": "function",
                              "function": {"name": block["name"], "arguments": block.get("input", {})}})
            else:
                allowed = {"user": "text, tool_result", "assistant": "text, thinking, tool_use"}.get(message.role, "text")
                raise _bad(f"{where}.type", f"{allowed} (this model reads text only)", kind)
        if message.role == "system":
            out.append({"role": "system", "content": "".join(texts)})
        elif message.role == "user":
            if texts or not out or out[-1]["role"] != "tool":
                out.append({"role": "user", "content": "".join(texts)})
        else:
            reply: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
            if reasoning:
                reply["reasoning_content"] = "".join(reasoning)
            if calls:
                reply["tool_calls"] = calls
            out.append(reply)
    return out


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(tools or ()):
        if "input_schema" not in tool:
            kind = str(tool.get("type"))
            if kind not in _logged_tools:
                _logged_tools.add(kind)
                log.warning("/v1/messages: tool type %s has no input_schema (a tool Anthropic's servers run): "
                            "left out", kind)
            continue
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise _bad(f"tools[{i}].name", "a tool name", tool.get("name"))
        if not isinstance(tool["input_schema"], dict):
            raise _bad(f"tools[{i}].input_schema", "a JSON schema object", type(tool["input_schema"]).__name__)
        function = {"name": tool["name"]}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        function["parameters"] = tool["input_schema"]
        out.append({"type": "function", "function": function})
    return out


def tool_choice(choice: dict[str, Any] | None) -> tuple[Any, bool | None]:
    """Anthropic's tool_choice as OpenAI's, and parallel_tool_calls."""
    if choice is None:
        return None, None
    kind = choice.get("type")
    parallel = False if choice.get("disable_parallel_tool_use") is True else None
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", None
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise _bad("tool_choice", "{\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", \"name\": NAME}",
               choice)


def thinking(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    kind = value.get("type")
    if kind in ("enabled", "adaptive"):
        return {"enable_thinking": True}
    if kind == "disabled":
        return {"enable_thinking": False}
    raise _bad("thinking.type", "'enabled', 'adaptive' or 'disabled'", kind)


def to_call(server: Server, body: CountTokensRequest) -> Call:
    server.check_text(body)
    choice, parallel = tool_choice(body.tool_choice)
    call = Call(messages=chat_messages(body), tools=chat_tools(body.tools), tool_choice=choice,
                parallel_tool_calls=parallel, template_kwargs=thinking(body.thinking), params=PARAMS)
    if isinstance(body, MessagesRequest):
        call.max_tokens, call.stop, call.stream, call.n_max = body.max_tokens, body.stop_sequences, body.stream, body.n_max
        call.sampling = {"temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k}
    return call


# ---------------------------------------------------------------------- Reply -> Anthropic's shapes


def stop_reason(reply: Reply) -> str:
    if reply.stop_reason == "length":
        return "max_tokens"
    if reply.stop_reason == "stop":
        return "stop_sequence"
    return "tool_use" if reply.tool_calls else "end_turn"


def usage(stats) -> dict:
    return {"input_tokens": stats.n_prompt - stats.n_cached, "output_tokens": stats.n_generated,
            "cache_read_input_tokens": stats.n_cached, "cache_creation_input_tokens": 0}


def tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def tool_use(call: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_use_id(call["id"]), "name": call["function"]["name"],
            "input": json.loads(call["function"]["arguments"])}


class Renderer:
    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        self.id = "msg_" + uuid.uuid4().hex[:24]

    def _message(self, content: list, stop: str | None, stop_sequence: str | None, usage: dict) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model_id, "content": content,
                "stop_reason": stop, "stop_sequence": stop_sequence, "usage": usage}

    def full(self, reply: Reply) -> dict:
        message, content = reply.message, []
        if message["reasoning_content"]:
            content.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
        if message["content"]:
            content.append({"type": "text", "text": message["content"]})
        content.extend(tool_use(call) for call in message["tool_calls"])
        return self._message(content, stop_reason(reply), reply.stop_sequence, usage(reply.stats))

    async def stream(self, events):
        index, open_kind = -1, None

        def event(kind: str, /, **fields) -> dict:
            return sse({"type": kind, **fields}, event=kind)

        def start(kind: str, block: dict):
            nonlocal index, open_kind
            out = [event("content_block_stop", index=index)] if open_kind is not None else []
            index, open_kind = index + 1, kind
            return out + [event("content_block_start", index=index, content_block=block)]

        async for item in events:
            kind = item[0]
            if kind == "start":
                yield event("message_start", message=self._message(
                    [], None, None, {"input_tokens": item[1], "output_tokens": 0, "cache_read_input_tokens": 0,
                                     "cache_creation_input_tokens": 0}))
                yield event("ping")
            elif kind == "delta":
                delta = item[1]
                if "reasoning_content" in delta:
                    if open_kind != "thinking":
                        for e in start("thinking", {"type": "thinking", "thinking": "", "signature": ""}):
                            yield e
                    yield event("content_block_delta", index=index,
                                delta={"type": "thinking_delta", "thinking": delta["reasoning_content"]})
                elif "content" in delta:
                    if open_kind != "text":
                        for e in start("text", {"type": "text", "text": ""}):
                            yield e
                    yield event("content_block_delta", index=index, delta={"type": "text_delta", "text": delta["content"]})
                for call in delta.get("tool_calls") or ():
                    block = {**tool_use({**call, "function": {**call["function"], "arguments": "{}"}}), "input": {}}
                    for e in start("tool_use", block):
                        yield e
                    yield event("content_block_delta", index=index,
                                delta={"type": "input_json_delta", "partial_json": call["function"]["arguments"]})
            elif kind == "done":
                reply = item[1]
                if open_kind is not None:
                    yield event("content_block_stop", index=index)
                yield event("message_delta", delta={"stop_reason": stop_reason(reply),
                                                    "stop_sequence": reply.stop_sequence}, usage=usage(reply.stats))
                yield event("message_stop")
            else:
                yield sse(error_body(item[1]), event="error")
