"""laguna-run serve's HTTP app over a :class:`~runtime.server.pool.SlotPool`: OpenAI's API here,
the other APIs as adapters over the same request path (:mod:`~runtime.server.core`).

    POST /v1/completions        POST /v1/chat/completions   (SSE when "stream": true)
    POST /v1/messages           POST /v1/messages/count_tokens   (Anthropic's: anthropic.py)
    POST /v1/responses          (OpenAI's Responses API: responses.py)
    GET  /v1/models             GET  /health                GET  /metrics (Prometheus text)
    POST /apply-template        POST /tokenize              POST /detokenize   (llama-server's)

Chat requests are read with Laguna's chat contract (:mod:`runtime.chat`): ``tools`` in,
``tool_calls`` out (``finish_reason: "tool_calls"``), the chain of thought apart as
``reasoning_content`` (``delta.reasoning_content`` when streaming), generation ending at the
model's end-of-turn tokens.

OpenAI's errors are ``{"error": {"message", "type", "param", "code"}}`` (each API writes its
own shape): a malformed body, an unknown field or a value out of range 400; a prompt that
leaves no room in the context 400 (``context_length_exceeded``; a ``max_tokens`` beyond the
context generates until it is full and finishes with ``length``, as llama-server does); a wrong
or missing API key 401; a full queue 503. Responses carry ``usage`` and a llama-server style
``timings`` object with the speculative statistics (drafted, accepted, accepted per round,
acceptance by position). Bodies, prompts, templates and the shutdown are bounded by
:mod:`~runtime.server.guards` (docs/server.md, "Limits").
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import re
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..conversation import finish_reason, response_message
from . import anthropic, responses
from ..params import SAMPLING
from .core import OPENAI_CHAT_PARAMS, ApiError, Call, Reply, Server, ServerSettings, error_body, shutting_down, sse
from .guards import BodyLimitMiddleware
from .pool import SlotPool
from .schemas import (ApplyTemplateRequest, ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                      GenerationFields, NamedToolChoice, TokenizeRequest)

__all__ = ["ApiError", "Server", "ServerSettings", "create_app", "error_body", "shutting_down"]

#: OpenAI's default max_tokens of /v1/completions
COMPLETION_MAX_TOKENS = 16
COMPLETION_PARAMS = {**OPENAI_CHAT_PARAMS, "prompt": "prompt"}
PUBLIC_PATHS = frozenset({"/health"})
#: path -> the endpoint label of its requests in /metrics
ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/messages": "messages",
             "/v1/responses": "responses"}


class ApiKeyMiddleware:
    """The API key on every path but /health, as ``Authorization: Bearer KEY`` (OpenAI's
    clients) or ``x-api-key: KEY`` (Anthropic's), compared in constant time. The key is never
    logged or echoed."""

    def __init__(self, app, key: str, error_response) -> None:
        self.app = app
        self._key = key.encode("utf-8")
        self._error_response = error_response

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in PUBLIC_PATHS:
            auth = api_key = None
            for name, value in scope.get("headers", ()):
                if name == b"authorization" and auth is None:
                    auth = value
                elif name == b"x-api-key" and api_key is None:
                    api_key = value
            if api_key is not None:
                ok = hmac.compare_digest(api_key.strip(), self._key)
            else:
                scheme, _, token = (auth or b"").partition(b" ")
                # compare even when the scheme is wrong, so the time does not tell which part failed
                ok = hmac.compare_digest(token.strip(), self._key) and scheme.lower() == b"bearer"
            if not ok:
                err = ApiError(401, "invalid or missing API key (send Authorization: Bearer KEY or x-api-key: KEY)",
                               type="authentication_error", code="invalid_api_key",
                               headers={"WWW-Authenticate": "Bearer"})
                await self._error_response(scope["path"], err)(scope, receive, send)
                return
        await self.app(scope, receive, send)


# ---------------------------------------------------------------------- OpenAI's chat and text completions


def _check_openai(body: GenerationFields) -> None:
    if body.n not in (None, 1):
        raise ApiError(400, f"n: expected 1 (one choice per request), found {body.n}", param="n",
                       code="invalid_value")
    for name in ("frequency_penalty", "presence_penalty"):
        value = getattr(body, name)
        if value not in (None, 0, 0.0):
            raise ApiError(400, f"{name}: expected 0 (OpenAI's additive penalties have no exact counterpart "
                                f"here; use repeat_penalty), found {value}", param=name, code="invalid_value")


def openai_call(server: Server, body) -> Call:
    """A chat or text completion body as the core's Call."""
    server.check_text(body)
    _check_openai(body)
    common = dict(sampling={k: getattr(body, k) for k in SAMPLING.fields()},
                  stop=body.stop, n_max=body.n_max, response_format=body.response_format, grammar=body.grammar,
                  json_schema=body.json_schema, stream=body.stream)
    if not isinstance(body, ChatCompletionRequest):
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise ApiError(400, f"prompt: expected one prompt per request, found {len(prompt)}", param="prompt",
                               code="invalid_value")
            prompt = prompt[0]
        return Call(prompt=prompt, max_tokens=body.max_tokens if body.max_tokens is not None else COMPLETION_MAX_TOKENS,
                    params=COMPLETION_PARAMS, **common)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    params = OPENAI_CHAT_PARAMS if body.max_completion_tokens is None else \
        {**OPENAI_CHAT_PARAMS, "n_predict": "max_completion_tokens"}
    return Call(messages=[m.template_fields() for m in body.messages],
                tools=[t.template_fields() for t in body.tools or ()],
                tool_choice=body.tool_choice.model_dump() if isinstance(body.tool_choice, NamedToolChoice)
                else body.tool_choice, parallel_tool_calls=body.parallel_tool_calls,
                template_kwargs=body.chat_template_kwargs, max_tokens=max_tokens, params=params, **common)


def usage(stats) -> dict:
    return {"prompt_tokens": stats.n_prompt, "completion_tokens": stats.n_generated,
            "total_tokens": stats.n_prompt + stats.n_generated,
            "prompt_tokens_details": {"cached_tokens": stats.n_cached}}


def timings(reply: Reply) -> dict:
    """llama-server's timings object, with the speculative statistics."""
    stats, job = reply.stats, reply.job
    n_new = stats.n_prompt - stats.n_cached
    return {
        "cache_n": stats.n_cached, "cache_checkpoint": stats.checkpoint, "prompt_n": n_new, "prompt_ms": stats.t_prefill * 1e3,
        "prompt_per_second": n_new / stats.t_prefill if stats.t_prefill > 0 else 0.0,
        "predicted_n": stats.n_generated, "predicted_ms": stats.t_total * 1e3,
        "predicted_per_second": stats.tokens_per_s,
        "draft_n": stats.drafted, "draft_n_accepted": stats.accepted,
        "rounds": stats.rounds, "accepted_per_round": stats.mean_accepted,
        "acceptance_by_position": stats.acceptance_by_position,
        "depth_rounds": {str(k): v for k, v in sorted(stats.depth_rounds.items())},
        "n_max": reply.depth, "queue_ms": job.queue_s * 1e3, "slot": job.slot,
    }


def _finish(reply: Reply) -> str:
    return finish_reason(reply.stop_reason, reply.tool_calls)


class OpenAIRenderer:
    """One request's responses in OpenAI's shapes (``endpoint``: "chat" or "completions")."""

    def __init__(self, model_id: str, endpoint: str, include_usage: bool = False) -> None:
        self.model_id, self.endpoint, self.include_usage = model_id, endpoint, include_usage
        self.rid = ("chatcmpl-" if endpoint == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.object = "chat.completion.chunk" if endpoint == "chat" else "text_completion"

    def full(self, reply: Reply) -> dict:
        choice = {"index": 0, "finish_reason": _finish(reply), "logprobs": None}
        if self.endpoint == "chat":
            choice["message"] = response_message(reply.message)
            obj = "chat.completion"
        else:
            choice["text"] = reply.text
            obj = "text_completion"
        return {"id": self.rid, "object": obj, "created": int(time.time()), "model": self.model_id,
                "system_fingerprint": None, "choices": [choice], "usage": usage(reply.stats),
                "timings": timings(reply)}

    def _chunk(self, text: str | None = None, finish: str | None = None, delta: dict | None = None) -> dict:
        if self.endpoint == "chat":
            choice = {"index": 0, "delta": delta if delta is not None else {}, "finish_reason": finish,
                      "logprobs": None}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        return {"id": self.rid, "object": self.object, "created": self.created, "model": self.model_id,
                "system_fingerprint": None, "choices": [choice]}

    async def stream(self, events):
        if self.endpoint == "chat":
            yield sse(self._chunk(delta={"role": "assistant", "content": ""}))
        async for event in events:
            kind = event[0]
            if kind == "start":
                continue
            if kind == "text":
                yield sse(self._chunk(event[1]))
            elif kind == "delta":
                yield sse(self._chunk(delta=event[1]))
            elif kind == "done":
                reply = event[1]
                last = self._chunk(finish=_finish(reply))
                last["usage"] = usage(reply.stats)
                last["timings"] = timings(reply)
                yield sse(last)
                if self.include_usage:  # OpenAI's own usage chunk: no choices
                    yield sse({"id": self.rid, "object": self.object, "created": self.created,
                               "model": self.model_id, "choices": [], "usage": usage(reply.stats)})
            else:
                err = event[1]
                if kind == "cut":  # a finish reason (the text is incomplete), then why
                    last = self._chunk(finish="length")
                    if event[2] is not None:
                        last["usage"] = usage(event[2].stats)
                    yield sse(last)
                yield sse(error_body(err.message, err.type, err.param, err.code))
        yield {"data": "[DONE]"}


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


def error_response(path: str, err: ApiError):
    """``err`` in the shape of the API ``path`` belongs to."""
    return anthropic.error_response(err) if anthropic.is_path(path) else err.response()


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
        return error_response(request.url.path, exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        pool.metrics.inc("laguna_requests_total", endpoint=ENDPOINTS.get(request.url.path, "completions"),
                         outcome="bad_request")
        return error_response(request.url.path, _validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return error_response(request.url.path, ApiError(
            exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", type=kind, code=code,
            headers=getattr(exc, "headers", None)))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        return error_response(request.url.path, ApiError(500, f"internal error: {exc.__class__.__name__}",
                                                         type="server_error", code="internal_error"))

    async def openai(request: Request, body, endpoint: str):
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        out = OpenAIRenderer(settings.model_id, endpoint, include_usage)
        return await server.run_call(request, lambda: openai_call(server, body), endpoint, out.full, out.stream)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await openai(request, body, "completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await openai(request, body, "chat")

    @app.post(anthropic.PATH)
    async def messages(body: anthropic.MessagesRequest, request: Request):
        out = anthropic.Renderer(settings.model_id)
        return await server.run_call(request, lambda: anthropic.to_call(server, body), "messages", out.full,
                                     out.stream)

    @app.post(anthropic.PATH + "/count_tokens")
    async def count_tokens(body: anthropic.CountTokensRequest):
        n = await server.preparing.run(lambda: server.count_tokens(anthropic.to_call(server, body)))
        return {"input_tokens": n}

    @app.post(responses.PATH)
    async def create_response(body: responses.ResponsesRequest, request: Request):
        out = responses.Renderer(settings.model_id, body)
        return await server.run_call(request, lambda: responses.to_call(server, body), "responses", out.full,
                                     out.stream)

    @app.post("/apply-template")
    async def apply_template(body: ApplyTemplateRequest):
        turn = await server.preparing.run(lambda: server.chat_turn(openai_call(server, body),
                                                                   body.add_generation_prompt))
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
                "lanes": engine.n_lanes,
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
        app.add_middleware(ApiKeyMiddleware, key=settings.api_key, error_response=error_response)
    return app
