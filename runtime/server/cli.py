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
from .. import assets
from ..cli import (BatchOpt, CacheOpt, CtxOpt, DeviceOpt, DraftDeviceOpt, DraftOpt, DraftRpcOpt, ForceOpt, ModelOpt,
                   NgldOpt, NglOpt, RpcOpt, RpcTimeoutOpt, TensorSplitOpt, ThreadsOpt, UbatchOpt, VerboseOpt,
                   check_cache_type, check_range, check_sizes, engine_config, open_pair, request_options)

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
    if n_max is not None:
        request_options([n_max])
    template = read_template(chat_template_file)
    pair = open_pair(model, model_draft)
    depth = n_max if n_max is not None else 4 if pair.drafter is not None else 0
    (default,) = request_options([depth], pair, ctx_size, batch_size)
    depth = default.n_max
    if threads == 0:
        threads = max(1, (os.cpu_count() or 1) // parallel)

    import uvicorn

    from ..llama import LlamaError
    from .app import ServerSettings, create_app
    from .pool import load_pool

    cfg, placement = engine_config(ctx_size, batch_size, ubatch_size, threads, n_gpu_layers, n_gpu_layers_draft,
                                   device, draft_device, force_placement, verbose, kv_type=cache_type,
                                   prompt_cache=not no_prompt_cache, rpc=rpc, tensor_split=tensor_split,
                                   draft_rpc=draft_rpc, rpc_timeout=rpc_timeout)
    sock = bind(host, port)
    try:
        try:
            pool = load_pool(pair.target.path, None, cfg, parallel=parallel, max_queue=max_queue, pair=pair)
        except LlamaError as e:
            raise UserError(str(e)) from None
        settings = ServerSettings(model_id=alias or pair.target.path.name, n_max=depth, api_key=api_key,
                                  chat_template=template,
                                  chat_template_source=str(chat_template_file) if chat_template_file else None)
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
        config = uvicorn.Config(app, log_level="info" if verbose else "warning", access_log=verbose,
                                lifespan="on", timeout_graceful_shutdown=5)
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
