"""Depth policies: how many tokens to draft in the next round.

The engine tells the policy the round's context length with ``context(n_past)``, asks
``choose()`` and reports back with ``observe(depth, accepted, t_round, t_catchup)``; depth 0 is a
plain decoding step. How ``auto`` was tuned and judged:
``docs/results/autotune/README.md`` (the result) and ``docs/results/autotune-history/README.md`` (the history).
"""

from __future__ import annotations

from .acceptance import AcceptanceModel
from .costs import CostModel, context_band

#: Exploit no depth more than this beyond the deepest timed one: past it the cost is the line's
#: extrapolation, and exploring visits (best+1, best+2) reach it a step or two at a time.
EXPLOIT_REACH = 2


class DepthPolicy:
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
      sets a depth's first cost. Plain decoding is the incumbent after the probes.
    * **Refit** every ``refit_every`` rounds (while plain decoding is best, only after an
      exploring visit: nothing else brings news about drafting): the best depth among those at
      most EXPLOIT_REACH beyond the deepest timed one. It replaces the incumbent only when
      ``switch_margin`` better; leaving plain decoding takes twice the margin, with acceptance
      ``leave_z`` standard errors off (except at the first decision, which has only the probes).
    * **Explore**: every ``explore_every`` rounds a visit of ``visit_rounds`` rounds (the first
      untimed) goes to a neighbour of the best depth, in the order of ``explore_turns`` (offsets;
      None: plain decoding; depth 1's lower neighbour is plain decoding, and a turn past the
      deepest depth goes one below it instead), or, while plain decoding is best, to the drafting
      depth of best expected throughput. The interval doubles from ``min_explore_every`` to
      ``max_explore_every`` while visits change nothing, and resets when the best depth changes.
    * **Budget**: a visit that cost ``extra`` seconds more than as many rounds at the best depth
      puts the next one extra / (``explore_budget`` x the best depth's cost) rounds later, at
      most ``max_wait`` (at most ``max_explore_every`` while drafting). A round counts at most
      1.5x its depth's cost. From plain decoding a visit is pure loss, so it counts all its
      rounds, the drafter's catch-up and a graph rebuild each way.
    * **Leaving plain decoding alone**: while fewer than ``min_evidence`` decayed drafting rounds
      stand behind position 1, or no drafting depth was timed in the current context band, or
      some depth would beat plain decoding clearly enough with every acceptance ``look_z``
      standard errors higher, the next visit comes after
      ``min_explore_every`` rounds. Otherwise visits are at least two drafter windows
      (2 x ``window``) apart, and :meth:`plain_rounds_ahead` promises the stretch, so the
      engine's drafter reads the rows of only its last capture horizon.
    """

    def __init__(self, max_depth: int, probe=(2, 4, 0), probe_rounds: int = 3,
                 min_explore_every: int = 8, max_explore_every: int = 96, memory: float = 48.0,
                 refit_every: int = 8, explore_budget: float = 0.01, max_wait: int = 2048,
                 switch_margin: float = 0.05, unseen_decay: float = 0.97, cost_window: int = 31,
                 explore_turns=(1, -1, 1, -1, 2, -1, None), visit_rounds: int = 2,
                 leave_z: float = 0.0, look_z: float = 2.0, window: int = 0,
                 min_evidence: float = 12.0) -> None:
        self.max_depth = max_depth
        self.reach = EXPLOIT_REACH
        self.accept = AcceptanceModel(max_depth, memory=memory, unseen_decay=unseen_decay)
        self.costs = CostModel(max_depth, window=cost_window)
        self.min_evidence = min_evidence
        self.leave_z, self.look_z = leave_z, look_z
        self.window = window
        self.ladder = [d for d in probe if d <= max_depth]
        self.probe_rounds = probe_rounds
        self._probe_len = len(self.ladder) * probe_rounds
        self.min_explore, self.max_explore = min_explore_every, max_explore_every
        self.explore_every = min_explore_every
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
        if context_band(n_past) == costs.band and self._context_known:
            return
        costs.set_context(n_past)
        if not self._context_known:
            self._context_known = True
            if not self.rounds:
                return  # nothing timed yet: the first band is where timing starts
        self._cost_cache = None
        self._next_refit = min(self._next_refit, self.rounds)
        if sum(1 for d in range(self.max_depth + 1) if costs.timed_here(d)) < 2:
            self.explore_every = self.min_explore
            self.next_explore = min(self.next_explore, self.rounds + self.min_explore)

    def _refit(self) -> int:
        self.accept.forget_unseen(self.rounds)
        cost = self._cost_cache = self.costs.estimates()
        rates = self.throughput(cost=cost)
        farthest = max((k for k in self.costs.cost if k > 0), default=self.max_depth) + self.reach
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
            depth, why = self.ladder[r // self.probe_rounds], "probe"
            self._timed = r % self.probe_rounds != 0
        else:
            if r >= self._next_refit and (self.best != 0 or r >= self.next_explore):
                best = self._refit()
                if best != self.best:
                    self.explore_every = self.min_explore
                self.best = best
                self._next_refit = r + self.refit_every
            depth, why = self.best, "exploit"
            self._timed = True
            if self._visit is not None:
                depth, why = self._visit, "explore"
                self._visit_left -= 1
                if self._visit_left <= 0:
                    self._visit = None
            elif r >= self.next_explore:
                depth, why = self._explore_depth(), "explore"
                self.next_explore = r + self.explore_every
                self.explore_every = min(2 * self.explore_every, self.max_explore)
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
            tput = self.throughput()
            return max(range(1, len(tput)), key=tput.__getitem__)
        self._explored += 1
        step = self.explore_turns[self._explored % len(self.explore_turns)]
        if step is None:
            return 0
        depth = min(max(self.best + step, 0), self.max_depth)
        return depth if depth != self.best else self.best - 1

    def observe(self, depth: int, accepted: int, t_round: float, t_catchup: float = 0.0) -> None:
        self.rounds += 1
        exploring = self._decision.get("why") == "explore"
        self.accept.observe(depth, accepted)
        if exploring:
            self._schedule_after_exploring(depth, t_round, t_catchup)
        if self._timed:
            self.costs.add(depth, t_round)

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
        if self.best == 0:
            if (self.accept.evidence(1) < self.min_evidence or self._drafting_could_win()
                    or not any(self.costs.timed_here(d) for d in range(1, self.max_depth + 1))):
                self.explore_every = self.min_explore
                self.next_explore = self.rounds + self.min_explore
                return
        wait = min(int(max(0.0, extra) / (self.explore_budget * base)), self.max_wait)
        if self.best != 0:
            wait = min(wait, self.max_explore)
        if self.best == 0:
            wait = max(wait, 2 * self.window)
        self.next_explore = max(self.next_explore, self.rounds + wait)

    def _drafting_could_win(self) -> bool:
        """Whether some depth beats plain decoding by twice the switch margin with every
        acceptance ``look_z`` standard errors higher (unreached positions keep their prior's width)."""
        tput = self.throughput(z=self.look_z)
        return max(tput[1:]) >= (1.0 + 2.0 * self.switch_margin) * tput[0]

    def decision(self) -> dict:
        return self._decision

    def describe(self) -> dict:
        self.costs.medians()
        return {"policy": "auto", "best_depth": self.best, "rounds": self.rounds,
                "chosen": {str(k): v for k, v in sorted(self.chosen.items())},
                "acceptance": [round(a, 3) for a in self.acceptance()],
                "round_cost_ms": {str(k): round(v * 1e3, 3) for k, v in sorted(self.costs.cost.items())}}
