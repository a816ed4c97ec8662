"""The flags ``run``, ``bench`` and ``serve`` share, built from their declarations in
runtime/params.py, and what they open.

:class:`PairFlags` holds the model, context and placement flags (``params.PAIR``); a command
decorated with :func:`pair_flags` gets them as one ``flags`` argument, and one decorated with
:func:`sampling_flags` the sampling flags as one ``sampling`` dict (typer sees the fields as
options, with the same names, help and defaults in every command). Each check names the flag,
and runs before any model loads.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from pathlib import Path

from rich.console import Console

from ...convert.command_line import Failed
from ...convert.errors import UserError

from .. import assets
from ..cores import threads_for_run
from ..params import PAIR, REQUEST, SAMPLING, Group, flag_of
from ..request import GenerateOptions, RequestError
from ..sampling import SamplingParams

err = Console(stderr=True)

NMaxOpt = REQUEST["n_max"].annotated()


def flag_error(e: RequestError) -> UserError:
    """A request field's error, named by its flag."""
    return UserError(e.render(flag_of(e.field)))


def _flags_class(group: Group):
    """A dataclass with one field per flag of ``group``: its typer annotation and its default."""
    def make(cls):
        cls.__annotations__ = {p.field: p.annotated() for p in group}
        for p in group:
            setattr(cls, p.field, p.default)
        return dataclasses.dataclass(cls)
    return make


@_flags_class(PAIR)
class PairFlags:
    """The model, context and placement flags of run, bench and serve."""

    def check(self) -> None:
        """The flags' own ranges (the pair's rules come with open_pair)."""
        PAIR.check_flags(vars(self))

    def open_pair(self):
        """The pair the flags name (the bundled one without -m), resolved: headers checked, a
        Poolside-layout drafter rewritten, the pair checked (runtime/open_pair.py)."""
        from ..open_pair import resolve_pair

        model, draft = self.model, self.model_draft
        if model is None:
            model, draft = assets.default_pair(draft, self.bundled)
        return resolve_pair(model, draft)


def _with_group(command, group: Group, argument: str, make, overrides: dict):
    """``command`` with the flags of ``group`` as options, called with one ``argument=make(**values)``.
    ``overrides``: a flag's annotation for this command (e.g. another help text)."""
    own = inspect.signature(command)
    params = [p for p in own.parameters.values() if p.name != argument]
    params += [inspect.Parameter(p.field, inspect.Parameter.KEYWORD_ONLY, default=p.default,
                                 annotation=overrides.get(p.field) or p.annotated()) for p in group]

    @functools.wraps(command)
    def wrapper(**values):
        given = {n: values.pop(n) for n in group.fields()}
        return command(**{argument: make(**given)}, **values)

    own_hints = typing.get_type_hints(command, include_extras=True)
    wrapper.__signature__ = own.replace(parameters=[p.replace(annotation=own_hints.get(p.name, p.annotation))
                                                    for p in params])
    wrapper.__annotations__ = {p.name: p.annotation for p in wrapper.__signature__.parameters.values()}
    del wrapper.__wrapped__  # typer must read the signature above, not the command's own
    return wrapper


def pair_flags(command=None, **overrides):
    """Give ``command`` the PAIR flags as options and call it with one ``flags=PairFlags``."""
    if command is None:
        return functools.partial(pair_flags, **overrides)
    return _with_group(command, PAIR, "flags", PairFlags, overrides)


def sampling_flags(command):
    """Give ``command`` the SAMPLING flags as options and call it with one ``sampling=dict``."""
    return _with_group(command, SAMPLING, "sampling", dict, {})


def pair_inputs(flags: PairFlags, pair) -> list[Path]:
    """Every file a run reads its models from, for runtime/outputs.py: the paths given, the
    drafter actually used (a Poolside-layout rewrite), the bundled pair's folder without -m."""
    found = [pair.target.path, flags.model, flags.model_draft]
    if pair.drafter is not None:
        found.append(pair.drafter.path)
    if flags.model is None:
        found.append(assets.BUNDLED[flags.bundled][0])
    return [p for p in found if p is not None]


def request_options(depths: list, pair=None, flags: PairFlags | None = None, **fields) -> list[GenerateOptions]:
    """The GenerateOptions of each depth (the CLI's requests, runtime/request.py); with the
    resolved ``pair``, also checked against its limits, still before any model loads."""
    try:
        if "sampling" in fields:
            fields["sampling"] = SamplingParams(**fields["sampling"])
        options = [GenerateOptions(n_max=d, **fields) for d in depths]
        if pair is not None:
            limits = pair.limits(flags.ctx_size, flags.batch_size)
            for o in options:
                o.check_limits(limits)
        return options
    except RequestError as e:
        raise flag_error(e) from None


# ---------------------------------------------------------------------- opening the engine


class RpcFailed(Failed):
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
        if ngl is not None:
            PAIR["n_gpu_layers"].but(lo=1, note="(with --rpc: the last N layers go to the servers)").check_flag(ngl)
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
