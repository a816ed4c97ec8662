"""laguna-run serve: the OpenAI-compatible server (needs the ``server`` extra).

    laguna-run serve -m target.gguf -md drafter.gguf --port 8080 --n-max 4 --parallel 2
"""

from __future__ import annotations

import socket
import sys
from typing import Annotated, Optional

import typer

from ...convert.command_line import App, flag
from ...convert.errors import UserError

from ..cores import threads_for_run
from ..params import PAIR, SERVER
from .chat import ChatTemplateFileOpt, ChatTemplateKwargsOpt, read_template_file, template_kwargs
from .options import NMaxOpt, PairFlags, engine_config, pair_flags, request_options

ThreadsPerSlotOpt = PAIR["threads"].annotated(help=(
    "CPU threads per slot (0: the cores free when the server starts, divided among the slots)."))

serve_app = App()


def _need_server_extra() -> None:
    import importlib.util

    for module in ("fastapi", "uvicorn", "sse_starlette"):
        if importlib.util.find_spec(module) is None:
            raise UserError(f"laguna-run serve: needs the server extra, which is not installed "
                            f"(no module {module}): pip install 'laguna-dflash[server]'")


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before any model loads so a taken port is a one-line error."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UserError(f"--host: expected an address of this machine, found {host!r} ({e.strerror})") from None
    family, kind, proto, _, addr = infos[0]
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP,
    # and without it every response waits for a delayed ACK (40 ms) on a kept-alive connection
    sock = socket.socket(family, kind, proto or socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise UserError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e})") from None
    return sock


@serve_app.command()
@pair_flags(threads=ThreadsPerSlotOpt)
def serve(
    host: SERVER["host"].annotated() = SERVER["host"].default,
    port: SERVER["port"].annotated() = SERVER["port"].default,
    n_max: NMaxOpt = None,
    parallel: SERVER["parallel"].annotated() = SERVER["parallel"].default,
    lanes: SERVER["lanes"].annotated() = SERVER["lanes"].default,
    max_queue: SERVER["max_queue"].annotated() = SERVER["max_queue"].default,
    n_predict: SERVER["n_predict"].annotated() = SERVER["n_predict"].default,
    api_key: Annotated[Optional[str], flag("--api-key", envvar="LAGUNA_API_KEY", show_envvar=True, help="Require Authorization: Bearer KEY on every endpoint but /health.")] = None,
    alias: Annotated[Optional[str], flag("--alias", "-a", help="Model id served by /v1/models (default: the target file's name).")] = None,
    chat_template_file: ChatTemplateFileOpt = None,
    chat_template_kwargs: ChatTemplateKwargsOpt = None,
    no_prompt_cache: SERVER["no_prompt_cache"].annotated() = False,
    ctx_checkpoints: SERVER["ctx_checkpoints"].annotated() = SERVER["ctx_checkpoints"].default,
    max_body_bytes: SERVER["max_body_bytes"].annotated() = None,
    shutdown_timeout: SERVER["shutdown_timeout"].annotated() = SERVER["shutdown_timeout"].default,
    expose: SERVER["expose"].annotated() = False,
    *,
    flags: PairFlags,
) -> None:
    """Serve the model to OpenAI and Anthropic clients and coding agents, drafting every request
    with the DFlash drafter: /v1/chat/completions, /v1/completions, /v1/responses (OpenAI;
    Codex CLI), /v1/messages and /v1/messages/count_tokens (Anthropic; Claude Code),
    /v1/models, /health and /metrics."""
    _need_server_extra()
    SERVER.check_flags(locals())  # the arguments, by name
    flags.check()
    if api_key is not None and not api_key.strip():
        raise UserError("--api-key: expected a non-empty key, found ''")
    if lanes is not None and lanes > parallel:
        raise UserError(f"--lanes: expected at most --parallel ({parallel}), found {lanes}")
    if alias is not None and not alias.strip():
        raise UserError("--alias: expected a non-empty model id, found ''")
    from ..server.guards import exposure_problem  # imports uvicorn: only once the server extra is known there

    refusal, warning = exposure_problem(host, api_key, expose)
    if refusal:
        raise UserError(refusal)
    if n_max is not None:
        request_options([n_max])
    template = read_template_file(chat_template_file)
    default_kwargs = template_kwargs(chat_template_kwargs)
    pair = flags.open_pair()
    depth = n_max if n_max is not None else 4 if pair.drafter is not None else 0
    (default,) = request_options([depth], pair, flags)
    depth = default.n_max
    flags.threads = threads_for_run(flags.threads)  # one context decodes for every slot

    import uvicorn

    from ..lanes import default_lanes
    from ..llama import LlamaError
    from ..server.app import ServerSettings, create_app
    from ..server.guards import GracefulServer
    from ..server.pool import load_pool

    cfg, placement = engine_config(flags, prompt_cache=not no_prompt_cache)
    cfg.ctx_checkpoints = ctx_checkpoints
    if lanes is None:
        lanes = default_lanes(parallel, placement.target_device)
    sock = bind(host, port)
    try:
        try:
            pool = load_pool(pair.target.path, None, cfg, parallel=parallel, max_queue=max_queue, pair=pair,
                             lanes=lanes)
        except LlamaError as e:
            raise UserError(str(e)) from None
        settings = ServerSettings(model_id=alias or pair.target.path.name, n_max=depth, api_key=api_key,
                                  chat_template=template, chat_template_kwargs=default_kwargs,
                                  chat_template_source=str(chat_template_file) if chat_template_file else None,
                                  max_body_bytes=max_body_bytes, prepare_workers=max(2, parallel), n_predict=n_predict)
        try:
            app = create_app(pool, settings)
        except BaseException:
            pool.close()
            raise
        bound = sock.getsockname()
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        # plain lines (never wrapped): scripts read the address from them
        print(f"laguna-run serve: {placement.describe()}; {parallel} slot(s) of {flags.ctx_size} tokens"
              f"{f' in {lanes} lanes' if lanes > 1 else ''}, "
              f"n_max {depth}, prompt cache {'off' if no_prompt_cache else f'on ({ctx_checkpoints} checkpoints)'}"
              f"{f', at most {n_predict} tokens a request' if n_predict > 0 else ''}",
              file=sys.stderr)
        print(f"laguna-run serve: model id {settings.model_id!r}, listening on http://{shown}:{bound[1]}"
              f"{' (API key required)' if api_key else ''}", file=sys.stderr, flush=True)
        if warning:
            print(warning, file=sys.stderr, flush=True)
        config = uvicorn.Config(app, log_level="info" if flags.verbose else "warning", access_log=flags.verbose,
                                lifespan="on")
        server = app.state.server

        def drain() -> None:
            server.draining = True
            print(f"laguna-run serve: stopping: no new requests; running ones may finish for {shutdown_timeout:g} s "
                  "(a second signal exits at once)", file=sys.stderr, flush=True)

        def cut() -> int:
            n = pool.cut_all()
            if n:
                print(f"laguna-run serve: --shutdown-timeout passed: {n} request(s) cut", file=sys.stderr, flush=True)
            return n

        runner = GracefulServer(config, shutdown_timeout=shutdown_timeout, on_drain=drain, on_cut=cut)
        runner.run(sockets=[sock])
    finally:
        sock.close()
    if runner.signal is not None:  # stopped by a signal: its conventional exit code (130, 143)
        raise typer.Exit(128 + runner.signal)
