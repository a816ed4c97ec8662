"""Draft-depth policies: how many tokens to draft in the next round.

The engine asks ``choose()`` before each round and reports back with ``observe(depth,
accepted, t_round)``; depth 0 is a plain decoding step.
"""

from __future__ import annotations


PRIOR_SHRINK = 0.9  # the prior of draft position i+1 is centred at 0.9 x the estimate at i


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
    Evidence decays over about ``memory`` rounds, so a change of content moves the choice;
    costs of depths not yet timed come from a least-squares line through the timed depths >= 1.
    It probes a ladder of depths first, then exploits; exploration rounds (a neighbour of the
    best, or a drafting depth while the best is plain decoding) come at an interval that doubles
    while they change nothing, up to ``max_explore_every`` rounds, and never more often than
    keeps their extra time within ``explore_budget`` of the generation time (a drafting round
    after a run of plain steps also pays for the drafter catching up on the skipped rows; that
    counts against the budget but not against the depth's cost). A visit is two rounds at the
    explored depth, and only the second is timed: the first also rebuilds llama.cpp's graphs for
    the new batch shape. The depth changes only for a ``switch_margin`` better estimate.
    Its bookkeeping is a few list passes every ``refit_every`` rounds.
    """

    def __init__(self, max_depth: int, probe=(2, 4, 0), probe_rounds: int = 2,
                 min_explore_every: int = 8, max_explore_every: int = 96, memory: float = 32.0,
                 refit_every: int = 8, explore_budget: float = 0.01, max_wait: int = 2048,
                 switch_margin: float = 0.03, unseen_decay: float = 0.97) -> None:
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
        self.cost_beta = 0.2
        # decayed evidence kept at scale 1/w (w shrinks each round) so a round costs O(accepted)
        self._w = 1.0
        self.acc = [0.0] * (max_depth + 1)
        self.reach = [0.0] * (max_depth + 1)
        self.cost: dict[int, float] = {}  # round wall time per depth (quick to fall, slow to rise)
        self.rounds = 0
        self.best = self.ladder[0] if self.ladder else 0
        self.chosen: dict[int, int] = {}
        self._decision = {"policy": "auto", "why": "probe"}
        self._explored = 0
        self._deepest, self._last_forget = 0, 0  # deepest depth since the last _forget_unseen
        self._visit: int | None = None  # depth of the second round of an exploring visit, if due
        self._timed = True  # whether this round's time says what its depth costs

    # -- model

    def acceptance(self) -> list[float]:
        """a_i for i = 1..max_depth. Each position's prior (two pseudo-trials) is centred a little
        below the estimate of the position before it (acceptance tends to fall with depth), so
        positions rarely reached borrow from their neighbour instead of from a constant; a_1's
        prior is 1/2."""
        w, out, a = self._w, [], 0.5 / PRIOR_SHRINK
        for i in range(1, self.max_depth + 1):
            a = (self.acc[i] * w + 2.0 * PRIOR_SHRINK * a) / (self.reach[i] * w + 2.0)
            out.append(a)
        return out

    def expected_tokens(self) -> list[float]:
        out, p = [1.0], 1.0
        for a in self.acceptance():
            p *= a
            out.append(out[-1] + p)
        return out

    def cost_estimates(self) -> list[float]:
        timed = [(k, c) for k, c in self.cost.items() if k > 0]
        slope, mx, my = 0.0, 0.0, float("inf")
        if timed:
            n = len(timed)
            mx = sum(k for k, _ in timed) / n
            my = sum(c for _, c in timed) / n
            sxx = sum((k - mx) ** 2 for k, _ in timed)
            if sxx > 0:
                slope = max(0.0, sum((k - mx) * (c - my) for k, c in timed) / sxx)
        est = [self.cost.get(0, float("inf"))]
        est += [self.cost.get(k, my + slope * (k - mx)) for k in range(1, self.max_depth + 1)]
        return est

    def throughput(self) -> list[float]:
        return [e / c if c > 0 else 0.0 for e, c in zip(self.expected_tokens(), self.cost_estimates())]

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
        cost = self.cost_estimates()
        acc, reach, w = self.acc, self.reach, self._w
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
            if rate > best_rate:
                best, best_rate = i, rate
        # leaving plain decoding costs more than the estimates show (the drafter catches up on
        # the rows it skipped), so it needs a clearer win
        margin = self.switch_margin * (2.0 if self.best == 0 else 1.0)
        return best if best_rate > (1.0 + margin) * current_rate else self.best

    # -- policy

    def choose(self) -> int:
        r = self.rounds
        if r < self._probe_len:
            depth, why = self.ladder[r // self.probe_rounds], "probe"
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
                # second round of an exploring visit: the one that is timed
                depth, why = self._visit, "explore"
                self._visit = None
            elif r >= self.next_explore:
                depth, why = self._explore_depth(), "explore"
                self.next_explore = r + self.explore_every
                self.explore_every = min(2 * self.explore_every, self.max_explore)
                # the first round at another depth rebuilds the compute graphs for the new batch
                # shapes (and after plain steps the drafter catches up); a visit is two rounds
                # and only the second one shows what the depth costs
                self._visit, self._timed = depth, False
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
        turn = self._explored % 4
        if turn in (0, 2):
            return min(self.best + 1, self.max_depth)
        if turn == 1:
            return self.best - 1
        return 0  # refresh the cost of plain decoding

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
            self._schedule_after_exploring(accepted, t_round + t_catchup)
        prev = self.cost.get(depth)
        if not self._timed:
            return
        if prev is None:
            self.cost[depth] = t_round
        elif self._decision.get("why") == "probe":
            # a depth's first round also rebuilds the compute graphs for its new batch shape;
            # each depth is probed twice and keeps its faster sample
            self.cost[depth] = min(prev, t_round)
        elif t_round < prev:
            self.cost[depth] = prev + 2.0 * self.cost_beta * (t_round - prev)
        else:
            # timing noise only ever adds (a stall of a shared machine, a graph rebuilt after a
            # change of depth): rises are taken slowly and clipped, so that one stall cannot make
            # a depth look bad for long. A drafter's catch-up is not a cost of the depth: a run
            # of rounds at that depth would not pay it again.
            self.cost[depth] = prev + 0.25 * self.cost_beta * (min(t_round, 1.5 * prev) - prev)

    def _schedule_after_exploring(self, accepted: int, t_round: float) -> None:
        if self.best == 0 and accepted > 0:
            tput = self.throughput()
            if max(tput[1:]) >= tput[0]:
                # drafts got through and drafting now looks as good as plain decoding: look
                # again soon
                self.explore_every = self.min_explore
                self.next_explore = min(self.next_explore, self.rounds + self.min_explore)
                return
        # keep exploration within its time budget: a round that cost `extra` seconds more than a
        # round at the best depth puts the next one extra / (budget * cost) rounds later
        base = self.cost.get(self.best)
        if base and t_round > base:
            wait = min(int((t_round - base) / (self.explore_budget * base)), self.max_wait)
            self.next_explore = max(self.next_explore, self.rounds + wait)

    def decision(self) -> dict:
        return self._decision

    def describe(self) -> dict:
        return {"policy": "auto", "best_depth": self.best, "rounds": self.rounds,
                "chosen": {str(k): v for k, v in sorted(self.chosen.items())},
                "acceptance": [round(a, 3) for a in self.acceptance()],
                "round_cost_ms": {str(k): round(v * 1e3, 3) for k, v in sorted(self.cost.items())}}
