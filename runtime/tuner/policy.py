"""Depth policies: how many tokens to draft in the next round.

The engine tells the policy the round's context length with ``context(n_past)``, asks
``choose()`` and reports back with ``observe(depth, accepted, t_round, t_catchup)``; depth 0 is a
plain decoding step. How ``auto`` was tuned and judged:
``docs/results/autotune/README.md`` (the result) and ``docs/results/autotune-history/README.md`` (the history).
"""

from __future__ import annotations

import math

from .acceptance import AcceptanceModel
from .costs import CostModel, band_end

#: Exploit no depth more than this beyond the deepest timed one: past it the cost is the line's
#: extrapolation, and exploring visits (best+1, best+2) reach it a step or two at a time.
EXPLOIT_REACH = 2
#: On a backend that replays graphs: the rounds after a change of batch shape that run without a
#: replayed graph (CUDA: the first runs directly, the second is captured) ...
SETTLE_ROUNDS = 2
#: ... and the probes there, (depth, timed rounds) each after SETTLE_ROUNDS untimed: plain
#: decoding first, while the prefill's change of shape is paid anyway, then one drafting depth
#: (one switch), long enough to be the evidence that drafting loses where it does.
GRAPH_PROBE = ((0, 2), (4, 12))
#: ... and ``look_z`` there: each look at drafting from plain decoding costs two switches.
GRAPH_LOOK_Z = 1.5
#: The incumbent's cost has moved when the median of its last RECENT_ROUNDS rounds is this far
#: from its own cost (the median of its window; the class docstring, "A cost that moves"); with the
#: busiest recorded clock's noise drawn independently, the median of 15 rounds strays 6% from
#: the window's at the 90th percentile, 11% at the 99th, 15% at the 99.9th ...
COST_MOVE = 0.25
COST_MOVE_LOG = math.log1p(COST_MOVE)
RECENT_ROUNDS = 15
#: On a CPU, plain steps run dearer for a few passes after a drafting round (live on a 2-core VM,
#: one thread: 1.85 ms the 2nd and 3rd after it against 1.13 ms from the 4th on), so plain
#: decoding timed afresh from a drafting depth leaves this many rounds untimed first.
PLAIN_SETTLE = 3
#: ... and the dearest such a step was measured (that lane: 1.85 / 1.13 ms): plain decoding,
#: probed last, right after the drafting probes, may have been timed this much dear.
PLAIN_AFTER_DRAFTING = 1.65
#: On a CPU, the 2nd, 3rd, ... round after a change of depth (up to PLAIN_SETTLE) is left untimed
#: like the 1st when, over at least SETTLE_SAMPLES recent changes the same way (to plain decoding,
#: or to drafting; the other way's while this way has fewer), the median of its time over its
#: depth's own cost is SETTLE_EXCESS or more above 1 (the class docstring, "A cost that settles").
SETTLE_EXCESS = 0.2
SETTLE_SAMPLES = 5
#: The most rounds of a promised plain stretch the engine runs before telling the policy of them
#: (:meth:`DepthPolicy.plain_stretch`): the incumbent's watch sees a move of the pace at most this
#: many rounds late.
STRETCH_ROUNDS = 16


class DepthPolicy:
    def sequence_begins(self) -> None:
        """A new sequence's prompt was just decoded; its rounds follow."""

    def context(self, n_past: int) -> None:
        """The next round starts with ``n_past`` positions in the target's cache."""

    def choose(self) -> int:
        raise NotImplementedError

    def observe(self, depth: int, accepted: int, t_round: float, t_catchup: float = 0.0) -> None:
        """A round at ``depth`` accepted ``accepted`` drafts and took ``t_round`` seconds, plus
        ``t_catchup`` seconds for the drafter to read the rows of the plain steps before it."""

    def plain_rounds_ahead(self) -> int:
        """How many rounds after this one are certain to be plain decoding steps."""
        return 0

    def plain_stretch(self, n_past: int, per_round: int = 1) -> int:
        """Right after :meth:`choose` gave a plain step at context ``n_past``: how many rounds
        after it the engine may run as plain steps without asking (no ``context``, no
        ``choose``), telling the policy of them together afterwards with
        :meth:`observe_plain_stretch` (0: ask every round). Each round adds ``per_round``
        positions to the context."""
        return 0

    def stretch_holds(self) -> bool:
        """Whether a stretch :meth:`plain_stretch` allowed still stands (asked each of its
        rounds: one shared with other sequences may end early)."""
        return True

    def observe_plain_stretch(self, times: list[float]) -> None:
        """The rounds of a stretch :meth:`plain_stretch` allowed, one time each: as a
        ``choose`` that gave a plain step and its ``observe``, round by round."""
        for t in times:
            self.observe(0, 0, t)

    def decision(self) -> dict:
        """Why the last depth was chosen (recorded in --trace)."""
        return {}

    def describe(self) -> dict:
        return {}


class FixedDepth(DepthPolicy):
    def __init__(self, depth: int) -> None:
        self.depth = depth

    def choose(self) -> int:
        return self.depth

    def plain_rounds_ahead(self) -> int:
        return 1 << 30 if self.depth == 0 else 0

    def describe(self) -> dict:
        return {"policy": "fixed", "depth": self.depth}


class AutoDepth(DepthPolicy):
    """Online choice of the draft depth k that maximises expected tokens per second, E(k) / cost(k).

    E(k) comes from the :class:`AcceptanceModel`, cost(k) from the :class:`CostModel`. The rules
    of the choice:

    * **Start**: probe the depths of ``probe`` ``probe_rounds`` times each; the first round of
      each is untimed (it rebuilds llama.cpp's graphs for the batch shape), so no single stall
      sets a depth's first cost. Plain decoding is the incumbent after the probes. On a CPU,
      plain decoding, probed last, was timed right after drafting, where its steps run dearer:
      where the first decision would leave it for a drafting depth that wins by no more than
      that could explain (PLAIN_AFTER_DRAFTING), plain decoding is timed afresh first, as after
      a move of the pace (below), and the decision waits for it.
    * **Refit** every ``refit_every`` rounds (while plain decoding is best, only after an
      exploring visit, nothing else bringing news about drafting, or after a move of its own
      cost, below): the best depth among those at most EXPLOIT_REACH beyond the deepest timed
      one. It replaces the incumbent only when ``switch_margin`` better; leaving plain decoding
      takes twice the margin, with acceptance ``leave_z`` standard errors off (except at the
      first decision, which has only the probes).
    * **Explore**: every ``explore_every`` rounds a visit of ``visit_rounds`` rounds (the first
      untimed) goes to a neighbour of the best depth, in the order of ``explore_turns`` (offsets;
      None: plain decoding; depth 1's lower neighbour is plain decoding, and a turn past the
      deepest depth goes one below it instead), or, while plain decoding is best, to the drafting
      depth of best expected throughput among those exploiting could reach. The interval
      doubles from ``min_explore_every`` to ``max_explore_every`` while visits change nothing,
      and resets when the best depth changes.
    * **Budget**: a visit that cost ``extra`` seconds more than as many rounds at the best depth
      puts the next one extra / (``explore_budget`` x the best depth's cost) rounds later, at
      most ``max_wait`` (at most ``max_explore_every`` while drafting). A round counts at most
      1.5x its depth's cost. From plain decoding a visit is pure loss, so it counts all its
      rounds, the drafter's catch-up and a graph rebuild each way.
    * **Leaving plain decoding alone**: while fewer than ``min_evidence`` decayed drafting rounds
      stand behind position 1, or no drafting depth was timed in the current context band, or
      some depth exploiting could reach would beat plain decoding clearly enough with every
      acceptance ``look_z`` standard errors higher, the next visit comes after
      ``min_explore_every`` rounds. For that last reason alone, once twice ``min_evidence``
      stands behind position 1, each wait is twice the last, up to the budget's wait (not
      held to the floor of two windows below): the optimism is then about deep positions that
      the visits, at the best depth by the estimates, rarely reach, so looking more often would
      not settle it. Otherwise visits are at least two drafter windows (2 x ``window``) apart,
      and :meth:`plain_rounds_ahead` promises the stretch, so the engine's drafter reads the
      rows of only its last capture horizon.
    * **A backend that replays graphs** (``graph_replay``: CUDA keeps one captured graph per
      context and replays it while the batch shape holds) runs the first ``SETTLE_ROUNDS``
      rounds after any change of shape without it, several times a round's cost (an H200 with
      the tiny pair: about 7 and 10 ms more than a settled 1.2-2.7 ms). Those rounds are never
      timed as their depth's cost; after a change of depth within a sequence their extra time
      over it is a *switch* (its cost: the median of recent ones). A sequence's prefill changes
      the shape anyway, so the depth changes freely at a sequence's first round (the engine
      says when: :meth:`sequence_begins`). There: the probes are ``GRAPH_PROBE`` (plain
      decoding at the first sequence's start, then one drafting depth, long enough to be the
      evidence), after which their last depth is the incumbent; visits wait for a sequence's
      start (or start once ``max_explore_every`` rounds overdue), from plain decoding they
      last ``look_rounds`` longer, and go no deeper than ``reach`` (1 here: a wrong guess costs
      two switches) past the deepest timed depth, as exploiting does; a visit's budget counts
      the switch into it within a sequence and the way back (a switch, or the rest of the
      sequence at the visited depth, whichever costs less), and the probes count as a visit of
      two switches. Within a sequence the depth changes only where it pays: the tokens the
      sequence has left (the mean of past sequences less those emitted, or while none has
      ended what it has emitted, at least 64), at the new depth's speed instead of the current
      one's (timed depths at their own cost), must save more than a switch costs, or, for a
      change to plain decoding, the rounds run since it was first refused must have lost a
      switch's worth against as many plain steps; the trace calls a refused round ``stay``
      (with ``best``, where the change would go). A context
      band spans three doublings and counts as timed when a drafting depth was timed one band
      from it, and plain decoding looks at drafting with acceptance ``GRAPH_LOOK_Z`` standard
      errors higher.
    * **A cost that moves** (not on a backend that replays graphs): the incumbent is timed every
      round, the other depths on visits, so a change of the incumbent's cost is the machine's
      pace (a shared host's moves by half within a minute) or its cost against the others' (the
      content, the context within a band), and only the others' rounds tell which. When the
      median of the incumbent's last RECENT_ROUNDS rounds moves COST_MOVE off its cost, no refit
      comes until its window has caught up (a median half of the old cost and half of the new is
      neither); then a refit comes at once (from plain decoding too, with no exploring visit: a
      visit costs several plain steps, and the budget decides when one is due), and the refit's
      best or plain decoding, if some of its rounds ran before the move, is timed afresh first
      (its rounds dropped, a visit as long as a probe, the first round untimed; for plain
      decoding PLAIN_SETTLE rounds untimed and the visit that much longer) and the choice waits
      for it. A cost that drifts makes no such step, so the same holds for a depth whose rounds
      began while the incumbent's cost (its window's median) was COST_MOVE off what it is now;
      and where the refit's best has no rounds of its own (its cost is the line's), for the
      timed depths the line goes through, nearest first. Otherwise a dip in the pace while plain
      decoding led made drafting's older costs win, and after it plain decoding kept the dip's
      cost, refreshed by one visit in seven: live, `auto` stayed at depth 5 for six runs at
      about 0.72x plain decoding.
    * **A cost that settles** (not on a backend that replays graphs): on a CPU a round right
      after a change of depth can run dear for more than the one round a visit leaves untimed
      (live, in a two-sequence lane: plain steps 1.6x their cost the 2nd and 3rd after drafting;
      recorded on an AVX2 EPYC with prose: the 1st and 2nd after any change). The rounds after
      each change are priced against their depth's own cost by their place after it and the
      way the change went (to plain decoding, or to drafting), which in practice prices the
      incumbent's rounds after each visit; where a place runs SETTLE_EXCESS dear at the median
      of recent changes that way, visits that way leave it untimed too (and last that much
      longer), and so do the incumbent's rounds back. A way with too few changes priced (a
      visited depth rarely has a cost of its own) borrows the other way's, and each way keeps
      what it measured while the incumbent is on the other side: a lane that measured its plain
      steps after drafting dear while plain decoding led, then left it, still times its visits
      to plain decoding past them. Where no place runs dear, as on the machines the older
      recordings came from, nothing changes.
    * **A promised plain stretch** (not on a backend that replays graphs): while plain decoding
      leads, the rounds before the next exploring visit within the context band are plain
      whatever their times, so :meth:`plain_stretch` lets the engine run up to STRETCH_ROUNDS of
      them without asking and tell their times together; the policy then runs each one's
      ``observe`` as it would have, and only the incumbent's watch (a catch-up's refit) comes up
      to that many rounds late. Asking costs a one-stream pass of the tiny pair on a 2-core
      CPU several percent: Python after a target pass runs on cold caches.
    """

    def __init__(self, max_depth: int, probe=(2, 4, 0), probe_rounds: int = 3,
                 min_explore_every: int = 8, max_explore_every: int = 96, memory: float = 48.0,
                 refit_every: int = 8, explore_budget: float = 0.01, max_wait: int = 2048,
                 switch_margin: float = 0.05, unseen_decay: float = 0.97, cost_window: int = 31,
                 explore_turns=(1, -1, 1, -1, 2, -1, None), visit_rounds: int = 2,
                 leave_z: float = 0.0, look_z: float = 2.0, window: int = 0,
                 min_evidence: float = 12.0, graph_replay: bool = False) -> None:
        self.graph_replay = graph_replay
        self.settle = SETTLE_ROUNDS if graph_replay else 1  # rounds untimed after a change of shape
        # a context band counts as timed when a depth was timed this many bands from it (where a
        # visit costs switches, the projection from a neighbouring band serves)
        self.band_reach = 1 if graph_replay else 0
        self.look_rounds = 4  # extra rounds of a visit from plain decoding: the switches buy evidence
        if graph_replay:
            look_z, visit_rounds = GRAPH_LOOK_Z, SETTLE_ROUNDS + 1
        self.max_depth = max_depth
        self.reach = 1 if graph_replay else EXPLOIT_REACH  # a wrong guess costs a GPU two switches
        self.accept = AcceptanceModel(max_depth, memory=memory, unseen_decay=unseen_decay)
        self.costs = CostModel(max_depth, window=cost_window, band_doublings=3 if graph_replay else 1,
                               recent_rounds=RECENT_ROUNDS)
        self.min_evidence = min_evidence
        self.leave_z, self.look_z = leave_z, look_z
        self.window = window
        steps = GRAPH_PROBE if graph_replay else [(d, probe_rounds - 1) for d in probe]
        # the probes' depth and whether it is timed, round by round
        self._probe = [(d, i >= self.settle) for d, n in steps if d <= max_depth for i in range(self.settle + n)]
        self._probe_len = len(self._probe)
        self.probe_rounds = probe_rounds
        self.min_explore, self.max_explore = min_explore_every, max_explore_every
        self.explore_every = min_explore_every
        self._look_every = min_explore_every  # the wait after a look from plain decoding (doubles)
        self.explore_budget = explore_budget
        self.max_wait = max_wait
        self.switch_margin = switch_margin
        self.next_explore = 0
        self.refit_every = refit_every
        self._next_refit = 0
        self._cost_cache: list[float] | None = None  # the estimates of the last refit
        self.rounds = 0
        self.best = 0
        self.chosen: dict[int, int] = {}
        self._decision = {"policy": "auto", "why": "probe"}
        self._explored = 0
        self.explore_turns = explore_turns
        self.visit_rounds = visit_rounds
        self._visit: int | None = None  # depth of the rest of an exploring visit, if due
        self._visit_left = 0  # rounds of it still to come
        self._visit_first, self._visit_extra = False, 0.0  # its first round not seen yet; its extra time
        self._timed = True  # whether this round's time says what its depth costs
        self._context_known = False  # whether context() was called before
        # on a backend that replays graphs (see the class docstring)
        self._last_depth: int | None = None
        self._seq_rounds = 0  # rounds of the current sequence so far
        self._seq_tokens = 0  # tokens they emitted
        self._seq_lengths: list[int] = []  # tokens of recent finished sequences
        self._since_change = 1 << 30  # rounds since the depth changed or a sequence began
        self._change_ours = False  # whether that was a change of depth within a sequence
        self._change_time = 0.0  # the unsettled rounds' time since it
        self._unresolved: list[tuple[int, float]] = []  # (depth, time) of changes not yet priced
        self._switches: list[float] = []  # recent switch costs, a ring
        self._switch_pos = 0
        self._visit_midway = False  # whether the current visit began within a sequence
        self._chose = 0  # the depth the last choose() returned (the engine may cut it at the end)
        self._declined_until = 0  # a declined change of depth is not asked again before this round
        self._stay_time, self._stayed = 0.0, 0  # seconds and tokens of the settled rounds kept since then
        # depth -> the round count at its first timed round since its rounds were last dropped
        self._timed_since: dict[int, int] = {}
        self._moved_at = -1  # the round count when the incumbent's cost last moved (COST_MOVE)
        # depth -> [the incumbent at its first timed round kept, the incumbent's cost then (None:
        # not yet known, the incumbent's window not full)]
        self._priced_at: dict[int, list] = {}
        self._moving = False  # whether it is off its cost now
        self._refit_due = False  # whether its window caught up since the last refit
        self._untimed_left = 0  # rounds of a visit to time a depth afresh still to leave untimed
        # "A cost that settles": the depth of the last round and its place after the last change
        # of depth (0: the first at it); (to plain decoding, place) -> recent times over their
        # depth's own cost
        self._played: int | None = None
        self._place = 0
        self._settling: dict[tuple[bool, int], list[float]] = {}

    # -- the models' view

    @property
    def cost(self) -> dict[int, float]:
        """Each timed depth's own cost (median of its recent rounds)."""
        return self.costs.cost

    def acceptance(self, z: float = 0.0) -> list[float]:
        return self.accept.estimates(z)

    def expected_tokens(self, z: float = 0.0) -> list[float]:
        return self.accept.expected_tokens(z)

    def cost_estimates(self) -> list[float]:
        return self.costs.estimates()

    def throughput(self, z: float = 0.0, cost: list[float] | None = None) -> list[float]:
        """Expected tokens per second at each depth (acceptance moved by z standard errors)."""
        cost = cost or self.costs.estimates()
        return [e / c if c > 0 else 0.0 for e, c in zip(self.accept.expected_tokens(z), cost)]

    # -- the choice

    def context(self, n_past: int) -> None:
        costs = self.costs
        if costs.band_of(n_past) == costs.band and self._context_known:
            return
        costs.set_context(n_past)
        if not self._context_known:
            self._context_known = True
            if not self.rounds:
                return  # nothing timed yet: the first band is where timing starts
        self._cost_cache = None
        self._next_refit = min(self._next_refit, self.rounds)
        if sum(1 for d in range(self.max_depth + 1) if costs.timed_here(d, self.band_reach)) < 2:
            self.explore_every = self.min_explore
            self.next_explore = min(self.next_explore, self.rounds + self.min_explore)

    def _timed_at_another_cost(self, best: int) -> int | None:
        """The refit's best (an untimed best: the timed depths its estimate comes from, nearest
        first) or plain decoding, when not the incumbent and some of its rounds ran at another
        cost of the incumbent: to be timed afresh before the choice leans on it (the class
        docstring, "A cost that moves")."""
        if self.graph_replay:
            return None
        now = self._own_cost(self.best)
        candidates = [best, 0]
        if best and not self.costs.timed_here(best):  # its cost is the line's, through the timed depths
            candidates += sorted((d for d in self.costs.cost if d > 0 and self.costs.timed_here(d)),
                                 key=lambda d: abs(d - best))
        for depth in dict.fromkeys(candidates):
            if depth == self.best:
                continue
            if self._timed_since.get(depth, self._moved_at) < self._moved_at:
                return depth
            priced = self._priced_at.get(depth)
            if priced is None or priced[0] != self.best or now is None:
                continue
            if priced[1] is not None and abs(math.log(now / priced[1])) > COST_MOVE_LOG:
                return depth
        return None

    def _probes_may_have_misjudged_plain(self, best: int) -> bool:
        """At the first decision, on a CPU: whether the probes' best drafting depth ``best`` wins
        only by what probing plain decoding right after drafting (its steps PLAIN_AFTER_DRAFTING
        dearer there) can explain; plain decoding is then timed afresh, settled, first."""
        if best == 0 or self.graph_replay or not self._probe_len:
            return False
        rates = self.throughput(cost=self._cost_cache)
        return rates[best] <= PLAIN_AFTER_DRAFTING * (1.0 + 2.0 * self.switch_margin) * rates[0]

    def _own_cost(self, depth: int) -> float | None:
        """``depth``'s cost from its own rounds in the band, once it has more than 2 x
        RECENT_ROUNDS of them (None before)."""
        n = self.costs.rounds_here(depth)
        return self.costs.recent(depth, n) if n > 2 * RECENT_ROUNDS else None

    def _watch_the_incumbent(self) -> None:
        """Note whether the incumbent's last RECENT_ROUNDS rounds are COST_MOVE off its cost (the
        machine's pace or its cost against the others', which only the others' rounds tell
        apart), and give the depths priced against it before its window was full its cost now."""
        own = self._own_cost(self.best)
        if own is None:
            return
        for priced in self._priced_at.values():
            if priced[1] is None and priced[0] == self.best:
                priced[1] = own  # as soon as the incumbent's window is full
        moving = abs(math.log(self.costs.recent(self.best, RECENT_ROUNDS) / own)) > COST_MOVE_LOG
        if moving and not self._moving:
            self._moved_at = self.rounds
        elif self._moving and not moving:  # its window caught up: choose now, against fresh rounds
            self._next_refit = min(self._next_refit, self.rounds)
            self._refit_due = True  # from plain decoding too, without the exploring visit a refit waits for there
        self._moving = moving

    def _reachable(self) -> int:
        """The deepest depth to exploit: ``reach`` beyond the deepest timed one."""
        return max((k for k in self.costs.cost if k > 0), default=self.max_depth) + self.reach

    def _refit(self) -> int:
        self.accept.forget_unseen(self.rounds)
        cost = self._cost_cache = self.costs.estimates()
        rates = self.throughput(cost=cost)
        farthest = self._reachable()
        best, best_rate = 0, rates[0]
        current_rate = rates[self.best]
        for i in range(1, self.max_depth + 1):
            if rates[i] > best_rate and i <= farthest:
                best, best_rate = i, rates[i]
        if self.best == 0 and best != 0:
            z = self.leave_z if self.rounds > self._probe_len else 0.0
            best_rate = self.throughput(z=z, cost=cost)[best]
            return best if best_rate > (1.0 + 2.0 * self.switch_margin) * current_rate else 0
        return best if best_rate > (1.0 + self.switch_margin) * current_rate else self.best

    def choose(self) -> int:
        r = self.rounds
        if r < self._probe_len:
            (depth, self._timed), why = self._probe[r], "probe"
        else:
            if self.graph_replay and r == self._probe_len:
                self.best = self._probe[-1][0]  # the incumbent: where the probes left the graphs
            if (r >= self._next_refit and (self.best != 0 or r >= self.next_explore or self._refit_due)
                    and not self._moving):
                self._refit_due = False
                best = self._refit()
                stale = self._timed_at_another_cost(best)
                if stale is None and r == self._probe_len and self._probes_may_have_misjudged_plain(best):
                    stale = 0
                if stale is not None:
                    best = self.best
                if best != self.best:
                    self.explore_every = self._look_every = self.min_explore
                    self._priced_at.pop(best, None)  # timed every round from now on
                    self._priced_at[self.best] = [best, None]
                self.best = best
                self._next_refit = r + self.refit_every
                if stale is not None:  # timed afresh, as long as a probe, then the choice
                    self.costs.forget(stale)
                    self._timed_since.pop(stale, None)
                    self._priced_at.pop(stale, None)
                    self._visit, self._visit_left = stale, self.probe_rounds
                    self._untimed_left = 1  # the first round rebuilds graphs
                    if stale == 0:  # (never on a backend that replays graphs: no re-times there)
                        self._untimed_left = PLAIN_SETTLE
                        self._visit_left += PLAIN_SETTLE - 1
                    self._visit_first, self._visit_extra, self._visit_midway = True, 0.0, self._seq_rounds > 0
                    self._next_refit = r + self._visit_left  # the round after the visit
                if self.graph_replay and r == self._probe_len and best == 0 and not self._plain_needs_a_look():
                    # the probes were the visit, and its two switches its cost
                    switches = 2 * self.switch_cost() / (self.explore_budget * self.costs.estimates()[0])
                    self.next_explore = r + min(max(2 * self.window, int(switches)), self.max_wait)
            depth, why = self.best, "exploit"
            self._timed = True
            if self._visit is not None:
                depth, why = self._visit, "explore"
                self._visit_left -= 1
                if self._visit_left <= 0:
                    self._visit = None
                if self._untimed_left > 0:  # a visit to time a depth afresh: its first rounds
                    self._timed = False
                    self._untimed_left -= 1
            elif r >= self.next_explore and (not self.graph_replay or self._seq_rounds == 0
                                             or r >= self.next_explore + self.max_explore):
                depth, why = self._explore_depth(), "explore"
                self.next_explore = r + self.explore_every
                self.explore_every = min(2 * self.explore_every, self.max_explore)
                self._visit, self._timed = depth, False
                self._visit_left = self.visit_rounds - 1
                if self.graph_replay and self.best == 0:
                    self._visit_left += self.look_rounds
                elif not self.graph_replay:
                    self._untimed_left = self.settle_rounds(depth == 0) - 1
                    self._visit_left += self._untimed_left
                self._visit_first, self._visit_extra = True, 0.0
                self._visit_midway = self._seq_rounds > 0
            elif self.graph_replay and self._seq_rounds > 0 and self._last_depth is not None and depth != self._last_depth:
                # the change waits for the next sequence unless it pays; asked again after the next refit
                if r < self._declined_until or not self._change_pays(self._last_depth, depth):
                    depth, why = self._last_depth, "stay"
                    self._declined_until = max(self._declined_until, self._next_refit)
            if why != "stay":
                self._stay_time, self._stayed = 0.0, 0
        if self.graph_replay:
            changing = self._seq_rounds > 0 and self._last_depth is not None and depth != self._last_depth
            if changing or self._since_change < self.settle:
                self._timed = False
        elif why == "exploit" and depth == self._played and self._place + 1 < PLAIN_SETTLE and \
                self._place + 1 < self.settle_rounds(depth == 0):
            self._timed = False  # (the 1st back stays timed: a visit's budget charges its rebuild)
        wanted = self.best if why == "stay" else None  # where the refused change would go
        if depth != self._decision.get("depth") or why != self._decision.get("why") or wanted != self._decision.get("best"):
            self._decision = {"policy": "auto", "why": why, "depth": depth}
            if wanted is not None:
                self._decision["best"] = wanted
        self.chosen[depth] = self.chosen.get(depth, 0) + 1
        self._chose = depth
        return depth

    @property
    def probing(self) -> bool:
        """Whether the start's probes are still to play (rounds count only timed passes)."""
        return self.rounds < self._probe_len

    def start_at(self, depth: int) -> None:
        """Begin without the probes, ``depth`` the incumbent: the caller gave the costs
        (runtime/tuner/batch.py, a pass of a new width). Not on a backend that replays graphs,
        whose probes also settle its graphs."""
        if self.graph_replay:
            return
        self._probe, self._probe_len = [], 0
        self.best = depth
        self.next_explore = self.min_explore

    def sequence_begins(self) -> None:
        if self._seq_rounds:
            self._seq_lengths = (self._seq_lengths + [self._seq_tokens])[-16:]
        self._seq_rounds = self._seq_tokens = self._declined_until = self._stayed = 0
        self._stay_time = 0.0
        self._since_change, self._change_ours = 0, False

    def switch_cost(self) -> float:
        """The median extra time of the unsettled rounds after a recent change of depth within a
        sequence (0 until one is priced; only on a backend that replays graphs)."""
        while self._unresolved and self.costs.timed_here(self._unresolved[0][0]):
            depth, t = self._unresolved.pop(0)
            extra = max(0.0, t - self.settle * self.costs.estimates()[depth])
            if len(self._switches) < 9:
                self._switches.append(extra)
            else:
                self._switches[self._switch_pos] = extra
                self._switch_pos = (self._switch_pos + 1) % 9
        if not self._switches:
            return 0.0
        return sorted(self._switches)[(len(self._switches) - 1) // 2]

    def _tokens_left(self) -> float:
        if not self._seq_lengths:
            return max(self._seq_tokens, 64)
        mean = sum(self._seq_lengths) / len(self._seq_lengths)
        return max(mean - self._seq_tokens, mean / 4)

    def _staying_costs(self, frm: int, to: int) -> float:
        """The time the rest of the sequence loses at depth ``frm`` against depth ``to`` (each
        timed depth at its own cost: a depth just visited is judged by what it measured)."""
        own = self.costs.medians()
        cost = [own.get(d, c) for d, c in enumerate(self._cost_cache or self.costs.estimates())]
        rates = self.throughput(cost=cost)
        if rates[to] <= 0.0:
            return 0.0
        if rates[frm] <= 0.0:
            return float("inf")
        return self._tokens_left() * (1.0 / rates[frm] - 1.0 / rates[to])

    def _change_pays(self, frm: int, to: int) -> bool:
        """Whether moving from depth ``frm`` to ``to`` now saves more than a switch costs before
        the sequence ends, or, to plain decoding, staying has lost that much since it was refused."""
        switch = self.switch_cost()
        if self._staying_costs(frm, to) > switch:
            return True
        # The forecast above rests on acceptance that remembers earlier sequences and shrinks with
        # the tokens left, so asked again it refuses to the sequence's end however plainly the
        # drafter now misses. A plain step yields one token whatever the content, so the refused
        # rounds can be weighed against it as they ran: once they have lost a switch's worth,
        # switching bounds the loss at twice the better choice's (rent or buy). Their own clock,
        # not the depth's median: a depth timed on a few rounds near a capture can look several
        # times dearer than it runs, and would end every refusal at once.
        own = self.costs.medians()
        if to != 0 or switch <= 0.0 or 0 not in own:
            return False
        return self._stay_time - self._stayed * own[0] >= switch

    def plain_rounds_ahead(self) -> int:
        if self.best != 0 or self._visit is not None or self.rounds < self._probe_len:
            return 0
        return max(0, self.next_explore - self.rounds - 1)

    def plain_stretch(self, n_past: int, per_round: int = 1) -> int:
        if (self.graph_replay or self._chose != 0 or self._decision.get("why") != "exploit" or self._refit_due
                or not self._timed):
            return 0
        # the rounds before the next exploring visit (plain_rounds_ahead) that stay in this
        # context band (a caller that never tells the context has one band): no choice among
        # them turns on their times but the incumbent's watch, which sees them together
        n = min(self.plain_rounds_ahead(), STRETCH_ROUNDS)
        if self._context_known:
            n = min(n, (band_end(n_past, self.costs.band_doublings) - n_past - 1) // per_round)
        return max(0, n)

    def observe_plain_stretch(self, times: list[float]) -> None:
        self.chosen[0] += len(times)
        super().observe_plain_stretch(times)

    def _explore_depth(self) -> int:
        if self.best == 0:
            tput = self.throughput()[:self._reachable() + 1]  # as far as _drafting_could_win looks
            return max(range(1, len(tput)), key=tput.__getitem__)
        self._explored += 1
        step = self.explore_turns[self._explored % len(self.explore_turns)]
        if step is None:
            return 0
        depth = min(max(self.best + step, 0), self.max_depth)
        return depth if depth != self.best else self.best - 1

    def observe(self, depth: int, accepted: int, t_round: float, t_catchup: float = 0.0) -> None:
        self.rounds += 1
        if self.graph_replay:
            self._track_shape(depth, accepted, t_round)
        else:
            self._price_the_settling(depth, t_round)
        exploring = self._decision.get("why") == "explore"
        self.accept.observe(depth, accepted)
        if exploring:
            self._schedule_after_exploring(depth, t_round, t_catchup)
        if self._timed:
            self.costs.add(depth, t_round)
            if not self.graph_replay:  # "A cost that moves" is not a rule where graphs replay
                self._timed_since.setdefault(depth, self.rounds)
                if depth != self.best and depth not in self._priced_at:
                    self._priced_at[depth] = [self.best, self._own_cost(self.best)]
                if depth == self.best and self.rounds >= self._probe_len:
                    self._watch_the_incumbent()

    def settle_rounds(self, to_plain: bool) -> int:
        """How many rounds after a change of depth to plain decoding (``to_plain``) or to drafting
        run dear enough to leave untimed: 1, and each place after it whose recent rounds after
        changes that way (the other way's while this way has fewer than SETTLE_SAMPLES at place
        1) ran SETTLE_EXCESS over their depth's own cost at the median (the class docstring, "A
        cost that settles")."""
        if self.graph_replay:
            return self.settle
        if len(self._settling.get((to_plain, 1), ())) < SETTLE_SAMPLES:
            to_plain = not to_plain
        n = 1
        while n < PLAIN_SETTLE:
            ratios = self._settling.get((to_plain, n))
            if not ratios or len(ratios) < SETTLE_SAMPLES or sorted(ratios)[len(ratios) // 2] < 1.0 + SETTLE_EXCESS:
                break
            n += 1
        return n

    def _price_the_settling(self, depth: int, t_round: float) -> None:
        """The round's place after the last change of depth, and, for places 1 to PLAIN_SETTLE - 1,
        its time over its depth's own cost (before this round joins it)."""
        self._place = self._place + 1 if depth == self._played else 0
        self._played = depth
        if not 0 < self._place < PLAIN_SETTLE:
            return
        n = self.costs.rounds_here(depth)
        own = self.costs.recent(depth, n) if n >= SETTLE_SAMPLES else None
        if own:
            ratios = self._settling.setdefault((depth == 0, self._place), [])
            ratios.append(t_round / own)
            del ratios[:-9]

    def _track_shape(self, depth: int, accepted: int, t_round: float) -> None:
        """Rounds since the last change of shape, and the time of the unsettled ones after a
        change of depth within a sequence (priced as a switch once the depth has a cost)."""
        if self._last_depth is not None and depth != self._last_depth and self._seq_rounds > 0:
            # a round cut short at the sequence's end changes the shape too, but is no switch
            self._since_change, self._change_ours, self._change_time = 0, depth == self._chose, 0.0
            self._timed = False
        if self._change_ours and self._since_change < self.settle:
            self._change_time += t_round
            if self._since_change == self.settle - 1:
                self._unresolved = (self._unresolved + [(depth, self._change_time)])[-9:]
        self._since_change += 1
        self._seq_rounds += 1
        self._seq_tokens += accepted + 1
        if self._decision.get("why") == "stay" and self._since_change > self.settle:
            self._stay_time += t_round
            self._stayed += accepted + 1
        self._last_depth = depth

    def _schedule_after_exploring(self, depth: int, t_round: float, t_catchup: float) -> None:
        """The budget and leaving-plain-decoding rules of the class docstring."""
        cost = self._cost_cache or self.costs.estimates()
        base = cost[self.best]
        if base == float("inf"):
            return
        t = min(t_round, 1.5 * cost[depth])
        if self.best != 0:
            self._visit_extra = t - base
        else:
            self._visit_extra += t + t_catchup - base
            if self._visit_first:
                self._visit_extra += max(0.0, t - cost[depth])  # the rebuild on the way back
        self._visit_first = False
        if self._visit is not None:
            return  # the visit goes on
        extra, self._visit_extra = self._visit_extra, 0.0
        if self.best == 0 and self._plain_lacks_evidence():
            self.explore_every = self._look_every = self.min_explore
            self.next_explore = self.rounds + self.min_explore
            return
        wait = min(int(max(0.0, extra) / (self.explore_budget * base)), self.max_wait)
        if self.best != 0:
            wait = min(wait, self.max_explore)
        if self.graph_replay:
            # the switch into the visit within a sequence, and the way back: a switch, or the rest
            # of the sequence at the visited depth, whichever costs less
            switch = self.switch_cost()
            back = max(0.0, min(switch, self._staying_costs(depth, self.best)))
            extra = switch * self._visit_midway + back
            wait = min(wait + int(extra / (self.explore_budget * base)), self.max_wait)
        if self.best == 0:
            if self._drafting_could_win():  # looks that back off (the class docstring)
                self.explore_every = self.min_explore
                self.next_explore = self.rounds + min(wait, self._look_every)
                if self.accept.evidence(1) >= 2 * self.min_evidence:
                    self._look_every = min(2 * self._look_every, self.max_wait)
                return
            wait = max(wait, 2 * self.window)
        self.next_explore = max(self.next_explore, self.rounds + wait)

    def _plain_needs_a_look(self) -> bool:
        """While plain decoding is best: whether drafting is to be visited again soon (the
        leaving-plain-decoding-alone rules of the class docstring)."""
        return self._plain_lacks_evidence() or self._drafting_could_win()

    def _plain_lacks_evidence(self) -> bool:
        """Whether too few drafting rounds stand behind position 1, or no drafting depth was
        timed in the current context band: what visits themselves supply."""
        return (self.accept.evidence(1) < self.min_evidence
                or not any(self.costs.timed_here(d, self.band_reach) for d in range(1, self.max_depth + 1)))

    def _drafting_could_win(self) -> bool:
        """Whether some depth beats plain decoding by twice the switch margin with every
        acceptance ``look_z`` standard errors higher (unreached positions keep their prior's width)."""
        # only depths exploiting could reach: a look that found a deeper one winning would not
        # be followed there, so its rounds and switches would buy nothing
        tput = self.throughput(z=self.look_z)[:self._reachable() + 1]
        return max(tput[1:]) >= (1.0 + 2.0 * self.switch_margin) * tput[0]

    def decision(self) -> dict:
        return self._decision

    def describe(self) -> dict:
        self.costs.medians()
        return {"policy": "auto", "best_depth": self.best, "rounds": self.rounds,
                "chosen": {str(k): v for k, v in sorted(self.chosen.items())},
                "acceptance": [round(a, 3) for a in self.acceptance()],
                "round_cost_ms": {str(k): round(v * 1e3, 3) for k, v in sorted(self.costs.cost.items())}}
