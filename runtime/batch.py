"""Several sequences over one target context: one target decode per round for all of them.

    engine = BatchEngine.open(resolve_pair("target.gguf", "drafter.gguf"), EngineConfig(), n_seq=4)
    results = engine.generate_all(["def fib(n):", "class Stack:"], GenerateOptions(n_max=4))

Each slot is a llama.cpp sequence of one target context with its own KV stream (cells laid out
as when it runs alone, ``swa_full`` so that a sliding-window layer's cells stay in position
order whatever the rollbacks; patch 0006's ring applies to one stream only), its own drafter
context and its own prompt cache. One slot is Engine's context (the ring: a smaller cache), so
an engine of one slot and an engine of several may differ in the last bits of a sliding-window
layer's sums once a sequence passes the ring's size, with an F16 cache. A round asks
every decoding sequence for its rows (runtime/rounds.py: a plain step or a verify block of any
depth), decodes them in one ``llama_decode`` (all of them, within the bound below), and hands
each sequence its logits and captured rows; its drafter then reads them. A prompt is decoded in
parts of its own, cut as the one-slot engine cuts it, between the running sequences' rounds (chunked
prefill), so their rounds never wait for a whole prompt.

Greedy output of a sequence does not depend on what runs beside it (tests/test_batch.py): a
prompt part has the pass it has alone, and a decoding pass holds no more rows than the target's
kernels compute each as alone (``max_pass_rows``: :data:`EXACT_PASS_ROWS`; none on a Q4_K_M target
where the CPU backend has AVX2, nor where every weight is of a type computed alike in a pass of
any size, F32, F16 and Q8_0). Under a bound each of
``n`` sequences of a pass drafts at most ``max_pass_rows // n - 1`` tokens, so a fixed ``n_max``
is cut under load (under 16 rows, 4 sequences at ``n_max`` 4 draft 3 each), and rows beyond it
(a prompt's sequence joining others, more sequences than the bound has rows) wait for the next
round.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from ..convert.gguf.rules import read_header_cached
from ..convert.gguf.specs import TargetSpec
from .drafter import Drafter
from .engine import EngineConfig, GenerationResult, one_sequence_params, refuse_closed, target_flash_attn
from .llama import Context, ContextParams, LlamaError, Model, SeqView, cpu_backend_features, gpu_offload_supported
from .open_pair import PairFiles, build_on_own_models
from .prompt_cache import PromptCache
from .request import GenerateOptions, PairLimits, check_context
from .rounds import DepthPolicies, Generation, Rows, generation
from .stats import Stats
from .tuner import DepthPolicy, FixedDepth
from .tuner.batch import BatchPlanner

__all__ = ["BatchEngine", "EXACT_PASS_ROWS", "Finished", "pass_rows_bound"]

#: The most rows a decoding pass may hold on quantized weights. The CPU kernels compute each row of
#: a pass of 2-16 rows over repacked Q4_K weights exactly as that row alone (patch 0011); without
#: AVX2, or on K-quant weights left in the plain layout, a larger pass takes 4-row tiles, which
#: sum in another order, and a sequence beside others then parts from its output alone after a
#: few tokens.
EXACT_PASS_ROWS = 16

#: Weight types whose kernels compute a row the same in a pass of any size (tinyBLAS per output
#: element, patch 0010; Q8_0 plain, or repacked on x86 where every pass takes the rows kernel in
#: groups of 16, patch 0018; the bundled Q8_0 pair at 8 sequences of up to 8 rows, tests/test_batch.py).
_ANY_ROWS_TYPES = frozenset({"F32", "F16", "Q8_0"})
#: K-quant types computed alike in a pass of any size where the CPU backend is built with AVX2 and
#: repacks the matrix (rows in eights; another stays in the plain layout): every pass takes the
#: rows kernel in groups of 16 (patches 0014 and 0042; with AVX-512 and VNNI, Q4_K's is the 512-bit
#: one, 0036-0037). A weight of any other type, or of these elsewhere, gets :data:`EXACT_PASS_ROWS`.
_REPACKED_AVX2_ANY_ROWS_TYPES = frozenset({"Q6_K", "Q4_K"})


@dataclass
class Finished:
    """A sequence that ended this round: its result, or the error that ended it."""

    slot: int
    tokens: list[int]
    stats: Stats | None = None
    stop_reason: str | None = None
    error: BaseException | None = None


def pass_rows_bound(target: TargetSpec, cpu_features: frozenset[str] | None = None) -> int | None:
    """The most rows one decoding pass over ``target`` may hold for each row to be computed as
    it is alone on this CPU backend (``cpu_features``: the installed one's), the least its weights
    allow: None (any) where every weight is of a type computed alike in a pass of any size."""
    features = cpu_backend_features() if cpu_features is None else cpu_features
    repacked = _REPACKED_AVX2_ANY_ROWS_TYPES if "AVX2" in features else frozenset()

    def rows(t) -> int | None:
        kind = t.qtype.name
        if kind in _ANY_ROWS_TYPES:
            return None
        if kind in repacked and len(t.shape) >= 2 and t.shape[-2] % 8 == 0:
            return None
        return EXACT_PASS_ROWS

    bounds = [b for t in read_header_cached(target.path).tensors if (b := rows(t)) is not None]
    return min(bounds, default=None)


class _PassBoundDepth(FixedDepth):
    """A fixed depth, cut to the most drafts its slot may take in the next pass."""

    def __init__(self, depth: int, slot: "_Slot") -> None:
        super().__init__(depth)
        self.slot = slot

    def choose(self) -> int:
        return min(self.depth, self.slot.deepest)


class _Slot:
    """One sequence's place: what runtime/rounds.py runs on, and the generation running there."""

    def __init__(self, index: int, engine: "BatchEngine", ctx: SeqView, drafter: Drafter | None) -> None:
        self.index = index
        self.target = engine.target
        self.ctx = ctx
        self.drafter = drafter
        self.prompt_cache = PromptCache(engine.config.prompt_cache, engine.config.ctx_checkpoints)
        self.target_window = engine.pair.target.sliding_window
        self.planner = engine.planner
        self._policies = DepthPolicies()
        self.run: Generation | None = None
        self.rows: Rows | None = None  # what the running generation asks of the next decode
        self.out: list[int] = []
        self.texts: list[str] = []
        self.opts: GenerateOptions | None = None
        self.started = 0  # start order: the earliest prompt gets the free rows first
        self.asked = 0  # when it asked for its rows: the earliest decoding rows get a pass first
        self.deepest = engine.pair.max_draft  # the most drafts it may take in its next pass

    def policy(self, n_max) -> DepthPolicy:
        if n_max == "auto" and self.planner is not None:
            return self.planner.slot(self.index)
        policy = self._policies.get(n_max, self.drafter)
        if type(policy) is FixedDepth and policy.depth > 0:
            return _PassBoundDepth(policy.depth, self)
        return policy

    @property
    def auto(self) -> bool:
        return self.planner is not None and self.opts is not None and self.opts.n_max == "auto"

    def forget(self) -> None:
        self.prompt_cache.forget()
        self.ctx.clear()
        if self.drafter is not None:
            self.drafter.reset()

    @property
    def state(self) -> str:
        if self.run is None:
            return "idle"
        return "prefill" if self.rows is not None and self.rows.prompt else "decoding"


@dataclass
class _Round:
    parts: list[tuple[_Slot, list[int], int]] = field(default_factory=list)  # slot, tokens, pos0


class BatchEngine:
    """``n_seq`` slots over one loaded pair and one target context (see the module docstring).

    Not thread-safe: one thread starts sequences and runs rounds (runtime/server/pool.py's
    worker); ``tokenize``, ``detokenize`` and ``cached_prefix`` may be called from others."""

    def __init__(self, target: Model, pair: PairFiles, config: EngineConfig | None = None, n_seq: int = 1,
                 drafter_model: Model | None = None) -> None:
        cfg = self.config = config or EngineConfig()
        if n_seq < 1:
            raise ValueError(f"sequences: expected >= 1, found {n_seq}")
        self.target, self.pair, self.n_seq = target, pair, n_seq
        self.target_spec = pair.target
        self._closed = False
        self._owned: list[Model] = []
        deepest = pair.max_draft if pair.drafter is not None else 0
        if n_seq == 1:  # Engine's context: the ring keeps the sliding-window cache small
            params = one_sequence_params(cfg, pair.target.sliding_window, deepest, pair.drafter is not None)
        else:
            # every slot's deepest verify block fits one batch; a microbatch takes them all at once
            n_batch = max(cfg.n_batch, n_seq * (deepest + 1))
            params = ContextParams(n_ctx=cfg.n_ctx * n_seq, n_batch=n_batch, n_ubatch=min(cfg.n_ubatch or n_batch, n_batch),
                                   kv_type=cfg.kv_type, n_threads=cfg.n_threads, swa_full=True, n_seq=n_seq,
                                   flash_attn=target_flash_attn(cfg))
        self.ctx = Context(target, params)
        # a prompt part: the one-slot context's microbatch, where the prompt alone is cut
        self._prompt_part = params.n_batch if n_seq == 1 else \
            one_sequence_params(cfg, pair.target.sliding_window, deepest, pair.drafter is not None).n_ubatch
        self._prompt_turn = True
        self._captured: set[int] = set()
        self.max_pass_rows = pass_rows_bound(pair.target)  # None: any
        # a GPU backend replays the graph of the last batch shape, as in Engine: the planner
        # prices changes of shape and capture stays on (a switch costs more than capturing)
        self.graph_replay = target.n_gpu_layers > 0 and gpu_offload_supported()
        # ``auto`` chooses every round's depths for the whole pass (runtime/tuner/batch.py)
        self.planner = BatchPlanner(pair.drafter.max_draft, pair.drafter.sliding_window, self.graph_replay) \
            if pair.drafter is not None else None
        self._t_pass = 0.0  # when the last pass's decode ended: a pass is timed from there to its own end
        self._after_prompt = False  # whether the last pass was a prompt's
        self._last_shape: tuple = ()  # the last pass's rows per sequence and captured layers
        self._stretch: list[float] = []  # the planner's plain stretch: its passes' times, told at its end
        self._order = itertools.count()
        self.slots: list[_Slot] = []
        try:
            for i in range(n_seq):
                view = SeqView(self.ctx, i)
                drafter = None
                if pair.drafter is not None:
                    drafter = Drafter(pair.drafter.path, view, n_gpu_layers=cfg.n_gpu_layers_draft,
                                      kv_type=cfg.kv_type, n_threads=self.ctx.n_threads, spec=pair.drafter,
                                      check_target=False, model=drafter_model)
                    drafter.keep_capture = self.graph_replay
                    drafter.enable_capture()
                self.slots.append(_Slot(i, self, view, drafter))
        except BaseException:
            self.close()
            raise

    @classmethod
    def open(cls, pair: PairFiles, config: EngineConfig | None = None, n_seq: int = 1) -> "BatchEngine":
        """An engine over a resolved pair, with models of its own (closed with the engine)."""
        cfg = config or EngineConfig()
        engine, owned = build_on_own_models(pair, cfg, lambda t, d: cls(t, pair, cfg, n_seq, d))
        engine._owned = owned
        return engine

    # ------------------------------------------------------------------ what a server reads

    @property
    def limits(self) -> PairLimits:
        """What a request may ask of a slot (GenerateOptions.check_limits)."""
        return self.pair.limits(self.ctx.n_ctx_seq, self.config.n_batch)

    @property
    def drafter(self) -> Drafter | None:
        """A slot's drafter (all have the same spec), or None."""
        return self.slots[0].drafter if self.slots else None

    def _check_open(self) -> None:
        refuse_closed(self._closed, self.target)

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        self._check_open()
        return self.target.tokenize(text, add_special=add_bos, parse_special=True)

    def detokenize(self, tokens: list[int]) -> str:
        self._check_open()
        return self.target.detokenize(tokens).decode("utf-8", errors="replace")

    def cached_prefix(self, slot: int, tokens) -> int:
        """How many leading ``tokens`` slot's prompt cache holds (0 while it runs)."""
        return self.slots[slot].prompt_cache.shared_prefix(tokens)

    n_lanes = 1  # runtime/lanes.py: slots in several engines

    def lane_of(self, slot: int) -> int:
        """``slot``'s lane (runtime/lanes.py): all slots share one here."""
        return 0

    def slot_states(self) -> list[dict]:
        return [{"slot": s.index, "state": s.state, "n_generated": len(s.out) if s.run is not None else 0}
                for s in self.slots]

    # ------------------------------------------------------------------ running sequences

    def busy(self, slot: int) -> bool:
        return self.slots[slot].run is not None

    @property
    def running(self) -> int:
        return sum(s.run is not None for s in self.slots)

    def start(self, slot: int, prompt: str | list[int], options: GenerateOptions | None = None) -> None:
        """Start a generation on an idle slot; it runs from the next round. A refused request
        (a token id outside the vocabulary, limits, context) raises here and starts nothing."""
        self._check_open()
        s = self.slots[slot]
        if s.run is not None:
            raise LlamaError(f"slot {slot} is running a sequence")
        opts = options or GenerateOptions()
        tokens = self.tokenize(prompt, opts.add_bos) if isinstance(prompt, str) else self.target.check_tokens(prompt)
        if not tokens:
            raise ValueError("prompt: expected at least one token")
        opts.check_limits(self.limits)
        check_context(len(tokens), opts.n_predict, self.ctx.n_ctx_seq)
        s.out, s.texts, s.opts = [], [], opts
        run = generation(s, tokens, opts, s.out, s.texts)
        s.started = s.asked = next(self._order)
        try:
            s.rows = next(run)
        except BaseException:
            s.forget()
            raise
        s.run = run

    def cancel(self, slot: int) -> Finished | None:
        """End a slot's generation now (its caches are forgotten); None when it was idle."""
        s = self.slots[slot]
        if s.run is None:
            return None
        s.run.close()
        s.forget()
        return self._end(s, Finished(slot, s.out, Stats(), "interrupted"))

    def take_text(self, slot: int) -> str:
        """The text a slot's generation produced since the last call. Safe beside a round running
        in another thread (runtime/lanes.py): pieces appended meanwhile stay for the next call."""
        texts = self.slots[slot].texts
        n = len(texts)
        text = "".join(texts[:n])
        del texts[:n]
        return text

    def step(self) -> list[Finished]:
        """One round: one target decode over every running sequence's rows; returns the
        sequences that ended (their text is still to take)."""
        self._check_open()
        done: list[Finished] = []
        rnd = self._plan(done)
        if not rnd.parts:
            return done
        self._switch_capture(rnd)
        try:
            firsts = self.ctx.decode_seqs([(s.index, tokens, pos0, len(tokens) - 1 if s.rows.prompt else 0)
                                           for s, tokens, pos0 in rnd.parts])
        except Exception as e:  # the target's state is unknown for each of them
            for s, _, _ in rnd.parts:
                s.run.close()
                s.forget()
                done.append(self._end(s, Finished(s.index, s.out, error=e)))
            return done
        if self.planner is not None:
            self._plan_depths(rnd)
        for (s, tokens, _), row0 in zip(rnd.parts, firsts):
            s.ctx.row0, s.ctx.last_n_tokens = row0, len(tokens)
            try:
                s.rows = s.run.send(len(tokens))
                s.asked = next(self._order)
            except StopIteration as e:
                stats, reason = e.value
                done.append(self._end(s, Finished(s.index, s.out, stats, reason)))
            except Exception as e:
                s.run.close()
                s.forget()
                done.append(self._end(s, Finished(s.index, s.out, error=e)))
        return done

    def _plan(self, done: list[Finished]) -> _Round:
        """This round's pass: the next part of the earliest prompt, alone, or the decoding
        sequences' rows (plain steps and verify blocks, :meth:`_decoding_pass`), in sequence order
        (llama.cpp groups a microbatch by ascending, consecutive sequence ids). The two take turns
        while both wait, so a long prompt never stalls the others by more than one part a round.

        A prompt's rows never share a pass. Under a rows bound (``max_pass_rows``) a larger pass
        computes a row by where it falls in it (Q4_K's 4-row tiles against its one-row kernel),
        so a prompt part beside other rows would differ in the last bits from that part alone.
        Without one it would be exact but gains nothing: llama.cpp puts the same number of rows
        of each sequence in a microbatch, so a prompt part beside one-row steps runs as several
        microbatches anyway, and prompts that share a pass each wait for all of them, which
        delays a burst's first tokens at no gain in throughput (docs/results/concurrency,
        "Prompts that wait together share a pass"). Parts are cut where the one-slot engine's
        microbatches are (``_prompt_part``), so each is the pass the prompt has when it runs
        alone."""
        rnd = _Round()
        running = [s for s in self.slots if s.run is not None]
        prompts = sorted((s for s in running if s.rows.prompt), key=lambda s: s.started)
        decoding = [s for s in running if not s.rows.prompt]
        self._prompt_turn = bool(prompts) and (not decoding or self._prompt_turn)
        if self._prompt_turn:
            s = prompts.pop(0)
            rnd.parts.append((s, s.rows.tokens[:self._prompt_part], s.rows.pos0))
        else:
            rnd.parts.extend((s, s.rows.tokens, s.rows.pos0) for s in self._decoding_pass(decoding))
        self._prompt_turn = not self._prompt_turn  # the other kind goes next
        for s in prompts:  # waiting this round: a stop asked for ends it now
            if s.opts.should_stop is not None and s.opts.should_stop():
                s.run.close()
                s.forget()
                done.append(self._end(s, Finished(s.index, s.out, Stats(), "interrupted")))
        return rnd

    def _decoding_pass(self, decoding: list[_Slot]) -> list[_Slot]:
        """The decoding sequences whose rows fit this round's pass, in sequence order: all of
        them, or under ``max_pass_rows`` those that fit, the earliest to ask first; the rest wait
        for the next round, where they are the earliest. The earliest always goes, so rows wait
        at most a round (the depth bound, :meth:`_deepest`, makes this rare: a prompt's sequence
        joining others that drafted for fewer, more sequences than the bound has rows)."""
        if self.max_pass_rows is None:
            return decoding
        chosen, rows = [], 0
        for s in sorted(decoding, key=lambda s: s.asked):
            if not chosen or rows + len(s.rows.tokens) <= self.max_pass_rows:
                chosen.append(s)
                rows += len(s.rows.tokens)
        return sorted(chosen, key=lambda s: s.index)

    def _deepest(self, n: int) -> int:
        """The most drafts each of ``n`` sequences of a decoding pass may take: an equal share of
        ``max_pass_rows`` (one row of it its plain step), at least none."""
        if self.max_pass_rows is None:
            return self.pair.max_draft
        return min(self.pair.max_draft, max(self.max_pass_rows // max(n, 1) - 1, 0))

    def _plan_depths(self, rnd: _Round) -> None:
        """Tell the planner how long the pass it planned took and plan the next decoding pass:
        its sequences are every decoding one and a prompt that ends in this pass, each bounded to
        :meth:`_deepest` drafts and its ``auto`` ones planned, before those that choose now
        choose their depths. A pass is timed from the end of the last decode to its own end (the
        sequences' acceptance, their drafts, this decode), but not a prompt's pass, nor the
        decoding pass after one (its sequences drafted before the prompt's pass, outside its
        time), nor a pass of another shape than the last (rows per sequence, captured layers):
        a drafter returning from plain steps reads their rows first, and the target rebuilds its
        graph for it unless it kept one of that shape (a CPU context keeps four, patch 0038), so
        a depth timed there would look dearer than it runs."""
        if self.max_pass_rows is None and not any(s.auto for s in self.slots if s.run is not None):
            # no sequence is the planner's and every bound is the drafter's deepest: nothing to
            # plan, and nothing to time, since an auto sequence's first pass is its prompt's,
            # which is never timed (a plan and an observe cost a short pass 1-2%)
            return
        now = time.perf_counter()
        planner = self.planner
        if planner.stretch_left:
            held = self._stretch_holds(rnd)
            if held:  # one of the stretch's passes: told at its end
                self._stretch.append(now - self._t_pass)
                self._t_pass = now
                planner.stretch_left -= 1
                if planner.stretch_left:
                    return  # the plan stands: plain steps again
            self._end_stretch()
            if held:
                self._plan_next(rnd)
                return
        prefill = any(s.rows.prompt for s, _, _ in rnd.parts)
        decoded = {s.index: len(tokens) - 1 for s, tokens, _ in rnd.parts if not s.rows.prompt and s.auto}
        other_rows = sum(len(tokens) for s, tokens, _ in rnd.parts if not s.rows.prompt and not s.auto)
        shape = (tuple(len(tokens) for _, tokens, _ in rnd.parts), frozenset(self._captured))
        self.planner.observe(decoded, other_rows, now - self._t_pass, timed=not (prefill or self._after_prompt),
                             settled=shape == self._last_shape)
        self._t_pass, self._after_prompt, self._last_shape = now, prefill, shape
        self._plan_next(rnd)

    def _plan_next(self, rnd: _Round) -> None:
        ending = {s.index for s, tokens, _ in rnd.parts if s.rows.prompt and len(tokens) == len(s.rows.tokens)}
        next_pass = [s for s in self.slots if s.run is not None and (not s.rows.prompt or s.index in ending)]
        deepest = self._deepest(len(next_pass))
        for s in next_pass:
            s.deepest = deepest
        participants = [s for s in next_pass if s.auto]
        fixed_rows = sum(1 + (min(s.opts.n_max, deepest) if s.drafter is not None and isinstance(s.opts.n_max, int)
                              else 0) for s in next_pass if not s.auto)
        context = sum(s.rows.pos0 + len(s.rows.tokens) for s in participants)
        depths = self.planner.plan([s.index for s in participants], fixed_rows, context, deepest,
                                   begins=any(s.index in ending for s in participants))
        if (participants and self.planner.current is not None and not any(depths) and not ending
                and len(participants) == sum(s.run is not None for s in self.slots)):
            # a plain stretch: the passes after this one run without the planner (a plan and an
            # observe cost a short pass several percent) while its sequences alone decode, none
            # reading its rows; the first of them is this planned one
            ahead = self.planner.current.plain_rounds_ahead()
            stretch = min(self.planner.plain_stretch(context), *(s.drafter.unread_steps(ahead) for s in participants))
            if stretch:
                self.planner.stretch_left = stretch + 1
                self.planner.stretch_slots = tuple(s.index for s in participants)

    def _stretch_holds(self, rnd: _Round) -> bool:
        """Whether the pass just run was the stretch's: its sequences' plain steps alone, no
        other sequence running (a prompt waiting), and of the last pass's shape (settled)."""
        if tuple(s.index for s, _, _ in rnd.parts) != self.planner.stretch_slots:
            return False
        if any(len(tokens) != 1 or s.rows.prompt for s, tokens, _ in rnd.parts):
            return False
        return (sum(s.run is not None for s in self.slots) == len(rnd.parts)
                and self._last_shape == ((1,) * len(rnd.parts), frozenset(self._captured)))

    def _switch_capture(self, rnd: _Round) -> None:
        """The target captures the layers any sequence of this round wants; switched only on a
        change (a switch costs the next decode a graph rebuild, or on a CPU a kept graph's placing)."""
        want: set[int] = set()
        for s, _, _ in rnd.parts:
            want |= s.ctx.capture_wish
        for slot in want ^ self._captured:
            self.ctx.set_capture(slot, slot in want)
        self._captured = want

    def _end_stretch(self) -> None:
        self.planner.stretch_ends(self._stretch)
        self._stretch = []

    def _end(self, s: _Slot, fin: Finished) -> Finished:
        s.run = s.rows = None
        if self.planner is not None and self.planner.stretch_left:
            self._end_stretch()  # its passes are told now: the next may be the engine's last for a while
        return fin

    def generate_all(self, prompts: list, options: GenerateOptions | list[GenerateOptions] | None = None
                     ) -> list[GenerationResult]:
        """Run prompts to their ends, up to n_seq at a time, each on the first free slot."""
        opts = options if isinstance(options, list) else [options or GenerateOptions()] * len(prompts)
        results: list[GenerationResult | None] = [None] * len(prompts)
        texts: dict[int, list[str]] = {}
        owner: dict[int, int] = {}
        pending = list(range(len(prompts)))
        while pending or owner:
            for slot in range(self.n_seq):
                if pending and slot not in owner:
                    i = pending.pop(0)
                    self.start(slot, prompts[i], opts[i])
                    owner[slot], texts[i] = i, []
            for fin in self.step():
                i = owner.pop(fin.slot)
                texts[i].append(self.take_text(fin.slot))
                if fin.error is not None:
                    raise fin.error
                results[i] = GenerationResult(tokens=list(fin.tokens), text="".join(texts[i]), stats=fin.stats,
                                              stop_reason=fin.stop_reason)
            for slot, i in owner.items():
                texts[i].append(self.take_text(slot))
        return results

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Free the contexts (and the models BatchEngine.open loaded). Closing twice is harmless."""
        self._closed = True
        for s in self.slots:
            if s.run is not None:
                s.run.close()
                s.run = None
            if s.drafter is not None:
                s.drafter.close()
        self.slots = []
        if getattr(self, "ctx", None) is not None:
            self.ctx.close()
        for m in self._owned:
            m.close()
        self._owned = []

    def __enter__(self) -> "BatchEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
