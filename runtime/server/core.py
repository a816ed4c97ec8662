"""The one request path under every HTTP API: a :class:`Call` in, a :class:`Reply` (or its
stream of parsed deltas) out.

Each API (OpenAI chat and text completions in ``app.py``, Anthropic Messages in
``anthropic.py``, OpenAI Responses in ``responses.py``) is an adapter: it turns its body into a
:class:`Call` (OpenAI-shaped messages and tools, as the chat template takes them, and the names
its own fields have, for errors) and renders the :class:`Reply` or the delta stream in its own
shapes. Everything between is here, once: the prompt (chat template, tokenizer, the context's
bounds), the output constraint (``tool_choice``, ``response_format``), the stop rule (the
model's end of turn, stop strings, the token budget cut to the context), the pool, and the
reply parser (``runtime/chat.py``).

    call = Call(messages=[...], tools=[...], max_tokens=32000, params=PARAMS)
    return await server.run_call(request, lambda: call, "messages", render_full, render_stream)

Request preparation (template, tokenizer) runs in the preparers' threads and generation in the
pool's slot threads, so the event loop never waits on llama.cpp.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from sse_starlette.sse import EventSourceResponse

from ...convert.errors import UserError

from .. import template_limits
from ..chat_template import TEMPLATE_KEY, ChatTemplate
from ..conversation import ChatTurn, end_of_turn_tokens, merge_template_kwargs
from ..params import MAX_TOKENS, SAMPLING, json_of
from ..request import CONTEXT_MARGIN, GenerateOptions, RequestError, context_room, fit_to_context
from ..sampling import SamplingParams
from .guards import PreparePool, default_max_body_bytes, lone_surrogate
from .pool import BackendLost, Job, PoolClosed, QueueFull, SlotPool

#: the request fields a renderer's one-line error can start with; any other is the template's
CHAT_PARAMS = ("messages", "tools", "tool_choice", "chat_template_kwargs")

log = logging.getLogger("laguna_dflash.server")


class ApiError(Exception):
    """A refusal: its status and, for OpenAI's error object, type, param and code (each API
    writes it in its own shape)."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, self.type, self.param, self.code), self.status,
                            headers=self.headers)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def shutting_down(message: str = "the server is shutting down") -> ApiError:
    # Connection: close: a kept-alive client opens a new connection for its next request (refused once
    # the server stops listening) rather than racing the close of this one when the drain ends
    return ApiError(503, message, type="server_error", code="shutting_down", headers={"Connection": "close"})


@dataclass
class ServerSettings:
    model_id: str
    n_max: int | str = 4  # the draft depth of a request that does not give n_max
    api_key: str | None = None
    chat_template: str | None = None  # overrides the GGUF's tokenizer.chat_template
    chat_template_source: str | None = None  # names the template in errors
    chat_template_kwargs: dict | None = None  # defaults for every request's chat_template_kwargs
    close_pool_on_shutdown: bool = True
    max_body_bytes: int | None = None  # None: guards.default_max_body_bytes(n_ctx)
    n_predict: int = -1  # the most tokens a request may generate (-1: up to the end of the context)
    prepare_workers: int = 2  # threads rendering templates and tokenizing


#: request field -> its JSON name in OpenAI's chat completions where it is not params.json_of's
#: (an API's adapter gives its own)
OPENAI_CHAT_PARAMS = {"prompt": "messages"}


@dataclass
class Call:
    """One generation as every API asks for it. ``messages`` and ``tools`` are in OpenAI's chat
    shape (what the chat template reads); ``prompt`` (text or token ids) instead of messages is
    a raw completion. ``params`` maps a request field (``n_predict``, ``stop``, ``prompt``...)
    to the API's own name for it, so that an error names what the client sent."""

    messages: list[dict] | None = None
    prompt: str | list[int] | None = None
    tools: list[dict] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    template_kwargs: dict | None = None
    max_tokens: int | None = None  # None: the rest of the context
    sampling: dict = field(default_factory=dict)  # the sampling fields (params.SAMPLING) the client sent
    stop: tuple[str, ...] | list[str] | str | None = None
    n_max: int | str | None = None
    response_format: dict | None = None
    grammar: str | None = None
    json_schema: Any = None
    stream: bool = False
    params: Mapping[str, str] = field(default_factory=lambda: OPENAI_CHAT_PARAMS)

    def param(self, name: str) -> str:
        return self.params.get(name) or json_of(name)

    @property
    def chat(self) -> bool:
        return self.messages is not None


@dataclass
class Prepared:
    tokens: list[int]
    options: GenerateOptions
    depth: int | str
    turn: ChatTurn | None


@dataclass
class Reply:
    """A finished generation: ``message`` (chat: content, reasoning_content, tool_calls as
    runtime/chat.py reads them; None for a raw completion), the engine's ``stop_reason``
    (``eog``, ``stop``, ``length``), the stop string that ended it, and the stats."""

    text: str
    message: dict | None
    stop_reason: str
    stop_sequence: str | None
    stats: Any
    job: Job
    depth: int | str

    @property
    def tool_calls(self) -> bool:
        return bool(self.message and self.message["tool_calls"])


class Server:
    """Prepares calls, runs them on the pool and reads the replies back."""

    def __init__(self, pool: SlotPool, settings: ServerSettings) -> None:
        self.pool, self.settings = pool, settings
        engine = pool.engine
        self.target = engine.target
        self.limits = engine.limits
        self.n_ctx = self.limits.n_ctx
        self.max_draft = self.limits.max_draft
        self.bos = self.target.special_text("bos")
        self.eos = self.target.special_text("eos")
        text, source = settings.chat_template, settings.chat_template_source
        if text is None:
            try:
                text = self.target.chat_template()
            except UnicodeDecodeError as e:
                raise UserError(f"{self.target.path}: {TEMPLATE_KEY}: expected UTF-8 text, found invalid bytes "
                                f"({e.reason})") from None
            source = str(self.target.path)
        self.template = ChatTemplate(text, source or "chat template") if text else None
        self.end_tokens = end_of_turn_tokens(self.target)
        from ..prompt_bound import longest_token_bytes

        self.longest_token = longest_token_bytes(self.target.path)
        self.max_body_bytes = settings.max_body_bytes or default_max_body_bytes(self.n_ctx)
        self.preparing = PreparePool(settings.prepare_workers, max_waiting=pool.max_queue + len(pool.slots))
        self.draining = False  # a signal came: no new requests
        self.created = int(time.time())

    # ------------------------------------------------------------------ preparation (a thread)

    def check_text(self, body) -> None:
        """A lone surrogate anywhere in the body (JSON allows it, UTF-8 does not) is a 400 naming it."""
        found = lone_surrogate(body.model_dump(exclude_none=True))
        if found is not None:
            where, index, char = found
            raise ApiError(400, f"{where}: expected Unicode text, found a lone surrogate U+{ord(char):04X} at "
                                f"character {index}", param=where, code="invalid_value")

    def check_length(self, n: int, param: str, tokens: bool = False) -> None:
        """Refuse, before tokenizing it, a prompt that cannot fit the context (prompt_bound)."""
        from ..prompt_bound import min_tokens

        least = n if tokens else min_tokens(n, self.longest_token)
        if least > self.n_ctx - CONTEXT_MARGIN:
            raise ApiError(400, f"this model's context is {self.n_ctx} tokens; the prompt needs at least {least} "
                                f"({n} {'tokens' if tokens else 'characters'}): shorten it", param=param,
                           code="context_length_exceeded")

    def chat_turn(self, call: Call, add_generation_prompt: bool = True) -> ChatTurn:
        """The rendered conversation; a malformed message, tool or template variable is a 400
        naming it."""
        if self.template is None:
            raise ApiError(400, f"{self.target.path.name} has no chat template ({TEMPLATE_KEY}): start the "
                                "server with --chat-template-file FILE, or use /v1/completions",
                           param=call.param("messages"), code="no_chat_template")
        # templates keep the messages' text: what cannot fit is refused before the template runs
        self.check_length(sum(_text_length(m.get("content")) for m in call.messages), call.param("prompt"))
        try:
            with template_limits.bounded(max_chars=template_limits.chars_for_context(self.n_ctx)):
                # without tools a call could name no declared tool: its markup stays text
                choice = call.tool_choice if call.tools or call.tool_choice not in (None, "auto") else "none"
                return ChatTurn.render(
                    self.template, call.messages, tools=call.tools or (), tool_choice=choice,
                    parallel_tool_calls=call.parallel_tool_calls,
                    template_kwargs=merge_template_kwargs(self.settings.chat_template_kwargs, call.template_kwargs),
                    add_generation_prompt=add_generation_prompt, bos_token=self.bos, eos_token=self.eos)
        except UserError as e:
            if TEMPLATE_KEY in str(e):  # the template itself failed or was stopped by its bounds
                raise ApiError(400, str(e), param=call.param("messages"), code="template_error") from None
            found = re.match(r"[a-z_]+", str(e))
            name = found.group() if found and found.group() in CHAT_PARAMS else "messages"
            raise ApiError(400, str(e), param=call.param(name), code="invalid_value") from None

    def chat_tokens(self, turn: ChatTurn) -> list[int]:
        # a template that writes the BOS itself must not get a second one
        return self.target.tokenize(turn.prompt, add_special=not (self.bos and turn.prompt.startswith(self.bos)),
                                    parse_special=True)

    def _prompt_tokens(self, call: Call) -> list[int]:
        prompt, param = call.prompt, call.param("prompt")
        if isinstance(prompt, str):
            self.check_length(len(prompt), param)
            return self.target.tokenize(prompt, add_special=True, parse_special=True)
        n_vocab = self.target.n_vocab
        bad = next((t for t in prompt if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise ApiError(400, f"{param}: expected token ids in 0..{n_vocab - 1}, found {bad}", param=param,
                           code="invalid_value")
        self.check_length(len(prompt), param, tokens=True)
        return list(prompt)

    def prepare(self, call: Call) -> Prepared:
        """The call's prompt tokens and generation options; ApiError (400) naming the field."""
        try:
            if call.max_tokens is not None:
                MAX_TOKENS.check(call.max_tokens)
            sampling = SamplingParams(**{k: v for k, v in call.sampling.items()
                                         if v is not None and k in SAMPLING.fields()})
            options = GenerateOptions(n_predict=call.max_tokens or 0,
                                      n_max=call.n_max if call.n_max is not None else self.settings.n_max,
                                      sampling=sampling, stop=call.stop or ()).check_limits(self.limits)
            turn = None
            if call.chat:
                turn = self.chat_turn(call)
                self.check_length(len(turn.prompt), call.param("prompt"))
                tokens = self.chat_tokens(turn)
                # a reply read for reasoning and tool calls: specials as text, ended at the end of turn
                options.end_tokens, options.special_text = self.end_tokens, True
            else:
                tokens = self._prompt_tokens(call)
            options.constraint = self._constraint(call, turn)
            budget = call.max_tokens if call.max_tokens is not None else context_room(len(tokens), self.n_ctx)
            if self.settings.n_predict > 0:  # the server's cap (-n), as llama-server's
                budget = min(budget, self.settings.n_predict)
            options.n_predict = fit_to_context(len(tokens), budget, self.n_ctx)
        except RequestError as e:
            param = call.param(e.field)
            raise ApiError(400, e.render(param), param=param, code=e.code) from None
        return Prepared(tokens, options, options.n_max, turn)

    def count_tokens(self, call: Call) -> int:
        """The prompt's length in tokens, as :meth:`prepare` would make it."""
        return len(self.chat_tokens(self.chat_turn(call))) if call.chat else len(self._prompt_tokens(call))

    def _constraint(self, call: Call, turn: ChatTurn | None):
        """The call's output constraint compiled for the target (cached per schema), or None:
        ``tool_choice`` ``required`` or a named function, else ``response_format``, ``grammar``
        or ``json_schema``, else (``auto`` with tools) calls held to the declared tools. A chat prompt that leaves the model inside reasoning (it ends in
        <think>) lets the reasoning run free up to </think> first."""
        from ..constraint import ConstraintError, compile_constraint, constraint_from_request

        constraint = constraint_from_request(call.response_format, call.grammar, call.json_schema,
                                             forced_call=turn.constraint() if turn is not None else None,
                                             declared_calls=turn.declared_calls() if turn is not None else None,
                                             after_reasoning=turn is not None and turn.reasoning)
        if constraint is None:
            return None
        try:
            return compile_constraint(constraint, self.target)
        except ConstraintError as e:
            if not constraint.declared_calls:
                raise
            # tools whose schemas cannot be compiled (beyond the limits, a keyword the grammar
            # cannot hold) still serve, unconstrained, as before: only a forced call needs them
            _log_once(f"tool calls not held to the tools' schemas: {e.render(call.param(e.field))}")
            return None

    # ------------------------------------------------------------------ running

    def _outcome_error(self, kind: str, value) -> ApiError:
        if kind == "done":  # interrupted with the client still there: the server is stopping
            return shutting_down()
        if isinstance(value, PoolClosed):
            return shutting_down()
        if isinstance(value, BackendLost):
            return ApiError(503, f"backend lost: {value}", type="server_error", code="backend_lost")
        if isinstance(value, ValueError):
            return ApiError(400, str(value), code="invalid_value")
        return ApiError(500, f"generation failed: {value}", type="server_error", code="internal_error")

    async def start(self, call_of: Callable[[], Call], endpoint: str) -> tuple[Call, Prepared, Job]:
        """The call prepared (in a preparer thread) and submitted to the pool."""
        if self.draining:
            raise shutting_down()
        try:
            call, prepared = await self.preparing.run(lambda: self._made(call_of))
        except ApiError:
            self.pool.metrics.inc("laguna_requests_total", endpoint=endpoint, outcome="bad_request")
            raise
        except PreparePool.Full:
            self.pool.metrics.inc("laguna_requests_total", endpoint=endpoint, outcome="queue_full")
            raise ApiError(503, f"all {self.preparing.workers} request preparers are busy and the queue is full: try "
                                "again later", type="server_error", code="queue_full",
                           headers={"Retry-After": "1"}) from None
        job = Job(prepared.tokens, prepared.options, stream=call.stream, endpoint=endpoint)
        try:
            self.pool.submit(job)
        except QueueFull:
            self.pool.metrics.inc("laguna_requests_total", endpoint=endpoint, outcome="queue_full")
            raise ApiError(503, f"all {len(self.pool.slots)} slots are busy and {self.pool.max_queue} requests "
                                "wait: try again later", type="server_error", code="queue_full",
                           headers={"Retry-After": "1"}) from None
        except PoolClosed:
            raise shutting_down() from None
        except BackendLost as e:
            self.pool.metrics.inc("laguna_requests_total", endpoint=endpoint, outcome="backend_lost")
            raise ApiError(503, f"backend lost: {e}", type="server_error", code="backend_lost") from None
        return call, prepared, job

    def _made(self, call_of: Callable[[], Call]) -> tuple[Call, Prepared]:
        call = call_of()
        return call, self.prepare(call)

    async def run_call(self, request: Request, call_of: Callable[[], Call], endpoint: str,
                       full: Callable[[Reply], dict],
                       stream: Callable[[AsyncIterator[tuple]], AsyncIterator[dict]]) -> Response:
        """Run one call: ``full`` renders the reply of a whole request, ``stream`` turns
        :meth:`events` into the API's server-sent events."""
        call, prepared, job = await self.start(call_of, endpoint)
        if call.stream:
            return EventSourceResponse(stream(self.events(job, prepared)), sep="\n")
        kind, value = await self.wait(request, job)
        if kind is None:  # the client went away
            return Response(status_code=499)
        if kind != "done" or value.stop_reason == "interrupted":
            raise self._outcome_error(kind, value)
        return JSONResponse(full(self.reply(value, job, prepared)))

    def reply(self, outcome, job: Job, prepared: Prepared, text: str | None = None) -> Reply:
        """The outcome read back; ``text``: a streamed job's text, as its pieces came."""
        turn = prepared.turn
        text = outcome.text if text is None else text
        return Reply(text, turn.message(text) if turn is not None else None, outcome.stop_reason,
                     self._stop_sequence(outcome, text, prepared.options.stop), outcome.stats, job, prepared.depth)

    def _stop_sequence(self, outcome, text: str, stops) -> str | None:
        """The stop string that ended the generation: the only one, or the one the generated
        text goes on with after the kept text (None where a stream did not keep the tokens)."""
        if outcome.stop_reason != "stop" or not stops:
            return None
        if len(stops) == 1:
            return stops[0]
        raw = b"".join(self.target.token_bytes(t, special=True) for t in outcome.tokens).decode("utf-8", "replace")
        rest = raw[len(text):]
        return next((s for s in sorted(stops, key=len, reverse=True) if rest.startswith(s)), None)

    async def wait(self, request: Request, job: Job):
        """The job's outcome, or (None, None) when the client disconnects first (the job is
        cancelled: it stops at its next round and frees its slot)."""
        getter = asyncio.ensure_future(job.events.get())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({getter, gone}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self.pool.cancel(job)
            raise
        finally:
            gone.cancel()
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            return getter.result()
        self.pool.cancel(job)
        return None, None

    async def events(self, job: Job, prepared: Prepared) -> AsyncIterator[tuple]:
        """A streamed job read back: ``("start", n_prompt_tokens)``, then ``("text", str)`` pieces of a raw completion or ``("delta",
        dict)`` parsed chat deltas (runtime/chat.py: content, reasoning_content, whole tool
        calls), then ``("done", Reply)``; or ``("error", ApiError)``; or ``("cut", ApiError,
        Reply or None)`` when the shutdown cut the generation short (the text is incomplete)."""
        turn = prepared.turn
        parser = turn.parser() if turn is not None else None
        pieces: list[str] = []
        try:
            yield "start", len(prepared.tokens)
            while True:
                kind, value = await job.events.get()
                if kind == "text":
                    pieces.append(value)
                    if parser is None:
                        yield "text", value
                    for delta in parser.feed(value) if parser is not None else ():
                        yield "delta", delta
                    continue
                if kind == "done" and value.stop_reason != "interrupted":
                    reply = self.reply(value, job, prepared, "".join(pieces))
                    for delta in parser.finish() if parser is not None else ():
                        yield "delta", delta
                    yield "done", reply
                    return
                if self.draining and (kind == "done" or isinstance(value, PoolClosed)):
                    yield ("cut", shutting_down("the server is shutting down: this response was cut short"),
                           self.reply(value, job, prepared, "".join(pieces)) if kind == "done" else None)
                else:
                    yield "error", self._outcome_error(kind, value)
                return
        finally:
            if not job.finished:  # the client went away mid-stream (or the server stops)
                self.pool.cancel(job)


_logged: set[str] = set()


def _log_once(message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        log.warning("%s", message)


def _text_length(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p.get("text") or "") for p in content if isinstance(p, Mapping))
    return 0


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body has been read: the next ASGI message
    is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def sse(obj: dict, event: str | None = None) -> dict:
    out = {"data": json.dumps(obj, ensure_ascii=False)}
    if event is not None:
        out["event"] = event
    return out
