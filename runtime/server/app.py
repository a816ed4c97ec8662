"""The OpenAI-compatible HTTP API over a :class:`~runtime.server.pool.SlotPool`.

    POST /v1/completions        POST /v1/chat/completions   (SSE when "stream": true)
    GET  /v1/models             GET  /health                GET  /metrics (Prometheus text)
    POST /apply-template        POST /tokenize              POST /detokenize   (llama-server's)

Chat requests are read with Laguna's chat contract (:mod:`runtime.chat`): ``tools`` in,
``tool_calls`` out (``finish_reason: "tool_calls"``), the chain of thought apart as
``reasoning_content`` (``delta.reasoning_content`` when streaming), generation ending at the
model's end-of-turn tokens.

Every error is OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: a malformed
body, an unknown field or a value out of range 400; a prompt that leaves no room in the context
400 (``context_length_exceeded``; a ``max_tokens`` beyond the context generates until it is full
and finishes with ``length``, as llama-server does); a wrong or missing API key 401; a
full queue 503. Responses carry ``usage`` and a llama-server style ``timings`` object with the
speculative statistics (drafted, accepted, accepted per round, acceptance by position).

Request preparation (chat template, tokenizer) runs in the preparers' threads and generation in
the pool's slot threads, so the event loop never waits on llama.cpp; bodies, prompts, templates
and the shutdown are bounded by :mod:`~runtime.server.guards` (docs/server.md, "Limits").
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import re
import time
import uuid
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...convert.errors import UserError

from .. import template_limits
from ..chat_template import TEMPLATE_KEY, ChatTemplate
from ..conversation import ChatTurn, end_of_turn_tokens, finish_reason, merge_template_kwargs, response_message
from ..params import MAX_TOKENS, SAMPLING, json_of
from ..request import CONTEXT_MARGIN, GenerateOptions, RequestError, context_room, fit_to_context
from ..sampling import SamplingParams
from .guards import BodyLimitMiddleware, PreparePool, default_max_body_bytes, lone_surrogate
from .pool import BackendLost, Job, PoolClosed, QueueFull, SlotPool
from .schemas import (ApplyTemplateRequest, ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                      GenerationFields, NamedToolChoice, TokenizeRequest)

#: OpenAI's default max_tokens of /v1/completions
COMPLETION_MAX_TOKENS = 16
PUBLIC_PATHS = frozenset({"/health"})
#: the request fields a renderer's one-line error can start with; any other is the template's
CHAT_PARAMS = ("messages", "tools", "tool_choice", "chat_template_kwargs")


class ApiError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, self.type, self.param, self.code), self.status,
                            headers=self.headers)


def shutting_down(message: str = "the server is shutting down") -> ApiError:
    # Connection: close: a kept-alive client opens a new connection for its next request (refused once
    # the server stops listening) rather than racing the close of this one when the drain ends
    return ApiError(503, message, type="server_error", code="shutting_down", headers={"Connection": "close"})


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


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
    prepare_workers: int = 2  # threads rendering templates and tokenizing


class ApiKeyMiddleware:
    """``Authorization: Bearer KEY`` on every path but /health, compared in constant time.
    The key is never logged or echoed."""

    def __init__(self, app, key: str) -> None:
        self.app = app
        self._key = key.encode("utf-8")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in PUBLIC_PATHS:
            auth = b""
            for name, value in scope.get("headers", ()):
                if name == b"authorization":
                    auth = value
                    break
            scheme, _, token = auth.partition(b" ")
            ok = scheme.lower() == b"bearer"
            # compare even when the scheme is wrong, so the time does not tell which part failed
            ok = hmac.compare_digest(token.strip(), self._key) and ok
            if not ok:
                await ApiError(401, "invalid or missing API key (send Authorization: Bearer KEY)",
                               type="authentication_error", code="invalid_api_key",
                               headers={"WWW-Authenticate": "Bearer"}).response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


class Server:
    """Prepares requests, runs them on the pool and writes OpenAI responses."""

    def __init__(self, pool: SlotPool, settings: ServerSettings) -> None:
        self.pool, self.settings = pool, settings
        engine = pool.engine
        self.target = engine.target
        self.limits = engine.limits
        self.n_ctx = self.limits.n_ctx
        self.max_draft = self.limits.max_draft
        self.bos = self.target.special_text("bos")
        self.eos = self.target.special_text("eos")
        self.created = int(time.time())
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

    # ------------------------------------------------------------------ preparation (a thread)

    def _check_common(self, body: GenerationFields) -> None:
        if body.n not in (None, 1):
            raise ApiError(400, f"n: expected 1 (one choice per request), found {body.n}", param="n",
                           code="invalid_value")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(body, name)
            if value not in (None, 0, 0.0):
                raise ApiError(400, f"{name}: expected 0 (OpenAI's additive penalties have no exact counterpart "
                                    f"here; use repeat_penalty), found {value}", param=name, code="invalid_value")

    def _prompt_tokens(self, body) -> tuple[list[int], ChatTurn | None]:
        if isinstance(body, ChatCompletionRequest):
            turn = self.chat_turn(body)
            self._check_length(len(turn.prompt), "messages")
            # a template that writes the BOS itself must not get a second one
            return self.target.tokenize(turn.prompt, add_special=not (self.bos and turn.prompt.startswith(self.bos)),
                                        parse_special=True), turn
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise ApiError(400, f"prompt: expected one prompt per request, found {len(prompt)}", param="prompt",
                               code="invalid_value")
            prompt = prompt[0]
        if isinstance(prompt, str):
            self._check_length(len(prompt), "prompt")
            return self.target.tokenize(prompt, add_special=True, parse_special=True), None
        n_vocab = self.target.n_vocab
        bad = next((t for t in prompt if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise ApiError(400, f"prompt: expected token ids in 0..{n_vocab - 1}, found {bad}", param="prompt",
                           code="invalid_value")
        self._check_length(len(prompt), "prompt", tokens=True)
        return list(prompt), None

    def chat_turn(self, body: ChatCompletionRequest, add_generation_prompt: bool = True) -> ChatTurn:
        """The rendered conversation; a malformed message, tool or template variable is a 400
        naming it."""
        if self.template is None:
            raise ApiError(400, f"{self.target.path.name} has no chat template ({TEMPLATE_KEY}): start the "
                                "server with --chat-template-file FILE, or use /v1/completions",
                           param="messages", code="no_chat_template")
        # templates keep the messages' text: what cannot fit is refused before the template runs
        self._check_length(sum(len(m.content) if isinstance(m.content, str) else sum(len(p.text) for p in m.content)
                               for m in body.messages if m.content is not None), "messages")
        try:
            with template_limits.bounded(max_chars=template_limits.chars_for_context(self.n_ctx)):
                return ChatTurn.render(
                    self.template, [m.template_fields() for m in body.messages],
                    tools=[t.template_fields() for t in body.tools or ()],
                    tool_choice=body.tool_choice.model_dump() if isinstance(body.tool_choice, NamedToolChoice)
                    else body.tool_choice,
                    parallel_tool_calls=body.parallel_tool_calls,
                    template_kwargs=merge_template_kwargs(self.settings.chat_template_kwargs, body.chat_template_kwargs),
                    add_generation_prompt=add_generation_prompt, bos_token=self.bos, eos_token=self.eos)
        except UserError as e:
            if TEMPLATE_KEY in str(e):  # the template itself failed or was stopped by its bounds
                raise ApiError(400, str(e), param="messages", code="template_error") from None
            field = re.match(r"[a-z_]+", str(e))
            raise ApiError(400, str(e), param=field.group() if field and field.group() in CHAT_PARAMS
                           else "messages", code="invalid_value") from None

    def _check_length(self, n: int, param: str, tokens: bool = False) -> None:
        """Refuse, before tokenizing it, a prompt that cannot fit the context (prompt_bound)."""
        from ..prompt_bound import min_tokens

        least = n if tokens else min_tokens(n, self.longest_token)
        if least > self.n_ctx - CONTEXT_MARGIN:
            raise ApiError(400, f"this model's context is {self.n_ctx} tokens; the prompt needs at least {least} "
                                f"({n} {'tokens' if tokens else 'characters'}): shorten it", param=param,
                           code="context_length_exceeded")

    def _check_text(self, body) -> None:
        found = lone_surrogate(body.model_dump(exclude_none=True))
        if found is not None:
            where, index, char = found
            raise ApiError(400, f"{where}: expected Unicode text, found a lone surrogate U+{ord(char):04X} at "
                                f"character {index}", param=where, code="invalid_value")

    def prepare(self, body) -> tuple[list[int], GenerateOptions, int | str, ChatTurn | None]:
        self._check_text(body)
        self._check_common(body)
        chat = isinstance(body, ChatCompletionRequest)
        max_tokens = (body.max_completion_tokens if chat and body.max_completion_tokens is not None
                      else body.max_tokens)
        try:
            if max_tokens is not None:
                MAX_TOKENS.check(max_tokens)
            sampling = SamplingParams(**{k: getattr(body, k) for k in SAMPLING.fields()
                                         if getattr(body, k) is not None})
            options = GenerateOptions(n_predict=max_tokens or 0,
                                      n_max=body.n_max if body.n_max is not None else self.settings.n_max,
                                      sampling=sampling, stop=body.stop or ()).check_limits(self.limits)
            tokens, turn = self._prompt_tokens(body)
            options.constraint = self._constraint(body, turn)
            if max_tokens is None:
                max_tokens = context_room(len(tokens), self.n_ctx) if chat else COMPLETION_MAX_TOKENS
            options.n_predict = fit_to_context(len(tokens), max_tokens, self.n_ctx)
            if chat:  # a reply read for reasoning and tool calls: specials as text, ended at the end of turn
                options.end_tokens, options.special_text = self.end_tokens, True
        except RequestError as e:
            raise request_error(e, body, chat) from None
        return tokens, options, options.n_max, turn

    def _constraint(self, body, turn: ChatTurn | None):
        """The request's output constraint compiled for the target (cached per schema), or None:
        ``tool_choice`` ``required`` or a named function, else ``response_format``, ``grammar``
        or ``json_schema``. A chat prompt that leaves the model inside reasoning (it ends in
        <think>) lets the reasoning run free up to </think> first."""
        from ..constraint import compile_constraint, constraint_from_request

        constraint = constraint_from_request(body.response_format, body.grammar, body.json_schema,
                                             forced_call=turn.constraint() if turn is not None else None,
                                             after_reasoning=turn is not None and turn.reasoning)
        return None if constraint is None else compile_constraint(constraint, self.target)

    # ------------------------------------------------------------------ responses

    @staticmethod
    def finish_reason(stop_reason: str) -> str:
        return "length" if stop_reason == "length" else "stop"

    @staticmethod
    def usage(stats) -> dict:
        return {"prompt_tokens": stats.n_prompt, "completion_tokens": stats.n_generated,
                "total_tokens": stats.n_prompt + stats.n_generated,
                "prompt_tokens_details": {"cached_tokens": stats.n_cached}}

    @staticmethod
    def timings(stats, job: Job, depth) -> dict:
        n_new = stats.n_prompt - stats.n_cached
        return {
            "cache_n": stats.n_cached, "prompt_n": n_new, "prompt_ms": stats.t_prefill * 1e3,
            "prompt_per_second": n_new / stats.t_prefill if stats.t_prefill > 0 else 0.0,
            "predicted_n": stats.n_generated, "predicted_ms": stats.t_total * 1e3,
            "predicted_per_second": stats.tokens_per_s,
            "draft_n": stats.drafted, "draft_n_accepted": stats.accepted,
            "rounds": stats.rounds, "accepted_per_round": stats.mean_accepted,
            "acceptance_by_position": stats.acceptance_by_position,
            "depth_rounds": {str(k): v for k, v in sorted(stats.depth_rounds.items())},
            "n_max": depth, "queue_ms": job.queue_s * 1e3, "slot": job.slot,
        }

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

    async def run(self, request: Request, body, endpoint: str):
        if self.draining:
            raise shutting_down()
        try:
            tokens, options, depth, turn = await self.preparing.run(self.prepare, body)
        except ApiError:
            self.pool.metrics.inc("laguna_requests_total", endpoint=endpoint, outcome="bad_request")
            raise
        except PreparePool.Full:
            self.pool.metrics.inc("laguna_requests_total", endpoint=endpoint, outcome="queue_full")
            raise ApiError(503, f"all {self.preparing.workers} request preparers are busy and the queue is full: try "
                                "again later", type="server_error", code="queue_full",
                           headers={"Retry-After": "1"}) from None
        job = Job(tokens, options, stream=body.stream, endpoint=endpoint)
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
        rid = ("chatcmpl-" if endpoint == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return EventSourceResponse(self._stream(job, endpoint, rid, depth, include_usage, turn), sep="\n")
        kind, value = await self._wait(request, job)
        if kind is None:  # the client went away
            return Response(status_code=499)
        if kind != "done" or value.stop_reason == "interrupted":
            raise self._outcome_error(kind, value)
        return JSONResponse(self._full(endpoint, rid, value, job, depth, turn))

    async def _wait(self, request: Request, job: Job):
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

    def _full(self, endpoint: str, rid: str, out, job: Job, depth, turn: ChatTurn | None) -> dict:
        choice = {"index": 0, "finish_reason": self.finish_reason(out.stop_reason), "logprobs": None}
        if endpoint == "chat":
            message = turn.message(out.text)
            choice["message"] = response_message(message)
            choice["finish_reason"] = finish_reason(out.stop_reason, bool(message["tool_calls"]))
            obj = "chat.completion"
        else:
            choice["text"] = out.text
            obj = "text_completion"
        return {"id": rid, "object": obj, "created": int(time.time()), "model": self.settings.model_id,
                "system_fingerprint": None, "choices": [choice], "usage": self.usage(out.stats),
                "timings": self.timings(out.stats, job, depth)}

    def _chunk(self, endpoint: str, rid: str, created: int, text: str | None, finish: str | None = None,
               role: bool = False, delta: dict | None = None) -> dict:
        if endpoint == "chat":
            if delta is None:
                delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text is not None else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
            obj = "text_completion"
        return {"id": rid, "object": obj, "created": created, "model": self.settings.model_id,
                "system_fingerprint": None, "choices": [choice]}

    async def _stream(self, job: Job, endpoint: str, rid: str, depth, include_usage: bool, turn: ChatTurn | None):
        created = int(time.time())
        parser = turn.parser() if turn is not None else None
        try:
            if endpoint == "chat":
                yield _sse(self._chunk(endpoint, rid, created, None, role=True))
            while True:
                kind, value = await job.events.get()
                if kind == "text":
                    if parser is None:
                        yield _sse(self._chunk(endpoint, rid, created, value))
                    for delta in parser.feed(value) if parser is not None else ():
                        yield _sse(self._chunk(endpoint, rid, created, None, delta=delta))
                    continue
                if kind == "done" and value.stop_reason != "interrupted":
                    finish = self.finish_reason(value.stop_reason)
                    if parser is not None:
                        for delta in parser.finish():
                            yield _sse(self._chunk(endpoint, rid, created, None, delta=delta))
                        finish = finish_reason(value.stop_reason, parser.n_calls > 0)
                    last = self._chunk(endpoint, rid, created, None, finish=finish)
                    last["usage"] = self.usage(value.stats)
                    last["timings"] = self.timings(value.stats, job, depth)
                    yield _sse(last)
                    if include_usage:  # OpenAI's own usage chunk: no choices
                        yield _sse({"id": rid, "object": last["object"], "created": created,
                                    "model": self.settings.model_id, "choices": [],
                                    "usage": self.usage(value.stats)})
                else:
                    err = self._outcome_error(kind, value)
                    if self.draining and (kind == "done" or isinstance(value, PoolClosed)):
                        # cut by the shutdown: a finish reason (the text is incomplete), then why
                        last = self._chunk(endpoint, rid, created, None, finish="length")
                        if kind == "done":
                            last["usage"] = self.usage(value.stats)
                        yield _sse(last)
                        err = shutting_down("the server is shutting down: this response was cut short")
                    yield _sse(error_body(err.message, err.type, err.param, err.code))
                break
            yield {"data": "[DONE]"}
        finally:
            if not job.finished:  # the client went away mid-stream (or the server stops)
                self.pool.cancel(job)


def request_error(e: RequestError, body, chat: bool) -> ApiError:
    """A 400 naming the JSON parameter; a prompt too long for the context blames max_tokens when
    the client set it, else the prompt."""
    param = json_of(e.field)
    if param == "max_tokens" and chat and body.max_completion_tokens is not None:
        param = "max_completion_tokens"
    if e.code == "context_length_exceeded" or e.field == "prompt":
        given = body.max_tokens is not None or (chat and body.max_completion_tokens is not None)
        if e.field == "prompt" or not given:
            param = "messages" if chat else "prompt"
    return ApiError(400, e.render(param), param=param, code=e.code)


def _sse(obj: dict) -> dict:
    return {"data": json.dumps(obj, ensure_ascii=False)}


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body has been read: the next ASGI message
    is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


#: the names pydantic adds to an error's location for each member of a union (str, list[TextPart],
#: ToolCall, literal['auto']...): not fields, so not part of the parameter's name
_UNION_MEMBER = re.compile(r"^(str|int|float|bool|none|(dict|list|literal|function-\w+)\[.*\]|[A-Z]\w*)$")


def _param(loc) -> str:
    return ".".join(str(p) for p in loc if p != "body" and not _UNION_MEMBER.match(str(p)))


def _validation_error(exc: RequestValidationError) -> ApiError:
    errors = exc.errors()
    first = errors[0] if errors else {"type": "", "loc": (), "msg": "invalid request"}
    param = _param(first.get("loc", ())) or None
    kind = first.get("type", "")
    # a value no member of a union takes: every member's complaint, once each
    complaints = list(dict.fromkeys(e.get("msg", "") for e in errors if _param(e.get("loc", ())) == (param or "")))
    if len(complaints) > 1:
        return ApiError(400, f"{param or 'body'}: {' or '.join(complaints)}", param=param, code="invalid_value")
    if kind == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", first.get("msg", ""))
        return ApiError(400, f"malformed JSON body: {detail}", code="invalid_json")
    if kind == "extra_forbidden":
        return ApiError(400, f"unrecognized request argument supplied: {param}", param=param,
                        code="unknown_parameter")
    if kind == "missing":
        return ApiError(400, f"{param or 'body'}: required", param=param, code="missing_parameter")
    return ApiError(400, f"{param or 'body'}: {first.get('msg', 'invalid value')}", param=param, code="invalid_value")


def create_app(pool: SlotPool, settings: ServerSettings) -> FastAPI:
    server = Server(pool, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        server.preparing.close()
        if settings.close_pool_on_shutdown:
            await asyncio.to_thread(pool.close)

    app = FastAPI(title="laguna-run serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = server

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        endpoint = "chat" if request.url.path.endswith("/chat/completions") else "completions"
        pool.metrics.inc("laguna_requests_total", endpoint=endpoint, outcome="bad_request")
        return _validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", type=kind, code=code,
                        headers=getattr(exc, "headers", None)).response()

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        return ApiError(500, f"internal error: {exc.__class__.__name__}", type="server_error",
                        code="internal_error").response()

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await server.run(request, body, "completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await server.run(request, body, "chat")

    @app.post("/apply-template")
    async def apply_template(body: ApplyTemplateRequest):
        turn = await server.preparing.run(server.chat_turn, body, body.add_generation_prompt)
        return {"prompt": turn.prompt}

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        target = server.target
        tokens = await server.preparing.run(target.tokenize, body.content, body.add_special, body.parse_special)
        if not body.with_pieces:
            return {"tokens": tokens}
        pieces = []
        for t in tokens:
            raw = target.token_bytes(t, special=True)
            try:
                piece = raw.decode("utf-8")
            except UnicodeDecodeError:  # part of a character: llama-server gives the bytes
                piece = list(raw)
            pieces.append({"id": t, "piece": piece})
        return {"tokens": pieces}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        target = server.target
        bad = next((i for i, t in enumerate(body.tokens) if not 0 <= t < target.n_vocab), None)
        if bad is not None:
            raise ApiError(400, f"tokens[{bad}]: expected a token id in 0..{target.n_vocab - 1}, found "
                                f"{body.tokens[bad]}", param="tokens", code="invalid_value")
        raw = b"".join(target.token_bytes(t, special=True) for t in body.tokens)
        return {"content": raw.decode("utf-8", errors="replace")}

    @app.get("/v1/models")
    async def models():
        engine = pool.engine
        meta = {"target": engine.target.path.name, "n_ctx": server.n_ctx, "parallel": len(pool.slots),
                "drafter": engine.drafter.spec.path.name if engine.drafter is not None else None,
                "max_draft": server.max_draft, "n_max": settings.n_max}
        return {"object": "list", "data": [{"id": settings.model_id, "object": "model", "created": server.created,
                                            "owned_by": "laguna-dflash", "meta": meta}]}

    @app.get("/health")
    async def health():
        status = {**pool.status(), **server.preparing.status()}
        if pool.backend_lost is not None:
            return JSONResponse({"status": "error", "error": pool.backend_lost, **status}, status_code=503)
        if server.draining:
            return JSONResponse({"status": "shutting_down", **status}, status_code=503)
        if status["prepare_stuck"] >= status["prepare_workers"]:
            return JSONResponse({"status": "error", "error": "every request preparer is stuck", **status},
                                status_code=503)
        return {"status": "degraded" if status["prepare_stuck"] else "ok", **status}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(pool.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    # the last added runs first: the key is checked before a body is read
    app.add_middleware(BodyLimitMiddleware, max_bytes=server.max_body_bytes,
                       error_response=lambda status, message, code: ApiError(status, message, code=code).response())
    if settings.api_key:
        app.add_middleware(ApiKeyMiddleware, key=settings.api_key)
    return app
