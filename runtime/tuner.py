"""Draft-depth policies: how many tokens to draft in the next round.

The engine asks ``choose()`` before each round and reports back with ``observe(depth,
accepted, t_round)``; depth 0 is a plain decoding step.
"""

from __future__ import annotations


COST_LINE_WEIGHT = 3.0  # a drafting depth's cost leans on the line through all depths as on 3 rounds
# a drafting depth timed MISFIT_MIN_SAMPLES times or more whose median is this far off the line
# means the costs are not a line (a GPU switches kernels at some batch size): then depths lean
# on their timed neighbours instead
COST_LINE_MISFIT = 0.35
MISFIT_MIN_SAMPLES = 3
PRIOR_SHRINK = 0.9  # the prior of draft position i+1 is centred at 0.9 x the estimate at i
# exploit no depth more than this beyond the deepest timed one: past it the cost is the line's
# extrapolation, and visits (best+1, best+2) time the way there
EXPLOIT_REACH = 2
# After a stretch of plain steps the drafter reads only the last CATCHUP_ROWS of them (its whole
# window, if that is smaller) before it drafts again: every row read costs a tiny plain step
# 1-2% (the target's capture, the copy for the drafter), and on the tiny pair drafts after 150
# plain steps were accepted as often with only the last 32-128 rows in the drafter's context as
# with all 512 (scripts/bench_capture_horizon.py, docs/autotune.md)
CATCHUP_ROWS = 64


def capture_horizon(window: int) -> int:
    """How many plain steps before a drafting round read their rows for the drafter."""
    return min(window, CATCHUP_ROWS) if window > 0 else CATCHUP_ROWS


class DepthPolicy:
    def choose(self) -> int:
        raise NotImplementedError

    def observe(self, depth: int, accepted: int, t_round: float, t_catchup: float = 0.0) -> None:
        """A round at ``depth`` accepted ``accepted`` drafts and took ``t_round`` seconds, plus
        ``t_catchup`` seconds for the drafter to read the rows of the plain steps before it."""

    def plain_rounds_ahead(self) -> int:
        """How many rounds after this one are certain to be plain decoding steps."""
        return 0

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
    """Online choice of the draft depth that maximises expected tokens per second.

    It learns, per draft position i, the probability a_i that the draft at i is accepted given
    that every earlier one was (a round is right-censored at its first rejection), and the wall
    time of a round at each depth (depth 0 is a plain decoding step). The expected tokens of a
    round at depth k are E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j; it picks argmax E(k) / cost(k).

    - Acceptance evidence decays over about ``memory`` drafting rounds, so a change of content
      moves the choice; positions beyond the depths recently drafted fade faster
      (``unseen_decay``) back to a prior borrowed from the position before.
    - A depth's cost is the lower median of its last ``cost_window`` timed rounds (a stall of a
      shared machine moves it by one rank); it leans on the least-squares line through all
      timed drafting depths as on COST_LINE_WEIGHT rounds, and untimed depths take the line,
      or less where timed neighbours show a cheaper stretch; where the costs are not a line
      (a GPU's kernel switch), each depth leans on its nearest timed neighbours instead.
    - It exploits no depth more than EXPLOIT_REACH beyond the deepest one timed: deeper costs
      are extrapolated, and exploring visits reach them a step or two at a time.
    - It starts by probing ``probe`` (``probe_rounds`` each, the first untimed, so that one
      stalled round does not set a depth's first cost), then exploits; it changes depth
      for a ``switch_margin`` better estimate. Plain decoding is the starting point, and leaving
      it takes twice the margin: the evidence about drafting then comes from a few visits, and
      lucky streaks are common. (``leave_z`` < 0 also moves acceptance that many standard
      errors lower for it after the first decision; -1 kept prose in plain decoding for its
      first 100 rounds, and 0 lost nothing on the degraded drafter: docs/autotune.md.)
    - Exploring visits (``visit_rounds`` rounds, the first untimed: it rebuilds llama.cpp's
      graphs for the new batch shape) go to a neighbour of the best depth in the order
      ``explore_turns`` (None: plain decoding, also depth 1's lower neighbour), or, while plain
      decoding is best, to the most promising drafting depth. Their interval doubles from
      ``min_explore_every`` to ``max_explore_every`` while they change nothing, and stretches so
      that their extra time stays within ``explore_budget`` of the generation time (from plain
      decoding a visit also pays the drafter's catch-up on skipped rows and a rebuild each way;
      while drafting, the interval never passes ``max_explore_every``). While drafting could
      still beat plain decoding with acceptance ``look_z`` standard errors higher, or fewer than
      ``min_evidence`` drafting rounds (decayed) stand behind the estimates, it looks again
      after ``min_explore_every`` rounds: thin evidence is no reason to stop looking.

    ``window``: the drafter's sliding window. Once plain decoding is clearly best, visits are at
    least two windows apart: live, visits from plain decoding spaced by the budget alone (every
    200-300 rounds) cost the degraded drafter 1% more than stretches of two windows (0.967 vs
    0.976 of plain decoding, docs/autotune.md). A return to predictable content is then noticed
    within two windows of rounds. Only the last ``capture_horizon`` plain steps before a visit
    read their rows for the drafter (``plain_rounds_ahead``). 0 leaves the spacing to the budget.

    Its bookkeeping is a few list passes every ``refit_every`` rounds.
    """

    def __init__(self, max_depth: int, probe=(2, 4, 0), probe_rounds: int = 3,
                 min_explore_every: int = 8, max_explore_every: int = 96, memory: float = 48.0,
                 refit_every: int = 8, explore_budget: float = 0.01, max_wait: int = 2048,
                 switch_margin: float = 0.05, unseen_decay: float = 0.97, cost_window: int = 31,
                 explore_turns=(1, -1, 1, -1, 2, -1, None), visit_rounds: int = 2,
                 leave_z: float = 0.0, look_z: float = 2.0, window: int = 0,
                 min_evidence: float = 12.0) -> None:
        self.min_evidence = min_evidence
        self.leave_z, self.look_z = leave_z, look_z
        self.window = window
        self.max_depth = max_depth
        self.ladder = [d for d in probe if d <= max_depth]
        self.probe_rounds = probe_rounds
        self._probe_len = len(self.ladder) * probe_rounds
        self.min_explore, self.max_explore = min_explore_every, max_explore_every
        self.explore_every = min_explore_every
        self.explore_budget = explore_budget
        self.max_wait = max_wait
        self.switch_margin = switch_margin
        self.unseen_decay = unseen_decay
        self.next_explore = 0
        self.refit_every = refit_every
        self._next_refit = 0
        self.decay = 1.0 - 1.0 / memory
        # decayed evidence kept at scale 1/w (w shrinks each round) so a round costs O(accepted)
        self._w = 1.0
        self.acc = [0.0] * (max_depth + 1)
        self.reach = [0.0] * (max_depth + 1)
        self.cost: dict[int, float] = {}  # median recent round time per depth
        self.cost_window = cost_window
        self._times: dict[int, list[float]] = {}  # recent round times per depth (a ring)
        self._ring_pos: dict[int, int] = {}
        self._cost_dirty: set[int] = set()
        self._cost_cache: list[float] | None = None
        self.rounds = 0
        self.best = 0  # until the evidence clearly says drafting wins (see _refit)
        self.chosen: dict[int, int] = {}
        self._decision = {"policy": "auto", "why": "probe"}
        self._explored = 0
        self._deepest, self._last_forget = 0, 0  # deepest depth since the last _forget_unseen
        self.explore_turns = explore_turns
        self.visit_rounds = visit_rounds
        self._visit: int | None = None  # depth of the rest of an exploring visit, if due
        self._visit_left = 0  # rounds of it still to come
        self._visit_first, self._visit_extra = False, 0.0  # its first round not seen yet; its extra time
        self._timed = True  # whether this round's time says what its depth costs

    # -- model

    def acceptance(self, z: float = 0.0) -> list[float]:
        """a_i for i = 1..max_depth. Each position's prior (two pseudo-trials) is centred a little
        below the estimate of the position before it (acceptance tends to fall with depth), so
        positions rarely reached borrow from their neighbour instead of from a constant; a_1's
        prior is 1/2. ``z``: each estimate moved by z standard errors (z > 0: optimistic)."""
        w, out, a = self._w, [], 0.5 / PRIOR_SHRINK
        for i in range(1, self.max_depth + 1):
            n = self.reach[i] * w + 2.0
            a = (self.acc[i] * w + 2.0 * PRIOR_SHRINK * a) / n
            out.append(min(1.0, max(0.0, a + z * (a * (1.0 - a) / n) ** 0.5)) if z else a)
        return out

    def expected_tokens(self, z: float = 0.0) -> list[float]:
        out, p = [1.0], 1.0
        for a in self.acceptance(z):
            p *= a
            out.append(out[-1] + p)
        return out

    def _update_costs(self) -> None:
        for d in self._cost_dirty:
            ring = sorted(self._times[d])
            n = len(ring)
            self.cost[d] = ring[(n - 1) // 2]  # the lower median: of two samples, the one not stalled
        self._cost_dirty.clear()

    def cost_estimates(self) -> list[float]:
        """Round time per depth. A drafting round's time grows about linearly with its depth (one
        more verify row, one more draft row), so every drafting depth's median also informs a
        line; a depth's own median counts as ``len(samples)`` points against the line's
        ``COST_LINE_WEIGHT``, so a depth timed once or twice leans on its neighbours. Costs can
        jump instead (on a GPU a verify batch past some size runs other kernels: 60% dearer at 9
        rows on an H200), so an untimed depth between timed ones is estimated no dearer than
        its lower timed neighbour plus the gentlest growth measured, and when a depth timed
        MISFIT_MIN_SAMPLES times sits more than COST_LINE_MISFIT off the line, each depth leans
        on its nearest timed neighbours instead of the line."""
        self._update_costs()
        timed = [(k, c, len(self._times[k])) for k, c in self.cost.items() if k > 0]
        slope, mx, my = 0.0, 0.0, float("inf")
        if timed:
            n = sum(w for _, _, w in timed)
            mx = sum(k * w for k, _, w in timed) / n
            my = sum(c * w for _, c, w in timed) / n
            sxx = sum(w * (k - mx) ** 2 for k, _, w in timed)
            if sxx > 0:
                slope = max(0.0, sum(w * (k - mx) * (c - my) for k, c, w in timed) / sxx)
        pts = sorted((k, c) for k, c, _ in timed)
        if any(w >= MISFIT_MIN_SAMPLES and abs(c - my - slope * (k - mx)) > COST_LINE_MISFIT * c for k, c, w in timed):
            return self._piecewise_costs(pts)
        est = [self.cost.get(0, float("inf"))]
        gentlest = min((max(0.0, (c1 - c0) / (k1 - k0)) for (k0, c0), (k1, c1) in zip(pts, pts[1:])), default=None)
        for k in range(1, self.max_depth + 1):
            line = my + slope * (k - mx)
            if k in self.cost:
                line = self._lean(k, line)
            elif gentlest is not None and pts[0][0] < k < pts[-1][0]:
                # between timed depths: no dearer than the lower one plus the gentlest measured
                # growth, so that a jump in cost (a kernel switch) is looked for where it is,
                # not spread over the untimed depths below it
                k0, c0 = max(p for p in pts if p[0] < k)
                line = min(line, c0 + gentlest * (k - k0))
            est.append(line)
        return est

    def _lean(self, k: int, ref: float) -> float:
        """A timed depth's own median, counted as its number of samples, against ``ref`` (what
        its neighbours say) counted as COST_LINE_WEIGHT samples."""
        w = len(self._times[k])
        return (w * self.cost[k] + COST_LINE_WEIGHT * ref) / (w + COST_LINE_WEIGHT)

    def _piecewise_costs(self, timed: list[tuple[int, float]]) -> list[float]:
        """Costs from the timed drafting depths' medians ``timed`` (sorted (depth, cost)), each
        depth on the segment between its nearest timed neighbours (past the ends, the last
        segment's slope, never falling); a timed depth leans on its neighbours' segment."""

        def between(k: int, pts: list[tuple[int, float]]) -> float:
            below = [p for p in pts if p[0] < k]
            above = [p for p in pts if p[0] > k]
            if below and above:
                (k0, c0), (k1, c1) = below[-1], above[0]
                return c0 + (c1 - c0) * (k - k0) / (k1 - k0)
            end = below[-2:] if below else above[:2]
            if len(end) < 2:
                return end[0][1] if end else float("inf")
            (k0, c0), (k1, c1) = end
            slope = max(0.0, (c1 - c0) / (k1 - k0))
            k_ref, c_ref = end[-1] if below else end[0]
            return max(0.0, c_ref + slope * (k - k_ref))

        est = [self.cost.get(0, float("inf"))]
        for k in range(1, self.max_depth + 1):
            if k not in self.cost:
                est.append(between(k, timed))
                continue
            seg = between(k, [p for p in timed if p[0] != k])
            est.append(self.cost[k] if seg == float("inf") else self._lean(k, seg))
        return est

    def throughput(self, z: float = 0.0, cost: list[float] | None = None) -> list[float]:
        """Expected tokens per second at each depth (acceptance moved by z standard errors)."""
        cost = cost or self.cost_estimates()
        return [e / c if c > 0 else 0.0 for e, c in zip(self.expected_tokens(z), cost)]

    def _forget_unseen(self) -> None:
        """Positions that no round since the last refit could reach (a round at depth k says
        nothing about position k+1) forget faster, back towards their prior: evidence from
        another stretch of content must not pin a deeper depth down (or up) for long. Position
        1 keeps its evidence while plain decoding is best. Applied once per refit, for all the
        rounds since the last one."""
        f = self.unseen_decay ** (self.rounds - self._last_forget)
        acc, reach = self.acc, self.reach
        for i in range(max(2, self._deepest + 1), self.max_depth + 1):
            acc[i] *= f
            reach[i] *= f
        self._deepest, self._last_forget = 0, self.rounds

    def _refit(self) -> int:
        """The depth of best throughput(), in one pass (this runs between decodes, on cold
        caches); the current depth is kept unless another beats it by ``switch_margin``."""
        self._forget_unseen()
        cost = self._cost_cache = self.cost_estimates()
        acc, reach, w = self.acc, self.reach, self._w
        # (live, a jump from timed depths 2-6 to an extrapolated 15 took over 50 rounds to walk
        # back, one depth per refit, at 0.67-0.88 of the best depth's speed)
        farthest = max((k for k in self.cost if k > 0), default=self.max_depth) + EXPLOIT_REACH
        best, best_rate = 0, (1.0 / cost[0] if cost[0] > 0 else 0.0)
        current_rate = best_rate
        a, p, e = 0.5 / PRIOR_SHRINK, 1.0, 1.0
        for i in range(1, self.max_depth + 1):
            a = (acc[i] * w + 2.0 * PRIOR_SHRINK * a) / (reach[i] * w + 2.0)
            p *= a
            e += p
            rate = e / cost[i] if cost[i] > 0 else 0.0
            if i == self.best:
                current_rate = rate
            if rate > best_rate and i <= farthest:
                best, best_rate = i, rate
        if self.best == 0 and best != 0:
            # leaving plain decoding costs more than the estimates show (the drafter catches up
            # on the rows it skipped), and the evidence about drafting comes from a few visits:
            # it needs a clear win (with acceptance leave_z standard errors off, except at the
            # first decision, which has only the probes to go by)
            z = self.leave_z if self.rounds > self._probe_len else 0.0
            best_rate = self.throughput(z=z, cost=cost)[best]
            return best if best_rate > (1.0 + 2.0 * self.switch_margin) * current_rate else 0
        return best if best_rate > (1.0 + self.switch_margin) * current_rate else self.best

    # -- policy

    def choose(self) -> int:
        r = self.rounds
        if r < self._probe_len:
            depth, why = self.ladder[r // self.probe_rounds], "probe"
            # a depth's first round also rebuilds the compute graphs for its batch shape
            self._timed = r % self.probe_rounds != 0
        else:
            # while plain decoding is best only an exploring visit brings new evidence about
            # drafting, so refits wait for one: that makes plain_rounds_ahead() a promise
            if r >= self._next_refit and (self.best != 0 or r >= self.next_explore):
                best = self._refit()
                if best != self.best:
                    self.explore_every = self.min_explore
                self.best = best
                self._next_refit = r + self.refit_every
            depth, why = self.best, "exploit"
            self._timed = True
            if self._visit is not None:
                # the later rounds of an exploring visit: the ones that are timed
                depth, why = self._visit, "explore"
                self._visit_left -= 1
                if self._visit_left <= 0:
                    self._visit = None
            elif r >= self.next_explore:
                depth, why = self._explore_depth(), "explore"
                self.next_explore = r + self.explore_every
                self.explore_every = min(2 * self.explore_every, self.max_explore)
                # the first round at another depth rebuilds the compute graphs for the new batch
                # shapes (and after plain steps the drafter catches up): only the visit's later
                # rounds show what the depth costs
                self._visit, self._timed = depth, False
                self._visit_left = self.visit_rounds - 1
                self._visit_first, self._visit_extra = True, 0.0
        if depth != self._decision.get("depth") or why != self._decision.get("why"):
            self._decision = {"policy": "auto", "why": why, "depth": depth}
        self.chosen[depth] = self.chosen.get(depth, 0) + 1
        return depth

    def plain_rounds_ahead(self) -> int:
        if self.best != 0 or self._visit is not None or self.rounds < self._probe_len:
            return 0
        return max(0, self.next_explore - self.rounds - 1)

    def _explore_depth(self) -> int:
        if self.best == 0:
            # keep acceptance fresh so that a return to predictable content is noticed
            tput = self.throughput()
            return max(range(1, len(tput)), key=tput.__getitem__)
        self._explored += 1
        step = self.explore_turns[self._explored % len(self.explore_turns)]
        if step is None:
            return 0  # refresh the cost of plain decoding
        # depth 1's lower neighbour is plain decoding: whether drafting pays at all is the
        # question there (clamping to 1 visited the best depth itself and learnt nothing);
        # past the deepest depth the turn stops there, or, from the deepest, goes one below
        depth = min(max(self.best + step, 0), self.max_depth)
        return depth if depth != self.best else self.best - 1

    def observe(self, depth: int, accepted: int, t_round: float, t_catchup: float = 0.0) -> None:
        self.rounds += 1
        exploring = self._decision.get("why") == "explore"
        if depth > 0:
            # evidence ages per drafting round: plain steps say nothing about acceptance
            self._w *= self.decay
            if self._w < 1e-6:  # renormalise the stored evidence before it grows too large
                self.acc = [a * self._w for a in self.acc]
                self.reach = [x * self._w for x in self.reach]
                self._w = 1.0
            inc = 1.0 / self._w
            for i in range(1, min(depth, accepted + 1) + 1):
                self.reach[i] += inc
                if i <= accepted:
                    self.acc[i] += inc
        if depth > self._deepest:
            self._deepest = depth
        if exploring:
            self._schedule_after_exploring(depth, accepted, t_round, t_catchup)
        if not self._timed:
            return
        # the last ``cost_window`` times of each depth, in a ring; their lower median is the
        # depth's cost, so a stall of a shared machine moves it by one rank at most
        ring = self._times.setdefault(depth, [])
        if len(ring) < self.cost_window:
            ring.append(t_round)
        else:
            ring[self._ring_pos.get(depth, 0)] = t_round
            self._ring_pos[depth] = (self._ring_pos.get(depth, 0) + 1) % self.cost_window
        self._cost_dirty.add(depth)

    def _schedule_after_exploring(self, depth: int, accepted: int, t_round: float, t_catchup: float) -> None:
        """Keep exploration within its time budget: a visit that cost ``extra`` seconds more than
        as many rounds at the best depth puts the next one extra / (budget * cost) rounds later.
        Away from plain decoding the extra is the timed round's; from plain decoding it counts
        every round of the visit, the drafter's catch-up and the graph rebuild when plain steps
        come back (as large as the one going out), for each visit is pure loss when plain
        decoding is best. A round's time counts at most 1.5x its depth's usual cost: one stall
        of the machine must not put exploring off for a thousand rounds."""
        cost = self._cost_cache or self.cost_estimates()  # as of the last refit: close enough
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
        if self.best == 0:
            # (a verdict that keeps the drafter off for two windows needs a few visits behind it:
            # on a busy machine one visit's times can make any depth look hopeless)
            if self.reach[1] * self._w < self.min_evidence or self._drafting_could_win():
                # drafting could still win clearly enough to leave plain decoding, within what
                # the evidence allows: look again soon, until the evidence says otherwise
                self.explore_every = self.min_explore
                self.next_explore = self.rounds + self.min_explore
                return
        wait = min(int(max(0.0, extra) / (self.explore_budget * base)), self.max_wait)
        if self.best != 0:
            # a neighbour's visit costs a fraction of a round: a larger extra says the early,
            # thin cost estimates are off, and must not put exploring off for hundreds of rounds
            wait = min(wait, self.max_explore)
        if self.best == 0:
            # plain decoding is clearly best: promise a stretch of two drafter windows (all but
            # its last capture_horizon plain steps need not read their rows for the drafter)
            wait = max(wait, 2 * self.window)
        self.next_explore = max(self.next_explore, self.rounds + wait)

    def _drafting_could_win(self) -> bool:
        """Whether some depth would beat plain decoding clearly enough to leave it, with every
        acceptance estimate ``look_z`` standard errors higher. Positions that no visit reaches
        keep their prior's width, which keeps the degraded drafter's visits 8-10 rounds apart for
        its first 80-180 rounds; optimism only where rounds reached a position shut a drafter
        whose first 24 rounds were hopeless off (tests/test_tuner.py), and capping it at the
        first position's changed nothing live (docs/autotune.md)."""
        tput = self.throughput(z=self.look_z)
        return max(tput[1:]) >= (1.0 + 2.0 * self.switch_margin) * tput[0]

    def decision(self) -> dict:
        return self._decision

    def describe(self) -> dict:
        self._update_costs()
        return {"policy": "auto", "best_depth": self.best, "rounds": self.rounds,
                "chosen": {str(k): v for k, v in sorted(self.chosen.items())},
                "acceptance": [round(a, 3) for a in self.acceptance()],
                "round_cost_ms": {str(k): round(v * 1e3, 3) for k, v in sorted(self.cost.items())}}
