"""laguna-run serve: the OpenAI-compatible server (needs the ``server`` extra).

    laguna-run serve -m target.gguf -md drafter.gguf --port 8080 --n-max 4 --parallel 2
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ...convert.errors import UserError
from ...convert.poolside import native_drafter_path

from .. import assets
from .guards import exposure_problem
from ..cli import (BatchOpt, CacheOpt, CtxOpt, DeviceOpt, DraftDeviceOpt, DraftOpt, DraftRpcOpt, ForceOpt, ModelOpt,
                   NgldOpt, NglOpt, RpcOpt, RpcTimeoutOpt, TensorSplitOpt, ThreadsOpt, UbatchOpt, VerboseOpt,
                   check_cache_type, check_depths, check_range, check_sizes, engine_config, parse_depth)

serve_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode="rich")

#: more slots than this on one machine is a typo (each holds its own contexts)
MAX_PARALLEL = 256


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


def read_template(path: Path | None) -> str | None:
    if path is None:
        return None
    text = assets.read_prompt_text(path)  # UTF-8, one-line errors
    if not text.strip():
        raise UserError(f"{path}: --chat-template-file: expected a Jinja chat template, found an empty file")
    return text


@serve_app.command()
def serve(
    model: ModelOpt = None,
    model_draft: DraftOpt = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on (127.0.0.1: this machine only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port (0: any free one, printed at start).")] = 8080,
    n_max: Annotated[Optional[str], typer.Option("--n-max", "--draft-max", show_default=False, help="Default draft depth of a request (its n_max field overrides it): 0..15 or 'auto'. Default: 4 with a drafter, 0 without.")] = None,
    parallel: Annotated[int, typer.Option("--parallel", "-np", help="Engine slots: sequences generated at once, each with its own contexts over the one loaded pair.")] = 1,
    max_queue: Annotated[int, typer.Option("--max-queue", help="Requests that may wait for a slot (first in, first out); one more gets 503.")] = 16,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="LAGUNA_API_KEY", show_envvar=True, help="Require Authorization: Bearer KEY on every endpoint but /health.")] = None,
    alias: Annotated[Optional[str], typer.Option("--alias", "-a", help="Model id served by /v1/models (default: the target file's name).")] = None,
    chat_template_file: Annotated[Optional[Path], typer.Option("--chat-template-file", help="Jinja chat template to use instead of the GGUF's tokenizer.chat_template.")] = None,
    no_prompt_cache: Annotated[bool, typer.Option("--no-prompt-cache", help="Prefill every prompt from scratch (no reuse of the last sequence's caches).")] = False,
    ctx_size: CtxOpt = 4096,
    batch_size: BatchOpt = 512,
    ubatch_size: UbatchOpt = 0,
    threads: Annotated[int, typer.Option("-t", "--threads", help="CPU threads per slot (0: the cores divided among the slots).")] = 0,
    n_gpu_layers: NglOpt = None,
    n_gpu_layers_draft: NgldOpt = None,
    device: DeviceOpt = "auto",
    draft_device: DraftDeviceOpt = None,
    force_placement: ForceOpt = False,
    cache_type: CacheOpt = "f16",
    verbose: VerboseOpt = False,
    rpc: RpcOpt = None,
    tensor_split: TensorSplitOpt = None,
    draft_rpc: DraftRpcOpt = False,
    rpc_timeout: RpcTimeoutOpt = 60.0,
    max_body_bytes: Annotated[Optional[int], typer.Option("--max-body-bytes", show_default=False, help="Largest request body in bytes; a larger one is answered 413 before it is parsed. Default: 1 MiB + 64 bytes per context token.")] = None,
    shutdown_timeout: Annotated[float, typer.Option("--shutdown-timeout", help="On SIGTERM/SIGINT, seconds running requests may take to finish; then they are cut (a stream ends with a finish reason and an error event). A second signal exits at once.")] = 30.0,
    expose: Annotated[bool, typer.Option("--expose", help="Allow a non-loopback --host without an API key (anyone who can reach the port can use the model).")] = False,
) -> None:
    """Serve the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models), /health and
    /metrics, drafting every request with the DFlash drafter."""
    _need_server_extra()
    check_range("--port", port, 0, 65535)
    check_range("--parallel", parallel, 1, MAX_PARALLEL)
    check_range("--max-queue", max_queue, 0)
    check_sizes(ctx_size, batch_size, ubatch_size, threads)
    check_cache_type(cache_type)
    if api_key is not None and not api_key.strip():
        raise UserError("--api-key: expected a non-empty key, found ''")
    if alias is not None and not alias.strip():
        raise UserError("--alias: expected a non-empty model id, found ''")
    if max_body_bytes is not None:
        check_range("--max-body-bytes", max_body_bytes, 1024)
    if not 0 <= shutdown_timeout <= 24 * 3600:
        raise UserError(f"--shutdown-timeout: expected seconds in 0..86400, found {shutdown_timeout}")
    refusal, warning = exposure_problem(host, api_key, expose)
    if refusal:
        raise UserError(refusal)
    depth = parse_depth(n_max) if n_max is not None else None
    template = read_template(chat_template_file)
    if model is None:
        model, model_draft = assets.default_pair(model_draft)
    model_draft = model_draft and native_drafter_path(model_draft, model)
    if depth is None:
        depth = 4 if model_draft is not None else 0
    check_depths([depth], model_draft, batch_size)
    if threads == 0:
        threads = max(1, (os.cpu_count() or 1) // parallel)

    import uvicorn

    from ..llama import LlamaError
    from .app import ServerSettings, create_app
    from .guards import GracefulServer
    from .pool import load_pool

    cfg, placement = engine_config(ctx_size, batch_size, ubatch_size, threads, n_gpu_layers, n_gpu_layers_draft,
                                   device, draft_device, force_placement, verbose, kv_type=cache_type,
                                   prompt_cache=not no_prompt_cache, rpc=rpc, tensor_split=tensor_split,
                                   draft_rpc=draft_rpc, rpc_timeout=rpc_timeout)
    sock = bind(host, port)
    try:
        try:
            pool = load_pool(model, model_draft, cfg, parallel=parallel, max_queue=max_queue)
        except LlamaError as e:
            raise UserError(str(e)) from None
        settings = ServerSettings(model_id=alias or Path(model).name, n_max=depth, api_key=api_key,
                                  chat_template=template,
                                  chat_template_source=str(chat_template_file) if chat_template_file else None,
                                  max_body_bytes=max_body_bytes, prepare_workers=max(2, parallel))
        try:
            app = create_app(pool, settings)
        except BaseException:
            pool.close()
            raise
        bound = sock.getsockname()
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        # plain lines (never wrapped): scripts read the address from them
        print(f"laguna-run serve: {placement.describe()}; {parallel} slot(s) of {ctx_size} tokens, "
              f"n_max {depth}, prompt cache {'off' if no_prompt_cache else 'on'}", file=sys.stderr)
        print(f"laguna-run serve: model id {settings.model_id!r}, listening on http://{shown}:{bound[1]}"
              f"{' (API key required)' if api_key else ''}", file=sys.stderr, flush=True)
        if warning:
            print(warning, file=sys.stderr, flush=True)
        config = uvicorn.Config(app, log_level="info" if verbose else "warning", access_log=verbose, lifespan="on")
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
