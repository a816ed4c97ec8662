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
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from ..convert.gguf_rules import read_header_cached

from .drafter import Drafter
from .llama import ClosedError, Context, ContextParams, LlamaError, Model, microbatch_for_window
from .pair import DRAFT_ARCH, check_pair, read_drafter, read_target
from .sampling import Sampler, SamplingParams
from .tuner import DepthPolicy, FixedDepth


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

    def model_options(self) -> tuple[dict, dict]:
        """Model(...) keyword arguments of the target and the drafter (RPC servers are probed and
        registered here, before any model loads)."""
        if self.rpc:
            from . import rpc

            return rpc.model_options(self)
        return dict(n_gpu_layers=self.n_gpu_layers), dict(n_gpu_layers=self.n_gpu_layers_draft)


@dataclass
class GenerateOptions:
    n_predict: int = 256
    n_max: int | str | DepthPolicy = 4  # draft depth; 0 = plain decoding; "auto" = tuned online
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    add_bos: bool = True
    trace: Callable[[dict], None] | None = None  # called with one dict per round
    # asked once per round; True ends generation there with stop reason "interrupted" (Ctrl-C,
    # a client gone), its stats complete up to that round
    should_stop: Callable[[], bool] | None = None
    # structured output (runtime/constraint.py): a Constraint or a CompiledConstraint; the
    # output then matches it, and generation ends ("eog") when it is complete
    constraint: object | None = None


@dataclass
class Stats:
    n_prompt: int = 0
    n_cached: int = 0  # prompt tokens taken from the prompt cache (not prefilled)
    n_generated: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_at: list[int] = field(default_factory=list)  # per draft position: how often drafted
    accepted_at: list[int] = field(default_factory=list)  # ... and how often accepted
    depth_rounds: dict[int, int] = field(default_factory=dict)
    t_prefill: float = 0.0
    t_draft: float = 0.0
    t_verify: float = 0.0
    t_total: float = 0.0  # generation only (after prefill)
    t_policy: float = 0.0  # the depth policy's own bookkeeping
    policy: dict = field(default_factory=dict)

    @property
    def mean_accepted(self) -> float:
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def tokens_per_s(self) -> float:
        return self.n_generated / self.t_total if self.t_total > 0 else 0.0

    @property
    def t_host(self) -> float:
        return max(0.0, self.t_total - self.t_draft - self.t_verify)

    def record_round(self, depth: int, n_accepted: int) -> None:
        self.rounds += 1
        self.depth_rounds[depth] = self.depth_rounds.get(depth, 0) + 1
        if depth == 0:
            return
        self.drafted += depth
        self.accepted += n_accepted
        while len(self.drafted_at) < depth:
            self.drafted_at.append(0)
            self.accepted_at.append(0)
        for i in range(depth):
            self.drafted_at[i] += 1
            if i < n_accepted:
                self.accepted_at[i] += 1

    def as_dict(self) -> dict:
        return {
            "n_prompt": self.n_prompt, "n_cached": self.n_cached, "n_generated": self.n_generated, "rounds": self.rounds,
            "drafted": self.drafted, "accepted": self.accepted,
            "mean_accepted_per_round": self.mean_accepted,
            "acceptance_by_position": self.acceptance_by_position,
            "depth_rounds": {str(k): v for k, v in sorted(self.depth_rounds.items())},
            "tokens_per_s": self.tokens_per_s,
            "time_s": {"prefill": self.t_prefill, "generate": self.t_total, "draft": self.t_draft,
                       "verify": self.t_verify, "host": self.t_host, "policy": self.t_policy},
            "policy": self.policy,
        }


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
                 draft_options: dict | None = None) -> None:
        """``drafter_model``: the drafter at ``drafter_path`` already loaded, shared by several
        engines over one target ``Model`` (each engine has its own contexts); left open by close().
        ``draft_options``: Model(...) arguments of a drafter loaded here (EngineConfig.model_options)."""
        self.config = cfg = config or EngineConfig()
        self._owned_drafter = None
        draft_options = draft_options or dict(n_gpu_layers=cfg.n_gpu_layers_draft)
        self._serial = _OneAtATime()
        self._closed = False
        self._owns_target = False  # Engine.load's model is closed with the engine
        self.target = target
        self.target_spec = read_target(target.path)
        draft_spec = None
        if drafter_path is not None:
            from ..convert.poolside import native_drafter_path

            from .pair import check_pair, read_drafter

            drafter_path = native_drafter_path(drafter_path, target.path)  # Poolside's layout: its cached rewrite
            draft_spec = read_drafter(drafter_path)
            check_pair(draft_spec, self.target_spec)
        deepest = max_depth if max_depth is not None else (draft_spec.max_draft if draft_spec else 0)
        n_ubatch = cfg.n_ubatch or microbatch_for_window(self.target_spec.sliding_window, cfg.n_batch,
                                                         floor=max(64, deepest + 1))
        # A verify pass must be one ubatch, or the sliding-window cache may evict cells that a
        # rollback makes visible again; keep the whole window when it could be split.
        swa_full = draft_spec is not None and n_ubatch < deepest + 1
        self.ctx = Context(target, ContextParams(
            n_ctx=cfg.n_ctx, n_batch=cfg.n_batch, n_ubatch=n_ubatch, kv_type=cfg.kv_type,
            n_threads=cfg.n_threads, swa_full=swa_full))
        self._auto = None
        self._cached: list[int] = []  # the tokens whose rows the caches hold (the prompt cache)
        self.last_stats: Stats | None = None
        self.last_stop_reason: str | None = None
        self.drafter: Drafter | None = None
        if draft_spec is not None:
            if drafter_model is None and cfg.rpc:
                from .llama import Model as _Model

                drafter_model = self._owned_drafter = _Model(drafter_path, **draft_options)
            self.drafter = Drafter(drafter_path, self.ctx, n_gpu_layers=cfg.n_gpu_layers_draft,
                                   kv_type=cfg.kv_type, n_threads=cfg.n_threads, spec=draft_spec,
                                   check_target=False, model=drafter_model)
            self.drafter.enable_capture()

    @classmethod
    def load(cls, target_path, drafter_path=None, config: EngineConfig | None = None) -> "Engine":
        cfg = config or EngineConfig()
        from .llama import set_verbose

        set_verbose(cfg.verbose)
        # Every header value llama.cpp reads is range-checked before any model exists; a drafter
        # in another layout (Poolside's) is checked once rewritten, in __init__.
        target_spec = read_target(target_path)
        if drafter_path is not None and read_header_cached(drafter_path).arch == DRAFT_ARCH:
            check_pair(read_drafter(drafter_path), target_spec)
        target_options, draft_options = cfg.model_options()  # RPC servers: probed before any model loads
        model = Model(target_path, **target_options)
        try:
            engine = cls(model, drafter_path, cfg, draft_options=draft_options)
        except BaseException:
            model.close()
            raise
        engine._owns_target = True
        return engine

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
            self._cached = []
            self.ctx.clear()
            if self.drafter is not None:
                self.drafter.reset()

    def cached_prefix(self, tokens) -> int:
        """How many leading ``tokens`` the prompt cache holds from the last sequence (0 when
        it is off); a server picks the slot to run a prompt on by it. It reads a snapshot and
        never waits for a running generation (which empties the cache until it ends)."""
        cached = self._cached
        if not self.config.prompt_cache:
            return 0
        n = min(len(cached), len(tokens))
        if n == 0:
            return 0
        diff = np.flatnonzero(np.asarray(cached[:n]) != np.asarray(list(tokens[:n])))
        return int(diff[0]) if len(diff) else n

    def _reuse_prefix(self, prompt_tokens: list[int], drafter: Drafter | None) -> int:
        """Trim the caches to the longest prefix of the prompt that they hold and return the
        position prefill starts from; everything before it is reused as it is."""
        # the last prompt token is always decoded: its logits give the first new token
        n_keep = min(self.cached_prefix(prompt_tokens), len(prompt_tokens) - 1)
        self._cached = []  # until this sequence completes, the caches hold no finished one
        window = self.target_spec.sliding_window
        if n_keep > 0 and window > 0:
            # the target's sliding-window layers keep only the cells of a recent window; the
            # first new query must see the positions after n_keep - window (llama-server's rule)
            lo = self.ctx.pos_min()
            if lo < 0 or lo > max(0, n_keep - window):
                n_keep = 0
        if n_keep > 0 and self.drafter is not None:
            if drafter is not None:  # the first draft needs the rows of its window
                n_keep = self.drafter.trim(n_keep, len(prompt_tokens))
            else:  # a plain run: keep the drafter's rows of the shared prefix valid
                self.drafter.truncate(n_keep)
        if n_keep == 0:
            self.reset()
        else:
            self.ctx.seq_rm(n_keep, -1)
        return n_keep

    def _policy(self, n_max: int | str) -> DepthPolicy:
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
        depth = int(n_max)
        if depth < 0:
            raise ValueError(f"n_max: expected >= 0 or 'auto', found {depth}")
        if depth > 0 and self.drafter is None:
            raise ValueError("n_max > 0 needs a drafter (-md)")
        if self.drafter is not None and depth > self.drafter.spec.max_draft:
            raise ValueError(f"n_max: expected <= {self.drafter.spec.max_draft} (block_size - 1), found {depth}")
        return FixedDepth(depth)

    # ------------------------------------------------------------------ generation

    def generate(self, prompt: str | list[int], options: GenerateOptions | None = None) -> GenerationResult:
        with self._serial.hold(reentrant=False):
            self._check_open()
            return self._generate(prompt, options)

    def _generate(self, prompt: str | list[int], options: GenerateOptions | None) -> GenerationResult:
        tokens: list[int] = []
        gen = self._run(prompt, options or GenerateOptions(), tokens)
        stop_reason = "length"
        try:
            while True:
                next(gen)
        except StopIteration as e:
            stats, stop_reason = e.value
        text = self.detokenize(tokens)
        if stop_reason == "stop":
            text = text[:min((text.find(s) for s in (options or GenerateOptions()).stop if s in text), default=len(text))]
        return GenerationResult(tokens=tokens, text=text, stats=stats, stop_reason=stop_reason)

    def stream(self, prompt: str | list[int], options: GenerateOptions | None = None) -> Iterator[str]:
        """Text pieces as tokens are accepted (a whole accepted run at a time). The engine is
        held from the first piece until the stream ends or is closed."""
        with self._serial.hold(reentrant=False):
            self._check_open()
            tokens: list[int] = []
            pending = b""
            for new in self._run(prompt, options or GenerateOptions(), tokens):
                pending += b"".join(self.target.token_bytes(t) for t in new)
                text, pending = _split_utf8(pending)
                if text:
                    yield text
            if pending:
                yield pending.decode("utf-8", errors="replace")

    def _run(self, prompt, opts: GenerateOptions, out: list[int]):
        """Generator: yields each round's newly emitted tokens; returns (stats, stop_reason)."""
        prompt_tokens = self.tokenize(prompt, opts.add_bos) if isinstance(prompt, str) \
            else self.target.check_tokens(prompt)
        if not prompt_tokens:
            raise ValueError("empty prompt")
        if len(prompt_tokens) + opts.n_predict + 16 > self.ctx.n_ctx:
            raise ValueError(f"prompt ({len(prompt_tokens)} tokens) + n_predict ({opts.n_predict}) "
                             f"exceeds the context size {self.ctx.n_ctx}; raise -c")
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
        rec = _Recorder(stats, policy, opts.trace)
        bonus = self._prefill(prompt_tokens, drafter, sampler, stats)
        history = list(prompt_tokens)
        n_past = len(prompt_tokens)  # the target's KV cache holds positions [0, n_past)
        emitted = [bonus]
        stop_reason = "length"

        rec.generation_begins()
        while True:
            # ---- emit what the last round produced, up to the first stop condition (a round's
            # cost, as the tuner sees it, starts here)
            rec.round_begins()
            n_keep, reason = self._stop_check(out, emitted, opts)
            if reason is None and grammar is not None and grammar.stopped:
                reason = "eog"  # the constrained output is complete: only an end token could follow
            if reason is None and opts.should_stop is not None and opts.should_stop():
                reason = "interrupted"
            kept = emitted[:n_keep]
            out.extend(kept)
            history.extend(kept)
            if kept:
                yield kept
            if reason is not None:
                stop_reason = reason
                break
            rec.mark("host")
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
        if self.config.prompt_cache:
            # the prompt cache: the target holds the prompt and the emitted tokens up to its last
            # decoded position (an accepted draft after a stop is left out: recomputed if needed)
            seq = prompt_tokens + out
            self._cached = seq[:min(len(seq), self.ctx.pos_max() + 1)]
        self.last_stats, self.last_stop_reason = stats, stop_reason
        return stats, stop_reason

    def _prefill(self, prompt_tokens: list[int], drafter: Drafter | None, sampler: Sampler, stats: Stats) -> int:
        """Decode the prompt in n_batch chunks after the prefix the prompt cache holds, injecting
        each chunk's captured rows into the drafter (only the last window of the prompt is
        visible to the first draft); returns the first token."""
        t0 = time.perf_counter()
        if self.drafter is not None:
            self.drafter.drop_pending()  # rows queued by the last sequence's final plain steps
        stats.n_cached = n_cached = self._reuse_prefix(prompt_tokens, drafter)
        n_batch = self.ctx.n_batch
        for i0 in range(n_cached, len(prompt_tokens), n_batch):
            chunk = prompt_tokens[i0:i0 + n_batch]
            self.ctx.decode(chunk, np.arange(i0, i0 + len(chunk)), logits="last")
            if drafter is not None:
                drafter.inject_visible(drafter.captured_features(), i0, len(prompt_tokens))
        bonus = sampler.sample(self.ctx.logits_view(len(chunk) - 1), prompt_tokens)
        stats.t_prefill = time.perf_counter() - t0
        return bonus

    def _stop_check(self, out: list[int], emitted: list[int], opts: GenerateOptions) -> tuple[int, str | None]:
        """How many of this round's tokens to keep, and why generation stops (None: it goes on).
        An end-of-generation token is dropped; a stop string ends generation with the token
        that completes it (the text is cut at the string by generate())."""
        if len(out) >= opts.n_predict:  # n_predict 0: the prefill's token is not emitted either
            return 0, "length"
        tail = b"".join(self.target.token_bytes(t) for t in out[-16:]) if opts.stop else b""
        for j, tok in enumerate(emitted):
            if self.target.is_eog(tok):
                return j, "eog"
            if opts.stop:
                tail += self.target.token_bytes(tok)
                text = tail.decode("utf-8", errors="ignore")
                if any(s in text for s in opts.stop):
                    return j + 1, "stop"
            if len(out) + j + 1 >= opts.n_predict:
                return j + 1, "length"
        return len(emitted), None

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


class _Recorder:
    """The timing and tracing around the round loop. The loop marks where each phase ends;
    the time since the previous mark goes to that phase's total in Stats ("host" to none:
    Stats.t_host is what the others leave). At a round's end the depth policy is told the
    round's wall time (from round_begins, catch-up apart) and the trace gets one record."""

    _FIELDS = {"draft": "t_draft", "catchup": "t_draft", "verify": "t_verify", "policy": "t_policy"}

    def __init__(self, stats: Stats, policy: DepthPolicy, trace: Callable[[dict], None] | None) -> None:
        self.stats, self.policy, self.trace = stats, policy, trace
        self.totals = dict.fromkeys(("draft", "catchup", "verify", "policy", "host"), 0.0)
        self.clock = time.perf_counter

    def generation_begins(self) -> None:
        self.t_start = self.clock()

    def round_begins(self) -> None:
        self.t_round = self.last = self.clock()
        self.t_catchup = self.totals["catchup"]

    def mark(self, phase: str) -> None:
        now = self.clock()
        self.totals[phase] += now - self.last
        self.last = now

    def round_ends(self, depth: int, n_acc: int, bonus: int, drafts: list[int], nxt: int, pos: int,
                   n_past: int) -> None:
        now = self.clock()
        self.totals["host"] += now - self.last
        if depth:
            catchup = self.totals["catchup"] - self.t_catchup
            self.policy.observe(depth, n_acc, now - self.t_round - catchup, catchup)
        else:
            self.policy.observe(0, 0, now - self.t_round)
        self.last = self.clock()
        self.totals["policy"] += self.last - now
        self.stats.record_round(depth, n_acc)
        if self.trace:
            self.trace({"round": self.stats.rounds, "pos": pos, "depth": depth, "bonus": int(bonus),
                        "drafted": [int(d) for d in drafts], "accepted": n_acc, "next": int(nxt),
                        "n_past": n_past, **self.policy.decision()})

    def generation_ends(self, n_generated: int) -> None:
        s = self.stats
        s.t_total = self.clock() - self.t_start
        for phase, field_name in self._FIELDS.items():
            setattr(s, field_name, getattr(s, field_name) + self.totals[phase])
        s.n_generated = n_generated
        s.policy = self.policy.describe()


def _split_utf8(data: bytes) -> tuple[str, bytes]:
    """Decode the longest complete UTF-8 prefix; return it and the incomplete remainder."""
    for cut in range(len(data), max(-1, len(data) - 4), -1):
        try:
            return data[:cut].decode("utf-8"), data[cut:]
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", errors="replace"), b""
