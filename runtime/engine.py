"""The speculative engine: a target context, a drafter context, and the round loop of SPEC §4.

    engine = Engine.load("target.gguf", "drafter.gguf")
    result = engine.generate("def fib(n):", GenerateOptions(n_predict=64, n_max=4))
    for piece in engine.stream("def fib(n):", GenerateOptions(n_max=4)): print(piece, end="")

One round: draft ``k`` tokens in one drafter pass over ``[bonus, MASK*k]``; verify
``[bonus, d_1..d_k]`` in one target pass with logits on every row; accept while the target's
own choice (argmax, or a sample from the user's sampler) equals the draft; the first
disagreement, or the row after the last draft, gives the next bonus. Then the rejected rows
leave the target's KV cache and only the accepted rows' captured states enter the drafter's.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .drafter import Drafter
from .llama import ClosedError, Context, ContextParams, Model, microbatch_for_window
from .open_pair import PairFiles, open_models, resolve_pair
from .prompt_cache import PromptCache
from .proposer import Proposer
from .request import GenerateOptions, PairLimits, check_context
from .sampling import Sampler
from .stats import Recorder, Stats
from .stops import TextCutter
from .tuner import DepthPolicy, FixedDepth

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
        self._owned_drafter = None
        self._serial = _OneAtATime()
        self._closed = False
        self._owns_target = False  # Engine.open's model is closed with the engine
        self.target = target
        if pair is None:
            pair = resolve_pair(target.path, drafter_path)
        self.pair = pair
        self.target_spec = pair.target
        draft_spec = pair.drafter
        deepest = max_depth if max_depth is not None else pair.max_draft
        n_ubatch = cfg.n_ubatch or microbatch_for_window(self.target_spec.sliding_window, cfg.n_batch,
                                                         floor=max(64, deepest + 1))
        # A verify pass must be one ubatch, or the sliding-window cache may evict cells that a
        # rollback makes visible again; keep the whole window when it could be split.
        swa_full = draft_spec is not None and n_ubatch < deepest + 1
        self.ctx = Context(target, ContextParams(
            n_ctx=cfg.n_ctx, n_batch=cfg.n_batch, n_ubatch=n_ubatch, kv_type=cfg.kv_type,
            n_threads=cfg.n_threads, swa_full=swa_full))
        n_threads = self.ctx.n_threads  # the drafter's too: counted once, when the target's context opens
        self._auto = None
        self.prompt_cache = PromptCache(cfg.prompt_cache)
        self.last_stats: Stats | None = None
        self.last_stop_reason: str | None = None
        self.drafter: Proposer | None = None
        if draft_spec is not None:
            if drafter_model is None and cfg.rpc:
                drafter_model = self._owned_drafter = Model(draft_spec.path, n_gpu_layers=cfg.n_gpu_layers_draft)
            self.drafter = Drafter(draft_spec.path, self.ctx, n_gpu_layers=cfg.n_gpu_layers_draft,
                                   kv_type=cfg.kv_type, n_threads=n_threads, spec=draft_spec,
                                   check_target=False, model=drafter_model)
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
        target, drafter_model = open_models(pair, cfg)  # RPC servers: probed before any model loads
        try:
            engine = cls(target, config=cfg, drafter_model=drafter_model, pair=pair)
        except BaseException:
            if drafter_model is not None:
                drafter_model.close()
            target.close()
            raise
        engine._owns_target = True
        engine._owned_drafter = drafter_model
        return engine

    @property
    def limits(self) -> PairLimits:
        """What a request may ask of this engine (GenerateOptions.check_limits)."""
        return self.pair.limits(self.ctx.n_ctx, self.ctx.n_batch)

    # ------------------------------------------------------------------ helpers

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("engine already closed")
        if self.target.closed:
            raise ClosedError(f"{self.target.path}: the engine's target model was closed")

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

    def _policy(self, n_max: int | str | DepthPolicy) -> DepthPolicy:
        """The depth policy of a checked request (GenerateOptions.check_limits)."""
        if isinstance(n_max, DepthPolicy):
            return n_max
        if n_max == "auto":
            from .tuner import AutoDepth

            if self.drafter is None:
                return FixedDepth(0)
            # one tuner per engine: what it learnt about costs carries over to the next prompt
            if self._auto is None:
                self._auto = AutoDepth(self.drafter.spec.max_draft, window=self.drafter.spec.sliding_window)
            return self._auto
        return FixedDepth(n_max)

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
        policy = self._policy(opts.n_max)
        sampler = Sampler(opts.sampling)
        grammar = None
        if opts.constraint is not None:
            from .constraint import ConstrainedSampler, compile_constraint

            grammar = compile_constraint(opts.constraint, self.target).matcher()
            sampler = ConstrainedSampler(opts.sampling, grammar)
        # a fixed depth of 0 is plain decoding: no capture, no drafter bookkeeping
        drafter = None if isinstance(policy, FixedDepth) and policy.depth == 0 else self.drafter
        if self.drafter is not None:
            self.drafter.set_capture(drafter is not None)
        stats = Stats(n_prompt=len(prompt_tokens))
        rec = Recorder(stats, policy, opts.trace)
        bonus = self._prefill(prompt_tokens, drafter, sampler, stats)
        history = list(prompt_tokens)
        n_past = len(prompt_tokens)  # the target's KV cache holds positions [0, n_past)
        emitted = [bonus]
        stop_reason = "length"
        cutter = TextCutter(opts.stop)

        rec.generation_begins()
        while True:
            # ---- emit what the last round produced, up to the first stop condition (a round's
            # cost, as the tuner sees it, starts here)
            rec.round_begins()
            n_keep, reason, text = self._stop_check(out, emitted, opts, cutter)
            if reason is None and grammar is not None and grammar.stopped:
                reason = "eog"  # the constrained output is complete: only an end token could follow
            if reason is None and opts.should_stop is not None and opts.should_stop():
                reason = "interrupted"
            kept = emitted[:n_keep]
            out.extend(kept)
            history.extend(kept)
            if text:
                yield text
            if reason is not None:
                stop_reason = reason
                break
            rec.mark("host")
            policy.context(n_past)
            depth = min(policy.choose(), opts.n_predict - len(out) - 1, self.ctx.n_ctx - n_past - 2)
            rec.mark("policy")

            if drafter is None or depth <= 0:
                # ---- plain step (the drafter reads its row at its next draft, or never)
                if drafter is not None:
                    drafter.plain_step_begins(policy.plain_rounds_ahead())
                rec.mark("host")
                self.ctx.step(bonus, n_past)
                rec.mark("verify")
                if drafter is not None:
                    drafter.plain_step_ends()
                nxt = sampler.sample(self.ctx.logits_view(0), history[-sampler.history_len:] if sampler.history_len else ())
                rec.round_ends(0, 0, bonus, [], nxt, n_past, n_past + 1)
                n_past, emitted, bonus = n_past + 1, [nxt], nxt
                continue

            # ---- draft, after reading the rows of the plain steps before (the catch-up)
            rec.mark("host")
            if drafter.catch_up(n_past):
                rec.mark("catchup")
            if grammar is None:
                drafts = drafter.draft(bonus, depth)
                rec.mark("draft")
            else:
                # a token the grammar forbids can never be accepted: each row proposes the
                # drafter's best token among those the grammar allows after the rows before it
                block = drafter.draft_logits(bonus, depth)
                rec.mark("draft")
                drafts = grammar.draft(block)
                rec.mark("host")
            # ---- verify: one target pass over [bonus, drafts]; accept while the target's own
            # choice at each row equals the draft
            self.ctx.decode_block([bonus] + drafts, n_past)
            rec.mark("verify")
            n_acc, nxt = sampler.accept(self.ctx.logits_block(len(drafts) + 1), drafts, history)
            rec.mark("host")
            # ---- roll back: the target keeps bonus + accepted drafts, the drafter reads their rows
            keep = n_past + 1 + n_acc
            self.ctx.seq_rm(keep, -1)
            drafter.inject_captured(1 + n_acc, n_past)
            rec.mark("draft")
            rec.round_ends(depth, n_acc, bonus, drafts, nxt, n_past, keep)
            n_past, emitted, bonus = keep, drafts[:n_acc] + [nxt], nxt

        rec.generation_ends(len(out))
        self.prompt_cache.remember(prompt_tokens + out, self.ctx.pos_max() + 1)
        self.last_stats, self.last_stop_reason = stats, stop_reason
        rest = cutter.finish()  # text held back as a possible stop string's start, which it was not
        if rest:
            yield rest
        return stats, stop_reason

    def _prefill(self, prompt_tokens: list[int], drafter: Proposer | None, sampler: Sampler, stats: Stats) -> int:
        """Decode the prompt in n_batch chunks after the prefix the prompt cache holds, injecting
        each chunk's captured rows into the drafter (only the last window of the prompt is
        visible to the first draft); returns the first token."""
        t0 = time.perf_counter()
        if self.drafter is not None:
            self.drafter.drop_pending()  # rows queued by the last sequence's final plain steps
        n_cached = self.prompt_cache.reuse(prompt_tokens, self.ctx, self.target_spec.sliding_window, self.drafter,
                                           drafting=drafter is not None)
        if n_cached == 0:
            self.reset()
        stats.n_cached = n_cached
        n_batch = self.ctx.n_batch
        for i0 in range(n_cached, len(prompt_tokens), n_batch):
            chunk = prompt_tokens[i0:i0 + n_batch]
            self.ctx.decode(chunk, np.arange(i0, i0 + len(chunk)), logits="last")
            if drafter is not None:
                drafter.inject_visible(drafter.captured_features(), i0, len(prompt_tokens))
        bonus = sampler.sample(self.ctx.logits_view(len(chunk) - 1), prompt_tokens)
        stats.t_prefill = time.perf_counter() - t0
        return bonus

    def _stop_check(self, out: list[int], emitted: list[int], opts: GenerateOptions,
                    cutter: TextCutter) -> tuple[int, str | None, str]:
        """How many of this round's tokens to keep, why generation stops (None: it goes on), and
        the text they add. An end-of-generation token is dropped; a stop string ends generation
        with the token that completes it, and its text is cut where the string begins."""
        if len(out) >= opts.n_predict:  # n_predict 0: the prefill's token is not emitted either
            return 0, "length", ""
        pieces = []
        for j, tok in enumerate(emitted):
            if self.target.is_eog(tok) or tok in opts.end_tokens:
                return j, "eog", "".join(pieces)
            pieces.append(cutter.feed(self.target.token_bytes(tok, special=opts.special_text)))
            if cutter.stopped:
                return j + 1, "stop", "".join(pieces)
            if len(out) + j + 1 >= opts.n_predict:
                return j + 1, "length", "".join(pieces)
        return len(emitted), None, "".join(pieces)

    def close(self) -> None:
        """Free both contexts (and the target model when Engine.load made it); waits for a
        generation running in another thread. Closing twice is harmless."""
        with self._serial.hold(reentrant=True):
            self._closed = True
            if self.drafter is not None:
                self.drafter.close()
                self.drafter = None
            if getattr(self, "_owned_drafter", None) is not None:
                self._owned_drafter.close()
                self._owned_drafter = None
            if getattr(self, "ctx", None) is not None:
                self.ctx.close()
            if self._owns_target:
                self.target.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
