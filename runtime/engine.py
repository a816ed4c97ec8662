"""The speculative engine: a target context, a drafter context, one sequence at a time.

    engine = Engine.load("target.gguf", "drafter.gguf")
    result = engine.generate("def fib(n):", GenerateOptions(n_predict=64, n_max=4))
    for piece in engine.stream("def fib(n):", GenerateOptions(n_max=4)): print(piece, end="")

The round loop itself is runtime/rounds.py's (the same for runtime/batch.py's sequences);
the engine decodes what it asks for in its own context.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from .drafter import Drafter
from .llama import ClosedError, Context, ContextParams, Model, gpu_offload_supported, microbatch_for_window
from .open_pair import PairFiles, build_on_own_models, resolve_pair
from .prompt_cache import DEFAULT_CHECKPOINTS, PromptCache
from .proposer import Proposer
from .request import GenerateOptions, PairLimits, check_context
from .rounds import DepthPolicies, Rows, generation
from .stats import Stats
from .tuner import DepthPolicy

__all__ = ["Engine", "EngineBusy", "EngineConfig", "GenerateOptions", "GenerationResult", "Stats"]


@dataclass
class EngineConfig:
    n_ctx: int = 4096
    n_batch: int = 512
    n_ubatch: int | None = None  # None: the largest that keeps the sliding-window cache smallest
    n_threads: int = 0
    n_gpu_layers: int = 0
    n_gpu_layers_draft: int = 0
    kv_type: str = "f16"
    verbose: bool = False
    # keep the caches of the last sequence and prefill a new prompt only after the longest
    # token prefix it shares with it (a chat's next turn re-reads only the new messages)
    prompt_cache: bool = True
    # copies of the sliding-window cells kept per prompt cache, one taken after each prompt, from
    # which a prompt departing from the cached sequence before the ring's cells restarts (0: none)
    ctx_checkpoints: int = DEFAULT_CHECKPOINTS
    # llama.cpp's RPC backend (runtime/rpc.py): the target's layers on these rpc-servers
    # ("HOST:PORT"), split by tensor_split; n_gpu_layers > 0 then offloads only the last that many
    rpc: tuple[str, ...] = ()
    tensor_split: tuple[float, ...] = ()
    draft_rpc: bool = False  # the drafter's layers on the servers too (default: this machine)
    rpc_local_gpu: bool = False  # this machine's GPUs take layers after the servers
    rpc_timeout_s: float = 60.0  # a server silent this long is lost (0: wait forever)


@dataclass
class GenerationResult:
    tokens: list[int]
    text: str
    stats: Stats
    stop_reason: str


def target_flash_attn(cfg: EngineConfig) -> bool:
    """Flash attention for a target that computes on this machine's CPU: it skips the masked
    cells and fuses the softmax (a plain step and a batched pass of the tiny target cost less),
    and patch 0025 makes the CPU kernel score a row alone as in a verify pass. A target with
    layers on a GPU or on RPC servers keeps the attention whose exactness was checked there."""
    return cfg.n_gpu_layers == 0 and not cfg.rpc


def one_sequence_params(cfg: EngineConfig, window: int, deepest: int, drafting: bool) -> ContextParams:
    """The target context of one sequence: the microbatch that keeps its sliding-window cache
    smallest (a ring: patch 0006 lays position p out in cell p % size, whatever the rollbacks)."""
    n_ubatch = cfg.n_ubatch or microbatch_for_window(window, cfg.n_batch, floor=max(64, deepest + 1))
    # A verify pass must be one ubatch, or the sliding-window cache may evict cells that a
    # rollback makes visible again; keep the whole window when it could be split.
    swa_full = drafting and n_ubatch < deepest + 1
    return ContextParams(n_ctx=cfg.n_ctx, n_batch=cfg.n_batch, n_ubatch=n_ubatch, kv_type=cfg.kv_type,
                         n_threads=cfg.n_threads, swa_full=swa_full, flash_attn=target_flash_attn(cfg))


def refuse_closed(closed: bool, target: Model) -> None:
    """ClosedError once an engine, or the target model it runs on, was closed."""
    if closed:
        raise ClosedError("engine already closed")
    if target.closed:
        raise ClosedError(f"{target.path}: the engine's target model was closed")


class EngineBusy(RuntimeError):
    """generate/stream called while this thread's own stream of the same engine is still open."""


class _OneAtATime:
    """The engine's lock: other threads wait for the running call; the thread that holds it may
    call the helpers (tokenize, detokenize, close: from a trace callback, or with a stream still
    open) but cannot start a second sequence, which would reset the cache under the first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None

    @contextlib.contextmanager
    def hold(self, *, reentrant: bool) -> Iterator[None]:
        me = threading.get_ident()
        if self._owner == me:
            if not reentrant:
                raise EngineBusy("this engine is already generating in this thread (an open stream?): "
                                 "finish or close it first")
            yield
            return
        with self._lock:
            self._owner = me
            try:
                yield
            finally:
                self._owner = None


class Engine:
    """A loaded target (and optional drafter) ready to generate.

    One engine runs one sequence at a time: its contexts hold one KV cache each. Calls from
    several threads are safe and serialize: ``generate``, ``stream`` (for as long as the
    stream is open), ``tokenize``, ``detokenize``, ``reset`` and ``close`` wait for the call
    running in another thread. Within one thread, starting a second ``generate``/``stream``
    while a stream is still open raises :class:`EngineBusy`. For parallel sequences use one
    engine per thread.

    After ``close()`` every call raises :class:`~runtime.llama.ClosedError`; so does any use of
    the engine once its target ``Model`` was closed. Token ids given to it (a prompt of ids,
    ``detokenize``) are checked against the vocabulary first (ValueError naming the id).
    """

    def __init__(self, target: Model, drafter_path=None, config: EngineConfig | None = None,
                 max_depth: int | None = None, drafter_model: Model | None = None,
                 pair: PairFiles | None = None) -> None:
        """``drafter_model``: the drafter at ``drafter_path`` already loaded, shared by several
        engines over one target ``Model`` (each engine has its own contexts); left open by close().
        ``pair``: the pair already resolved (runtime/open_pair.py), instead of ``drafter_path``."""
        self.config = cfg = config or EngineConfig()
        self._owned: list[Model] = []  # closed with the engine: Engine.open's models, an RPC run's drafter
        self._serial = _OneAtATime()
        self._closed = False
        self.target = target
        if pair is None:
            pair = resolve_pair(target.path, drafter_path)
        self.pair = pair
        self.target_spec = pair.target
        draft_spec = pair.drafter
        deepest = max_depth if max_depth is not None else pair.max_draft
        self.ctx = Context(target, one_sequence_params(cfg, self.target_spec.sliding_window, deepest,
                                                       drafting=draft_spec is not None))
        n_threads = self.ctx.n_threads  # the drafter's too: counted once, when the target's context opens
        # a GPU backend replays the graph of the last batch shape (CUDA graphs): a change of
        # shape costs the next steps several times their time, which the tuner and capture heed
        self.graph_replay = target.n_gpu_layers > 0 and gpu_offload_supported()
        self._policies = DepthPolicies(self.graph_replay)
        self.prompt_cache = PromptCache(cfg.prompt_cache, cfg.ctx_checkpoints)
        self.last_stats: Stats | None = None
        self.last_stop_reason: str | None = None
        self.drafter: Proposer | None = None
        if draft_spec is not None:
            if drafter_model is None and cfg.rpc:
                drafter_model = Model(draft_spec.path, n_gpu_layers=cfg.n_gpu_layers_draft)
                self._owned.append(drafter_model)
            self.drafter = Drafter(draft_spec.path, self.ctx, n_gpu_layers=cfg.n_gpu_layers_draft,
                                   kv_type=cfg.kv_type, n_threads=n_threads, spec=draft_spec,
                                   check_target=False, model=drafter_model)
            self.drafter.keep_capture = self.graph_replay
            self.drafter.enable_capture()

    @classmethod
    def load(cls, target_path, drafter_path=None, config: EngineConfig | None = None) -> "Engine":
        """Resolve the pair (every header value llama.cpp reads is range-checked, the pair
        checked, before any model exists) and open it."""
        return cls.open(resolve_pair(target_path, drafter_path), config)

    @classmethod
    def open(cls, pair: PairFiles, config: EngineConfig | None = None) -> "Engine":
        """An engine over a resolved pair, with models of its own (closed with the engine)."""
        cfg = config or EngineConfig()
        # RPC servers: probed before any model loads
        engine, owned = build_on_own_models(pair, cfg, lambda t, d: cls(t, config=cfg, drafter_model=d, pair=pair))
        engine._owned += owned
        return engine

    @property
    def limits(self) -> PairLimits:
        """What a request may ask of this engine (GenerateOptions.check_limits)."""
        return self.pair.limits(self.ctx.n_ctx, self.ctx.n_batch)

    # ------------------------------------------------------------------ helpers

    def _check_open(self) -> None:
        refuse_closed(self._closed, self.target)

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        with self._serial.hold(reentrant=True):
            self._check_open()
            return self.target.tokenize(text, add_special=add_bos, parse_special=True)

    def detokenize(self, tokens: list[int]) -> str:
        """Text of token ids; ValueError naming the first id outside the vocabulary."""
        with self._serial.hold(reentrant=True):
            self._check_open()
            return self.target.detokenize(tokens).decode("utf-8", errors="replace")

    def reset(self) -> None:
        with self._serial.hold(reentrant=True):
            self._check_open()
            self.prompt_cache.forget()
            self.ctx.clear()
            if self.drafter is not None:
                self.drafter.reset()

    def cached_prefix(self, tokens) -> int:
        """How many leading ``tokens`` the prompt cache holds from the last sequence (0 when
        it is off); a server picks the slot to run a prompt on by it. It never waits for a
        running generation."""
        return self.prompt_cache.shared_prefix(tokens)

    # ------------------------------------------------------------------ generation

    def generate(self, prompt: str | list[int], options: GenerateOptions | None = None) -> GenerationResult:
        """The whole generation; its text is what ``stream`` yields, joined."""
        with self._serial.hold(reentrant=False):
            self._check_open()
            tokens: list[int] = []
            pieces: list[str] = []
            run = self._run(prompt, options or GenerateOptions(), tokens)
            while True:
                try:
                    pieces.append(next(run))
                except StopIteration as e:
                    stats, stop_reason = e.value
                    break
            return GenerationResult(tokens=tokens, text="".join(pieces), stats=stats, stop_reason=stop_reason)

    def stream(self, prompt: str | list[int], options: GenerateOptions | None = None) -> Iterator[str]:
        """Text pieces as tokens are accepted (a whole accepted run at a time), cut at the first
        stop string. The engine is held from the first piece until the stream ends or is closed."""
        with self._serial.hold(reentrant=False):
            self._check_open()
            yield from self._run(prompt, options or GenerateOptions(), [])

    def _run(self, prompt, opts: GenerateOptions, out: list[int]):
        """Generator: yields the final text of each round's emitted tokens (none of a stop
        string) and appends the tokens to ``out``; returns (stats, stop_reason)."""
        prompt_tokens = self.tokenize(prompt, opts.add_bos) if isinstance(prompt, str) \
            else self.target.check_tokens(prompt)
        opts.check_limits(self.limits)
        check_context(len(prompt_tokens), opts.n_predict, self.ctx.n_ctx)
        texts: list[str] = []
        run = generation(self, prompt_tokens, opts, out, texts)
        try:
            rows = next(run)
            while True:
                yield from texts
                texts.clear()
                rows = run.send(self._decode(rows))
        except StopIteration as e:
            stats, stop_reason = e.value
        self.last_stats, self.last_stop_reason = stats, stop_reason
        yield from texts
        return stats, stop_reason

    def _decode(self, rows: Rows) -> int:
        """Decode a sequence's rows (a prompt n_batch rows at a time); how many were decoded."""
        tokens = rows.tokens[:self.ctx.n_batch] if rows.prompt else rows.tokens
        n = len(tokens)
        if rows.prompt:
            self.ctx.decode_block(tokens, rows.pos0, first_output=n - 1)
        elif n == 1:
            self.ctx.step(tokens[0], rows.pos0)
        else:
            self.ctx.decode_block(tokens, rows.pos0)
        return n

    # -- what a generation (runtime/rounds.py) runs on

    @property
    def target_window(self) -> int:
        return self.target_spec.sliding_window

    def policy(self, n_max) -> DepthPolicy:
        return self._policies.get(n_max, self.drafter)

    def forget(self) -> None:
        self.reset()

    def close(self) -> None:
        """Free both contexts (and the models Engine.open loaded); waits for a
        generation running in another thread. Closing twice is harmless."""
        with self._serial.hold(reentrant=True):
            self._closed = True
            if self.drafter is not None:
                self.drafter.close()
                self.drafter = None
            if getattr(self, "ctx", None) is not None:
                self.ctx.close()
            for m in getattr(self, "_owned", ()):
                m.close()
            self._owned = []

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
