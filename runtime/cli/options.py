"""The flags ``run``, ``bench`` and ``serve`` share, declared once, and what they open.

:class:`PairFlags` holds the model, context and placement flags; a command decorated with
:func:`pair_flags` gets them as one ``flags`` argument (typer sees the fields as options, with
the same names, help and defaults in every command). Each check here names the flag, and runs
before any model loads.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from pathlib import Path
from typing import Annotated, Optional

import typer
import typer.core
from rich.console import Console

from ...convert.errors import UserError

from .. import assets
from ..cores import MAX_THREADS, threads_for_run
from ..request import GenerateOptions, RequestError, sampling_params

err = Console(stderr=True)

#: llama.cpp keeps sizes in 32-bit integers
MAX_SIZE = (1 << 31) - 1
#: the flag of each request field (runtime/request.py), for error messages
FLAGS = {"temperature": "--temp", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p",
         "repeat_penalty": "--repeat-penalty", "repeat_last_n": "--repeat-last-n", "seed": "--seed",
         "n_predict": "-n/--n-predict", "n_max": "--n-max", "n_batch": "-b/--batch-size", "stop": "--stop",
         "prompt": "-p/-f"}


def _flag(*names: str, help: str, **kw) -> typer.models.OptionInfo:
    return typer.Option(*names, help=help, **kw)


class Command(typer.core.TyperCommand):
    """typer's command, whose --help shows no value type either (typer's help shows <bool>)."""

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option


def switch(*names: str, help: str) -> typer.models.OptionInfo:
    """A boolean flag: given or not, no value (the help shows no type for it)."""
    return typer.Option(*names, help=help, metavar="")


ModelOpt = Annotated[Optional[Path], _flag("-m", "--model", help="Target GGUF (a Laguna model). Default: the bundled "
                                           "laguna-tiny pair.", show_default=False)]
DraftOpt = Annotated[Optional[Path], _flag(
    "-md", "--model-draft", help="Drafter GGUF written by [bold]laguna-gguf convert[/bold] (or Poolside's own). "
                                 "Without it: plain decoding.")]
NMaxOpt = Annotated[Optional[str], _flag("--n-max", "--draft-max", show_default=False, help=(
    "Draft depth per round: 0 = no speculation, 1..15, or 'auto' (tuned online). Default: 4 with a drafter, "
    "0 without."))]
ThreadsOpt = Annotated[int, _flag("-t", "--threads", help=(
    "CPU threads (0: the cores no other process keeps busy when the run starts)."))]
# serve's bounds (runtime/server/guards.py)
MaxBodyBytesOpt = Annotated[Optional[int], _flag("--max-body-bytes", show_default=False, help=(
    "Largest request body in bytes; a larger one is answered 413 before it is parsed. Default: 1 MiB + 64 bytes "
    "per context token."))]
ShutdownTimeoutOpt = Annotated[float, _flag("--shutdown-timeout", help=(
    "On SIGTERM/SIGINT, seconds running requests may take to finish; then they are cut (a stream ends with a "
    "finish reason and an error event). A second signal exits at once."))]
ExposeOpt = Annotated[bool, switch("--expose", help=(
    "Allow a non-loopback --host without an API key (anyone who can reach the port can use the model)."))]


@dataclasses.dataclass
class PairFlags:
    """The model, context and placement flags of run, bench and serve."""

    model: ModelOpt = None
    model_draft: DraftOpt = None
    bundled: Annotated[str, _flag("--bundled", help=(
        "The bundled pair that runs without -m: code (laguna-tiny: completes Python) or agent "
        "(laguna-tiny-agent: Laguna 2.1's chat format, calls tools)."))] = "code"
    ctx_size: Annotated[int, _flag("-c", "--ctx-size", help="Context size (tokens) of both contexts.")] = 4096
    batch_size: Annotated[int, _flag("-b", "--batch-size", help="Prompt chunk size (n_batch).")] = 512
    ubatch_size: Annotated[int, _flag("-ub", "--ubatch-size", help=(
        "Microbatch size (n_ubatch); 0: the largest that keeps the target's sliding-window KV cache smallest."))] = 0
    threads: ThreadsOpt = 0
    n_gpu_layers: Annotated[Optional[int], _flag("-ngl", "--n-gpu-layers", help=(
        "Target layers on the GPU (default: all on cuda, 0 on cpu)."))] = None
    n_gpu_layers_draft: Annotated[Optional[int], _flag("-ngld", "--n-gpu-layers-draft",
                                                       help="Drafter layers on the GPU.")] = None
    device: Annotated[str, _flag("--device", help=(
        "auto | cpu | cuda. auto: CUDA when this wheel has it and a GPU is present."))] = "auto"
    draft_device: Annotated[Optional[str], _flag("--draft-device", help="Drafter device (default: the target's).")] = None
    force_placement: Annotated[bool, switch("--force-placement", help=(
        "Allow a CPU drafter next to a GPU target (it loses at every measured depth)."))] = False
    cache_type: Annotated[str, _flag("--cache-type", help=(
        "KV cache type of both contexts: f16, or f32 for bit-exact greedy comparisons with plain decoding."))] = "f16"
    verbose: Annotated[bool, switch("--verbose", "-v", help="Show llama.cpp's log.")] = False
    rpc: Annotated[Optional[str], _flag("--rpc", help=(
        "Comma-separated rpc-servers HOST:PORT (laguna-rpc-server on each): the target's layers go there, "
        "the drafter stays here."))] = None
    tensor_split: Annotated[Optional[str], _flag("--tensor-split", "-ts", help=(
        "Proportions of the offloaded layers per device, in --rpc order (then this machine's GPU), e.g. 3,1. "
        "Default: by free memory."))] = None
    draft_rpc: Annotated[bool, switch("--draft-rpc", help="Put the drafter's layers on the --rpc servers too.")] = False
    rpc_timeout: Annotated[float, _flag("--rpc-timeout", help=(
        "Seconds an RPC server may stay silent before it counts as lost (0: forever)."))] = 60.0

    def check(self) -> None:
        """The flags' own ranges (the pair's rules come with open_pair)."""
        check_range("-c/--ctx-size", self.ctx_size, 1)
        check_range("-b/--batch-size", self.batch_size, 1)
        check_range("-ub/--ubatch-size", self.ubatch_size, 0, note=" (0: fit the sliding window)")
        check_range("-t/--threads", self.threads, 0, MAX_THREADS, " (0: the free cores)")
        if self.bundled not in assets.BUNDLED:
            raise UserError(f"--bundled: expected one of {', '.join(assets.BUNDLED)}, found {self.bundled!r}")
        if self.cache_type not in ("f16", "f32"):
            raise UserError(f"--cache-type: expected f16 or f32, found {self.cache_type!r}")

    def open_pair(self):
        """The pair the flags name (the bundled one without -m), resolved: headers checked, a
        Poolside-layout drafter rewritten, the pair checked (runtime/open_pair.py)."""
        from ..open_pair import resolve_pair

        model, draft = self.model, self.model_draft
        if model is None:
            model, draft = assets.default_pair(draft, self.bundled)
        return resolve_pair(model, draft)


def pair_flags(command=None, **overrides):
    """Give ``command`` the PairFlags fields as options and call it with one ``flags=PairFlags``.
    ``overrides``: a field's annotation for this command (e.g. another help text)."""
    if command is None:
        return functools.partial(pair_flags, **overrides)
    hints = typing.get_type_hints(PairFlags, include_extras=True)
    hints.update(overrides)
    names = [f.name for f in dataclasses.fields(PairFlags)]
    own = inspect.signature(command)
    params = [p for p in own.parameters.values() if p.name != "flags"]
    params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                 annotation=hints[f.name]) for f in dataclasses.fields(PairFlags)]

    @functools.wraps(command)
    def wrapper(**values):
        flags = PairFlags(**{n: values.pop(n) for n in names})
        return command(flags=flags, **values)

    own_hints = typing.get_type_hints(command, include_extras=True)
    wrapper.__signature__ = own.replace(parameters=[p.replace(annotation=own_hints.get(p.name, p.annotation))
                                                    for p in params])
    wrapper.__annotations__ = {p.name: p.annotation for p in wrapper.__signature__.parameters.values()}
    del wrapper.__wrapped__  # typer must read the signature above, not the command's own
    return wrapper


# ---------------------------------------------------------------------- checks, one line each


def check_range(flag: str, value: int, lo: int, hi: int = MAX_SIZE, note: str = "") -> None:
    if not lo <= value <= hi:
        expected = f"an integer >= {lo}" if hi == MAX_SIZE and value < lo else f"{lo}..{hi}"
        raise UserError(f"{flag}: expected {expected}{note}, found {value}")


def pair_inputs(flags: PairFlags, pair) -> list[Path]:
    """Every file a run reads its models from, for runtime/outputs.py: the paths given, the
    drafter actually used (a Poolside-layout rewrite), the bundled pair's folder without -m."""
    found = [pair.target.path, flags.model, flags.model_draft]
    if pair.drafter is not None:
        found.append(pair.drafter.path)
    if flags.model is None:
        found.append(assets.BUNDLED[flags.bundled][0])
    return [p for p in found if p is not None]


def flag_error(e: RequestError) -> UserError:
    """A request field's error, named by its flag."""
    return UserError(e.render(FLAGS.get(e.field, e.field)))


def request_options(depths: list, pair=None, flags: PairFlags | None = None, **fields) -> list[GenerateOptions]:
    """The GenerateOptions of each depth (the CLI's requests, runtime/request.py); with the
    resolved ``pair``, also checked against its limits, still before any model loads."""
    try:
        if "sampling" in fields:
            fields["sampling"] = sampling_params(**fields["sampling"])
        options = [GenerateOptions(n_max=d, **fields) for d in depths]
        if pair is not None:
            limits = pair.limits(flags.ctx_size, flags.batch_size)
            for o in options:
                o.check_limits(limits)
        return options
    except RequestError as e:
        raise flag_error(e) from None


# ---------------------------------------------------------------------- opening the engine


class RpcFailed(Exception):
    """An RPC server was lost during the work: one line, exit code 1 (not the user's mistake)."""


class _RpcPlacement:
    def __init__(self, cfg) -> None:
        self.cfg = cfg

    def describe(self) -> str:
        from ..rpc import describe

        return describe(self.cfg)


def engine_config(flags: PairFlags, prompt_cache: bool = True):
    """EngineConfig and Placement from the flags."""
    from ..placement import resolve

    ngl = flags.n_gpu_layers
    if flags.rpc is None:
        for flag, given in (("--tensor-split", flags.tensor_split is not None), ("--draft-rpc", flags.draft_rpc)):
            if given:
                raise UserError(f"{flag}: needs --rpc HOST:PORT[,HOST:PORT...] (the servers to split over)")
    else:
        from .. import rpc as rpc_mod

        endpoints = rpc_mod.parse_endpoints(flags.rpc)
        split = rpc_mod.parse_tensor_split(flags.tensor_split)
        if not flags.rpc_timeout >= 0:
            raise UserError(f"--rpc-timeout: expected seconds >= 0 (0: forever), found {flags.rpc_timeout}")
        if ngl is not None:
            check_range("-ngl/--n-gpu-layers", ngl, 1, note=" (with --rpc: the last N layers go to the servers)")
    # before anything loads llama.cpp: the probe must not see our own load, and libgomp reads
    # its spin setting when it loads
    threads = threads_for_run(flags.threads)
    placement = resolve(flags.device, flags.draft_device, None if flags.rpc else ngl, flags.n_gpu_layers_draft,
                        flags.force_placement)
    from ..engine import EngineConfig

    cfg = EngineConfig(n_ctx=flags.ctx_size, n_batch=flags.batch_size,
                       n_ubatch=min(flags.ubatch_size, flags.batch_size) or None, n_threads=threads,
                       n_gpu_layers=placement.n_gpu_layers, n_gpu_layers_draft=placement.n_gpu_layers_draft,
                       kv_type=flags.cache_type, verbose=flags.verbose, prompt_cache=prompt_cache)
    if flags.rpc is not None:
        cfg.rpc, cfg.tensor_split, cfg.draft_rpc, cfg.rpc_timeout_s = endpoints, split, flags.draft_rpc, flags.rpc_timeout
        cfg.n_gpu_layers = ngl or 0  # 0: every layer (the head stays here)
        cfg.rpc_local_gpu = placement.target_device == "cuda"
        placement = _RpcPlacement(cfg)
    else:
        placement = dataclasses.replace(placement, n_threads=threads)
    return cfg, placement


def open_engine(pair, cfg):
    """Engine.open with the CLI's errors: a lost RPC server is RpcFailed, a refused load one line."""
    from ..engine import Engine
    from ..llama import LlamaError
    from ..rpc import RpcError

    try:
        return Engine.open(pair, cfg)
    except RpcError as e:  # a server lost while the models loaded: not the user's mistake
        raise RpcFailed(str(e)) from None
    except LlamaError as e:
        raise UserError(str(e)) from None
