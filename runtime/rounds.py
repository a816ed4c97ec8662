"""One sequence's generation (SPEC §4's round loop) as a coroutine over target decodes.

``generation`` yields a :class:`Rows` each time it needs the target to decode rows of its
sequence and is sent back how many of them were decoded; everything else (the prompt cache,
drafting, acceptance, rollback, stop conditions) it does itself. Whoever drives it decodes:
:class:`~runtime.engine.Engine` one sequence at a time in its own context,
:class:`~runtime.batch.BatchEngine` every running sequence's rows in one decode of a shared
context. The logic of a round is therefore the same whatever runs beside it.

One round: draft ``k`` tokens in one drafter pass over ``[bonus, MASK*k]``; verify
``[bonus, d_1..d_k]`` in one target pass with logits on every row; accept while the target's
own choice (argmax, or a sample from the user's sampler) equals the draft; the first
disagreement, or the row after the last draft, gives the next bonus. Then the rejected rows
leave the target's KV cache and only the accepted rows' captured states enter the drafter's.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Protocol

from .prompt_cache import PromptCache
from .proposer import Proposer
from .request import GenerateOptions
from .sampling import Sampler
from .stats import Recorder, Stats
from .stops import TextCutter
from .tuner import DepthPolicy, FixedDepth


@dataclass
class Rows:
    """Rows of one sequence for the next target decode, at positions pos0, pos0 + 1, ...
    A verify block or a plain step wants logits on every row and all of it decoded; a prompt
    (``prompt``) may be decoded a leading part at a time, with logits on each part's last row."""

    tokens: list[int]
    pos0: int
    prompt: bool = False


class SequenceHost(Protocol):
    """What a sequence runs on: a target context (or one sequence of a shared one: its rows
    of the last decode indexed from 0), its drafter and its prompt cache."""

    target: object  # runtime.llama.Model
    ctx: object  # runtime.llama.Context or SeqView
    drafter: Proposer | None
    prompt_cache: PromptCache
    target_window: int

    def policy(self, n_max) -> DepthPolicy: ...

    def forget(self) -> None:
        """Clear the sequence's target and drafter caches and its prompt cache."""


class DepthPolicies:
    """A host's depth policies: a fixed depth is made per request; ``auto`` is one AutoDepth
    kept across requests, so what it learnt about costs carries over to the next prompt."""

    def __init__(self, graph_replay: bool = False) -> None:
        self.auto = None
        self.graph_replay = graph_replay  # the target's backend replays graphs (AutoDepth)

    def get(self, n_max: int | str | DepthPolicy, drafter: Proposer | None) -> DepthPolicy:
        """The policy of a checked request's n_max (GenerateOptions.check_limits)."""
        if isinstance(n_max, DepthPolicy):
            return n_max
        if n_max == "auto":
            from .tuner import AutoDepth

            if drafter is None:
                return FixedDepth(0)
            if self.auto is None:
                self.auto = AutoDepth(drafter.spec.max_draft, window=drafter.spec.sliding_window,
                                      graph_replay=self.graph_replay)
            return self.auto
        return FixedDepth(n_max)


class _Interrupted(Exception):
    pass


Generation = Generator[Rows, int, tuple[Stats, str]]


def generation(host: SequenceHost, prompt_tokens: list[int], opts: GenerateOptions, out: list[int],
               texts: list[str]) -> Generation:
    """The coroutine: yields Rows, is sent how many were decoded; appends accepted tokens to
    ``out`` and the text of each round's tokens to ``texts`` (none of a stop string); returns
    (stats, stop_reason). The prompt must already be checked against the limits."""
    ctx = host.ctx
    policy = host.policy(opts.n_max)
    sampler = Sampler(opts.sampling)
    grammar = None
    if opts.constraint is not None:
        from .constraint import ConstrainedSampler, compile_constraint

        grammar = compile_constraint(opts.constraint, host.target).matcher()
        sampler = ConstrainedSampler(opts.sampling, grammar)
    # a fixed depth of 0 is plain decoding: no capture, no drafter bookkeeping
    drafter = None if isinstance(policy, FixedDepth) and policy.depth == 0 else host.drafter
    if host.drafter is not None:
        host.drafter.set_capture(drafter is not None)
    stats = Stats(n_prompt=len(prompt_tokens))
    rec = Recorder(stats, policy, opts.trace)
    try:
        bonus = yield from _prefill(host, prompt_tokens, drafter, sampler, stats, opts)
    except _Interrupted:
        rec.generation_begins()
        rec.generation_ends(0)
        return stats, "interrupted"
    policy.sequence_begins()
    history = list(prompt_tokens)
    n_past = len(prompt_tokens)  # the target's KV cache holds positions [0, n_past)
    emitted = [bonus]
    stop_reason = "length"
    cutter = TextCutter(opts.stop)
    stretch_left = 0  # plain steps of a stretch still to run without asking (plain_stretch)

    rec.generation_begins()
    while True:
        # ---- emit what the last round produced, up to the first stop condition (a round's
        # cost, as the tuner sees it, starts here)
        rec.round_begins()
        n_keep, reason, text = _stop_check(host.target, out, emitted, opts, cutter)
        if reason is None and grammar is not None and grammar.stopped:
            reason = "eog"  # the constrained output is complete: only an end token could follow
        if reason is None and opts.should_stop is not None and opts.should_stop():
            reason = "interrupted"
        kept = emitted[:n_keep]
        out.extend(kept)
        history.extend(kept)
        if text:
            texts.append(text)
        if reason is not None:
            stop_reason = reason
            if rec.stretch:  # it ends within a plain stretch
                drafter.skip_pending(rec.stretch_ends())
            break
        rec.mark("host")
        in_stretch = stretch_left > 0
        if in_stretch and not policy.stretch_holds():  # cut short: tell it, then ask
            drafter.skip_pending(rec.stretch_ends())
            stretch_left, in_stretch = 0, False
        if in_stretch:
            depth = 0
            stretch_left -= 1
        else:
            policy.context(n_past)
            depth = min(policy.choose(), opts.n_predict - len(out) - 1, ctx.n_ctx - n_past - 2)
        rec.mark("policy")

        if drafter is None or depth <= 0:
            # ---- plain step (the drafter reads its row at its next draft, or never)
            if drafter is not None and not in_stretch:
                ahead = policy.plain_rounds_ahead()
                drafter.plain_step_begins(ahead)
                # the plain steps after it that neither the policy nor the drafter need to see
                # one by one: asked about, each costs a short pass several percent
                stretch_left = min(policy.plain_stretch(n_past), drafter.unread_steps(ahead))
            rec.mark("host")
            yield Rows([bonus], n_past)
            rec.mark("verify")
            if drafter is not None and not in_stretch:
                drafter.plain_step_ends()
            nxt = sampler.sample(ctx.logits_view(0), history[-sampler.history_len:] if sampler.history_len else ())
            rec.round_ends(0, 0, bonus, [], nxt, n_past, n_past + 1, stretch=in_stretch)
            if in_stretch and not stretch_left:
                drafter.skip_pending(rec.stretch_ends())
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
        yield Rows([bonus] + drafts, n_past)
        rec.mark("verify")
        n_acc, nxt = sampler.accept(ctx.logits_block(len(drafts) + 1), drafts, history)
        rec.mark("host")
        # ---- roll back: the target keeps bonus + accepted drafts, the drafter reads their rows
        keep = n_past + 1 + n_acc
        ctx.seq_rm(keep, -1)
        drafter.inject_captured(1 + n_acc, n_past)
        rec.mark("draft")
        rec.round_ends(depth, n_acc, bonus, drafts, nxt, n_past, keep)
        n_past, emitted, bonus = keep, drafts[:n_acc] + [nxt], nxt

    rec.generation_ends(len(out))
    host.prompt_cache.remember(prompt_tokens + out, ctx.pos_max() + 1)
    rest = cutter.finish()  # text held back as a possible stop string's start, which it was not
    if rest:
        texts.append(rest)
    return stats, stop_reason


def _prefill(host: SequenceHost, prompt_tokens: list[int], drafter: Proposer | None, sampler: Sampler,
             stats: Stats, opts: GenerateOptions) -> Generator[Rows, int, int]:
    """Decode the prompt after the prefix the prompt cache holds, as many rows at a time as the
    decoder takes, queueing each part's captured rows for the drafter's first catch-up (only
    the last window of the prompt is visible to the first draft, and a sequence that stays
    plain never reads them); returns the first token. A stop asked for between two parts ends
    it (_Interrupted)."""
    t0 = time.perf_counter()
    ctx = host.ctx
    if host.drafter is not None:
        host.drafter.drop_pending()  # rows queued by the last sequence's final plain steps
    n_cached = host.prompt_cache.reuse(prompt_tokens, ctx, host.target_window, host.drafter,
                                       drafting=drafter is not None)
    if n_cached == 0:
        host.forget()
    stats.n_cached = n_cached
    stats.checkpoint = host.prompt_cache.restored
    i0 = n_cached
    while True:
        n = yield Rows(prompt_tokens[i0:], i0, prompt=True)
        if drafter is not None:
            drafter.queue_visible(drafter.captured_features(), i0, len(prompt_tokens))
        i0 += n
        if i0 >= len(prompt_tokens):
            break
        if opts.should_stop is not None and opts.should_stop():
            raise _Interrupted
    bonus = sampler.sample(ctx.logits_view(n - 1), prompt_tokens)
    host.prompt_cache.checkpoint(prompt_tokens, ctx, host.target_window)
    stats.t_prefill = time.perf_counter() - t0
    return bonus


def _stop_check(target, out: list[int], emitted: list[int], opts: GenerateOptions,
                cutter: TextCutter) -> tuple[int, str | None, str]:
    """How many of this round's tokens to keep, why generation stops (None: it goes on), and
    the text they add. An end-of-generation token is dropped; a stop string ends generation
    with the token that completes it, and its text is cut where the string begins."""
    if len(out) >= opts.n_predict:  # n_predict 0: the prefill's token is not emitted either
        return 0, "length", ""
    pieces = []
    for j, tok in enumerate(emitted):
        if target.is_eog(tok) or tok in opts.end_tokens:
            return j, "eog", "".join(pieces)
        pieces.append(cutter.feed(target.token_bytes(tok, special=opts.special_text)))
        if cutter.stopped:
            return j + 1, "stop", "".join(pieces)
        if len(out) + j + 1 >= opts.n_predict:
            return j + 1, "length", "".join(pieces)
    return len(emitted), None, "".join(pieces)
