"""Opening a target and its drafter: the one way the CLI, ``Engine.load`` and the server do it.

    pair = resolve_pair("target.gguf", "drafter.gguf")   # headers only: nothing loaded yet
    pair.limits(n_ctx=4096, n_batch=512)                 # what a request may ask of it
    target, drafter = open_models(pair, config)          # the llama.cpp models

:func:`resolve_pair` reads and range-checks both headers, rewrites a drafter in Poolside's own
GGUF layout into ours (cached), and checks the pair, once, before any model exists; a bad file
or a mismatched pair is one :class:`~convert.errors.ContractError`. :func:`open_models` loads
the models with the options of an :class:`~runtime.engine.EngineConfig` (RPC servers probed first).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .drafter_cache import native_drafter_path

from ..convert.gguf.specs import DrafterSpec, TargetSpec, check_pair, read_drafter, read_target
from .request import PairLimits


@dataclass(frozen=True)
class PairFiles:
    """A target and (optionally) a drafter in our layout whose headers passed every check."""

    target: TargetSpec
    drafter: DrafterSpec | None = None

    @property
    def max_draft(self) -> int:
        return self.drafter.max_draft if self.drafter is not None else 0

    def limits(self, n_ctx: int, n_batch: int) -> PairLimits:
        return PairLimits(n_ctx=n_ctx, n_batch=n_batch, max_draft=self.max_draft,
                          has_drafter=self.drafter is not None)


def resolve_pair(target_path: str | Path, drafter_path: str | Path | None = None) -> PairFiles:
    target = read_target(target_path)
    if drafter_path is None:
        return PairFiles(target)
    drafter = read_drafter(native_drafter_path(drafter_path, target.path))  # Poolside's layout: its rewrite
    check_pair(drafter, target)
    return PairFiles(target, drafter)


def model_options(config) -> tuple[dict, dict]:
    """Model(...) keyword arguments of the target and the drafter (RPC servers are probed and
    registered here, before any model loads)."""
    if config.rpc:
        from . import rpc

        return rpc.model_options(config)
    return dict(n_gpu_layers=config.n_gpu_layers), dict(n_gpu_layers=config.n_gpu_layers_draft)


def open_models(pair: PairFiles, config, *, drafter: bool = True):
    """The target ``Model`` and, when the pair has one and ``drafter``, the drafter ``Model``
    (else None: a Drafter then loads its own)."""
    from .llama import Model, set_verbose

    set_verbose(config.verbose)
    target_options, draft_options = model_options(config)
    target = Model(pair.target.path, **target_options)
    if not drafter or pair.drafter is None:
        return target, None
    try:
        return target, Model(pair.drafter.path, **draft_options)
    except BaseException:
        target.close()
        raise


def build_on_own_models(pair: PairFiles, config, build):
    """``build(target, drafter_model)`` over models opened for ``pair`` (:func:`open_models`),
    and those models, which the built engine then owns; they are closed if ``build`` fails."""
    target, drafter_model = open_models(pair, config)
    try:
        built = build(target, drafter_model)
    except BaseException:
        for m in (drafter_model, target):
            if m is not None:
                m.close()
        raise
    return built, [m for m in (drafter_model, target) if m is not None]
