"""OpenAI's Responses API (``POST /v1/responses``): an adapter over the core's request path
(:mod:`~runtime.server.core`), for Codex CLI and the ``openai`` client's ``responses``.

In: ``input`` as text or items (``message`` with text parts, ``function_call``,
``function_call_output``, ``reasoning``), ``instructions`` (the system prompt), ``tools`` of type
``function`` (other types, the tools OpenAI's servers run, are left out with a log line, not
refused: Codex sends some), ``tool_choice`` (``auto``, ``none``, ``required``, ``{"type":
"function", "name"}``), ``parallel_tool_calls``, ``max_output_tokens``, ``temperature``,
``top_p``, ``text.format`` (``text``, ``json_object``, ``json_schema``), ``reasoning.effort``
(``none``/``minimal``: Laguna's thinking off, any other: on; absent: the server's default),
``stream``, this server's ``n_max``; other fields are ignored.

Out: ``reasoning`` (the chain of thought as ``reasoning_text`` content), ``message``
(``output_text``) and ``function_call`` items; ``status`` ``completed``, or ``incomplete`` with
``incomplete_details.reason: "max_output_tokens"`` (a call cut by it is text); ``usage`` with
``input_tokens_details.cached_tokens``. Streamed: response.created, response.in_progress, then
per item response.output_item.added, its deltas (response.reasoning_text.delta,
response.output_text.delta, response.function_call_arguments.delta with a call's whole
arguments) and their .done events, response.output_item.done; finally response.completed, whose
response says ``incomplete`` where the budget cut it (the ``openai`` client's stream helper and
Codex take only that event as the end).

Stateless: nothing is stored. ``store`` is read and the response says ``store: false``;
``previous_response_id`` is a 400 telling the client to send the whole conversation, which
Codex does whatever ``store`` says. A store would hold every conversation in memory for a
client that may never come back, and a restarted server would answer 400 to ids it gave out.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from .core import ApiError, Call, Reply, Server, sse

PATH = "/v1/responses"
PARAMS = {"n_predict": "max_output_tokens", "prompt": "input", "messages": "input",
          "response_format": "text.format"}
THINKING_OFF = ("none", "minimal")

log = logging.getLogger("laguna_dflash.server")
_logged: set[str] = set()


def _log_once(what: str) -> None:
    if what not in _logged:
        _logged.add(what)
        log.warning("/v1/responses: %s", what)


class ResponsesRequest(BaseModel):
    # unknown fields are ignored (Codex sends fields this server has no use for); the known ones
    # are typed strictly
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    stream: bool = False
    n_max: int | Literal["auto"] | None = None


def _bad(where: str, expected: str, found: Any) -> ApiError:
    return ApiError(400, f"{where}: expected {expected}, found {found!r}", param=where.split("[")[0],
                    code="invalid_value")


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(where, "a string or text parts", type(content).__name__)
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
            raise _bad(f"{where}[{k}].type", "input_text or output_text (this model reads text only)", kind)
        texts.append(part["text"])
    return "".join(texts)


def chat_messages(body: ResponsesRequest) -> list[dict[str, Any]]:
    """The input items as OpenAI chat messages: a function_call (and the reasoning and text
    before it) is an assistant's ``tool_calls``, a function_call_output a ``tool`` message."""
    out: list[dict[str, Any]] = []
    if body.instructions is not None:
        out.append({"role": "system", "content": body.instructions})
    items = [{"type": "message", "role": "user", "content": body.input}] if isinstance(body.input, str) else body.input

    def assistant() -> dict[str, Any]:
        if not out or out[-1]["role"] != "assistant":
            out.append({"role": "assistant", "content": ""})
        return out[-1]

    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise _bad(f"{where}.role", "user, system, developer or assistant", role)
            text = _text(item.get("content", ""), f"{where}.content")
            if role == "assistant":
                last = assistant()
                if last.get("tool_calls"):  # text after a call opens the next turn
                    out.append({"role": "assistant", "content": text})
                else:
                    last["content"] += text
            else:
                out.append({"role": role, "content": text})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            text = "".join(p.get("text", "") for p in parts if isinstance(p, dict))
            last = out[-1] if out else None
            if last is None or last["role"] != "assistant" or last["content"] or last.get("tool_calls"):
                out.append({"role": "assistant", "content": ""})
            out[-1]["reasoning_content"] = out[-1].get("reasoning_content", "") + text
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(item.get("arguments", "{}"), str):
                raise _bad(where, "a function_call with a name and arguments (JSON text)", item.get("name"))
            assistant().setdefault("tool_calls", []).append(
                {"id": str(item.get("call_id", "")), "type": "function",
                 "function": {"name": item["name"], "arguments": item.get("arguments", "{}")}})
        elif kind == "function_call_output":
            output = item.get("output", "")
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")),
                        "content": output if isinstance(output, str) else _text(output, f"{where}.output")})
        elif kind == "item_reference":
            raise _bad(f"{where}.type", "items themselves (this server stores no responses)", kind)
        else:
            _log_once(f"input items of type {kind} are left out (a tool this server does not serve)")
    return out


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(tools or ()):
        if tool.get("type") != "function":
            _log_once(f"tools of type {tool.get('type')} are left out (a tool this server does not run)")
            continue
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise _bad(f"tools[{i}].name", "a function name", tool.get("name"))
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": function})
    return out


def tool_choice(choice: str | dict[str, Any] | None) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _bad("tool_choice", "'auto', 'none', 'required' or {\"type\": \"function\", \"name\": NAME}", choice)


def response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {"schema": fmt.get("schema"), "strict": fmt.get("strict")}}
    raise _bad("text.format.type", "text, json_object or json_schema", fmt.get("type"))


def to_call(server: Server, body: ResponsesRequest) -> Call:
    server.check_text(body)
    if body.previous_response_id is not None:
        raise ApiError(400, "previous_response_id: this server stores no responses: send the whole conversation "
                            "in input (store is not served)", param="previous_response_id", code="invalid_value")
    effort = (body.reasoning or {}).get("effort")
    kwargs = None if effort is None else {"enable_thinking": effort not in THINKING_OFF}
    return Call(messages=chat_messages(body), tools=chat_tools(body.tools), tool_choice=tool_choice(body.tool_choice),
                parallel_tool_calls=body.parallel_tool_calls, template_kwargs=kwargs,
                max_tokens=body.max_output_tokens, sampling={"temperature": body.temperature, "top_p": body.top_p},
                n_max=body.n_max, response_format=response_format(body.text), stream=body.stream, params=PARAMS)


# ---------------------------------------------------------------------- Reply -> the Responses shapes


def usage(stats) -> dict:
    return {"input_tokens": stats.n_prompt, "input_tokens_details": {"cached_tokens": stats.n_cached},
            "output_tokens": stats.n_generated, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": stats.n_prompt + stats.n_generated}


def _id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def reasoning_item(text: str, item_id: str) -> dict:
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def message_item(text: str, item_id: str, status: str = "completed") -> dict:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def call_item(call: dict, item_id: str, arguments: str | None = None, status: str = "completed") -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call["id"], "name": call["function"]["name"],
            "arguments": call["function"]["arguments"] if arguments is None else arguments, "status": status}


class Renderer:
    def __init__(self, model_id: str, body: ResponsesRequest) -> None:
        self.model_id, self.body = model_id, body
        self.id = _id("resp_")
        self.created = int(time.time())

    def _response(self, status: str, output: list, reply: Reply | None) -> dict:
        body = self.body
        incomplete = reply is not None and reply.stop_reason == "length"
        if reply is not None:
            status = "incomplete" if incomplete else "completed"
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "error": None, "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
                "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
                "model": self.model_id, "output": output, "parallel_tool_calls": body.parallel_tool_calls is not False,
                "previous_response_id": None, "reasoning": body.reasoning, "store": False,
                "temperature": body.temperature, "text": body.text or {"format": {"type": "text"}},
                "tool_choice": body.tool_choice or "auto", "tools": body.tools or [], "top_p": body.top_p,
                "truncation": "disabled", "metadata": {},
                "usage": usage(reply.stats) if reply is not None else None}

    def full(self, reply: Reply) -> dict:
        message, output = reply.message, []
        if message["reasoning_content"]:
            output.append(reasoning_item(message["reasoning_content"], _id("rs_")))
        if message["content"]:
            output.append(message_item(message["content"], _id("msg_")))
        output.extend(call_item(call, _id("fc_")) for call in message["tool_calls"])
        return self._response("completed", output, reply)

    async def stream(self, events):
        seq = 0
        output: list[dict] = []
        current: dict | None = None  # the open item: {"kind", "id", "index", "text"}

        def event(kind: str, /, **fields) -> dict:
            nonlocal seq
            seq += 1
            return sse({"type": kind, "sequence_number": seq - 1, **fields}, event=kind)

        def close() -> list[dict]:
            nonlocal current
            if current is None:
                return []
            c, current = current, None
            where = {"item_id": c["id"], "output_index": c["index"]}
            if c["kind"] == "reasoning":
                item = reasoning_item(c["text"], c["id"])
                done = [event("response.reasoning_text.done", content_index=0, text=c["text"], **where)]
            else:
                item = message_item(c["text"], c["id"])
                done = [event("response.output_text.done", content_index=0, text=c["text"], logprobs=[], **where),
                        event("response.content_part.done", content_index=0, part=item["content"][0], **where)]
            output.append(item)
            return done + [event("response.output_item.done", output_index=c["index"], item=item)]

        def open_(kind: str) -> list[dict]:
            nonlocal current
            out = close()
            current = {"kind": kind, "id": _id("rs_" if kind == "reasoning" else "msg_"), "index": len(output),
                       "text": ""}
            where = {"item_id": current["id"], "output_index": current["index"]}
            if kind == "reasoning":
                item = {"type": "reasoning", "id": current["id"], "summary": [], "content": []}
                return out + [event("response.output_item.added", output_index=current["index"], item=item)]
            return out + [event("response.output_item.added", output_index=current["index"],
                                item=message_item("", current["id"], "in_progress")),
                          event("response.content_part.added", content_index=0, **where,
                                part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})]

        async for item in events:
            kind = item[0]
            if kind == "start":
                yield event("response.created", response=self._response("in_progress", [], None))
                yield event("response.in_progress", response=self._response("in_progress", [], None))
            elif kind == "delta":
                delta = item[1]
                for field, name, delta_event in (("reasoning_content", "reasoning", "response.reasoning_text.delta"),
                                                 ("content", "message", "response.output_text.delta")):
                    if field in delta:
                        if current is None or current["kind"] != name:
                            for e in open_(name):
                                yield e
                        current["text"] += delta[field]
                        yield event(delta_event, item_id=current["id"], output_index=current["index"],
                                    content_index=0, delta=delta[field],
                                    **({"logprobs": []} if name == "message" else {}))
                for call in delta.get("tool_calls") or ():
                    for e in close():
                        yield e
                    index, item_id = len(output), _id("fc_")
                    done = call_item(call, item_id)
                    yield event("response.output_item.added", output_index=index,
                                item=call_item(call, item_id, "", "in_progress"))
                    yield event("response.function_call_arguments.delta", item_id=item_id, output_index=index,
                                delta=done["arguments"])
                    yield event("response.function_call_arguments.done", item_id=item_id, output_index=index,
                                name=done["name"], arguments=done["arguments"])
                    output.append(done)
                    yield event("response.output_item.done", output_index=index, item=done)
            elif kind == "done":
                for e in close():
                    yield e
                # response.completed whatever the status (an incomplete one says so in it): the
                # openai client's stream helper and Codex take only that event as the end
                yield event("response.completed", response=self._response("completed", output, item[1]))
            else:
                err = item[1]
                yield event("error", code=err.code, message=err.message, param=err.param)
                yield event("response.failed", response={**self._response("failed", output, None),
                                                         "error": {"code": err.code or "server_error",
                                                                   "message": err.message}})
