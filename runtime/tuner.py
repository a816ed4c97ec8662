"""Draft-depth policies: how many tokens to draft in the next round.

The engine asks ``choose()`` before each round and reports back with ``observe(depth,
accepted, t_round)``; depth 0 is a plain decoding step.
"""

from __future__ import annotations


class DepthPolicy:
    def choose(self) -> int:
        raise NotImplementedError

    def observe(self, depth: int, accepted: int, t_round: float) -> None:
        """A round at ``depth`` accepted ``accepted`` drafts and took ``t_round`` seconds."""

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
    while they change nothing, up to ``max_explore_every`` rounds.
    """

    def __init__(self, max_depth: int, probe=(1, 2, 4, 8, 0), probe_rounds: int = 2,
                 min_explore_every: int = 8, max_explore_every: int = 96, memory: float = 32.0,
                 refit_every: int = 4) -> None:
        self.max_depth = max_depth
        self.ladder = [d for d in probe if d <= max_depth]
        self.probe_rounds = probe_rounds
        self.min_explore, self.max_explore = min_explore_every, max_explore_every
        self.explore_every = min_explore_every
        self.next_explore = 0
        self.refit_every = refit_every
        self.decay = 1.0 - 1.0 / memory
        self.cost_beta = 0.25
        # decayed evidence kept at scale 1/w (w shrinks each round) so a round costs O(accepted)
        self._w = 1.0
        self.acc = [0.0] * (max_depth + 1)
        self.reach = [0.0] * (max_depth + 1)
        self.cost: dict[int, float] = {}  # EMA of round wall time per depth
        self.rounds = 0
        self.best = self.ladder[0] if self.ladder else 0
        self.chosen: dict[int, int] = {}
        self._decision = {"policy": "auto", "why": "probe"}

    # -- model

    def acceptance(self) -> list[float]:
        """a_i for i = 1..max_depth. Each position's prior (two pseudo-trials) is centred on the
        estimate of the position before it, so positions rarely reached borrow from their
        neighbour instead of from an optimistic constant; a_1's prior is 1/2."""
        w, out, prior = self._w, [], 0.5
        for i in range(1, self.max_depth + 1):
            prior = (self.acc[i] * w + 2.0 * prior) / (self.reach[i] * w + 2.0)
            out.append(prior)
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

    # -- policy

    def choose(self) -> int:
        r = self.rounds
        probe_len = len(self.ladder) * self.probe_rounds
        if r < probe_len:
            depth, why = self.ladder[r // self.probe_rounds], "probe"
        else:
            if r == probe_len or r % self.refit_every == 0:
                tput = self.throughput()
                best = max(range(len(tput)), key=tput.__getitem__)
                if best != self.best:
                    self.explore_every = self.min_explore
                self.best = best
            depth, why = self.best, "exploit"
            if r >= self.next_explore:
                depth, why = self._explore_depth(), "explore"
                self.next_explore = r + self.explore_every
                self.explore_every = min(2 * self.explore_every, self.max_explore)
        if depth != self._decision.get("depth") or why != self._decision.get("why"):
            self._decision = {"policy": "auto", "why": why, "depth": depth}
        self.chosen[depth] = self.chosen.get(depth, 0) + 1
        return depth

    def _explore_depth(self) -> int:
        if self.best == 0:
            # keep acceptance fresh so that a return to predictable content is noticed
            tput = self.throughput()
            return max(range(1, len(tput)), key=tput.__getitem__)
        turn = (self.rounds // 7) % 3
        if turn == 0:
            return min(self.best + 1, self.max_depth)
        if turn == 1:
            return self.best - 1
        return 0  # refresh the cost of plain decoding

    def observe(self, depth: int, accepted: int, t_round: float) -> None:
        self.rounds += 1
        if depth > 0:
            # evidence ages per drafting round: plain steps say nothing about acceptance
            self._w *= self.decay
            if self._w < 1e-6:  # renormalise the stored evidence before it grows too large
                self.acc = [a * self._w for a in self.acc]
                self.reach = [x * self._w for x in self.reach]
                self._w = 1.0
            if self._decision.get("why") == "explore" and self.best == 0 and accepted > 0:
                # a draft got through while plain decoding looked best: look again soon
                self.explore_every = self.min_explore
                self.next_explore = min(self.next_explore, self.rounds + self.min_explore)
            inc = 1.0 / self._w
            for i in range(1, min(depth, accepted + 1) + 1):
                self.reach[i] += inc
                if i <= accepted:
                    self.acc[i] += inc
        prev = self.cost.get(depth)
        self.cost[depth] = t_round if prev is None else prev + self.cost_beta * (t_round - prev)

    def decision(self) -> dict:
        return self._decision

    def describe(self) -> dict:
        return {"policy": "auto", "best_depth": self.best, "rounds": self.rounds,
                "chosen": {str(k): v for k, v in sorted(self.chosen.items())},
                "acceptance": [round(a, 3) for a in self.acceptance()],
                "round_cost_ms": {str(k): round(v * 1e3, 3) for k, v in sorted(self.cost.items())}}
