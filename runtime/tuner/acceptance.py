"""What the tuner believes about acceptance: per draft position, the chance its draft is accepted.

Rules:

* a_i is the probability that draft i is accepted given that drafts 1..i-1 were. A round at
  depth k that accepted n drafts is evidence for positions 1..min(k, n+1): accepted up to n,
  rejected at n+1; deeper positions are censored (the round says nothing about them).
* Each position's prior is two pseudo-trials centred at PRIOR_SHRINK x the estimate of the
  position before it (a_1's prior: 1/2), so a rarely reached position borrows from its
  neighbour: acceptance tends to fall with depth.
* Evidence ages per drafting round (weight 1 - 1/memory); plain steps say nothing about it.
* Positions no round reached since the last :meth:`forget_unseen` decay faster (``unseen_decay``
  per round) back towards their prior, so evidence from another stretch of content does not pin
  a deep depth for long; position 1 always keeps its evidence.
"""

from __future__ import annotations

#: The prior of draft position i+1 is centred at this times the estimate at i.
PRIOR_SHRINK = 0.9


class AcceptanceModel:
    def __init__(self, max_depth: int, memory: float = 48.0, unseen_decay: float = 0.97) -> None:
        self.max_depth = max_depth
        self.decay = 1.0 - 1.0 / memory
        self.unseen_decay = unseen_decay
        # decayed evidence kept at scale 1/w (w shrinks each round) so a round costs O(accepted)
        self._w = 1.0
        self.acc = [0.0] * (max_depth + 1)  # accepted drafts per position (scaled)
        self.reach = [0.0] * (max_depth + 1)  # rounds that reached the position (scaled)
        self._deepest = 0  # deepest depth drafted since the last forget_unseen
        self._last_forget = 0  # the round count at the last forget_unseen

    def observe(self, depth: int, accepted: int) -> None:
        """One round at ``depth`` (0: a plain step, no evidence) that accepted ``accepted`` drafts."""
        if depth > 0:
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

    def evidence(self, position: int) -> float:
        """Decayed number of rounds that reached ``position``."""
        return self.reach[position] * self._w

    def estimates(self, z: float = 0.0) -> list[float]:
        """a_i for i = 1..max_depth; ``z``: each moved by z standard errors (z > 0: optimistic)."""
        w, out, a = self._w, [], 0.5 / PRIOR_SHRINK
        for i in range(1, self.max_depth + 1):
            n = self.reach[i] * w + 2.0
            a = (self.acc[i] * w + 2.0 * PRIOR_SHRINK * a) / n
            out.append(min(1.0, max(0.0, a + z * (a * (1.0 - a) / n) ** 0.5)) if z else a)
        return out

    def expected_tokens(self, z: float = 0.0) -> list[float]:
        """E(k) for k = 0..max_depth: tokens a round at depth k yields, 1 + sum_{i<=k} prod_{j<=i} a_j."""
        out, p = [1.0], 1.0
        for a in self.estimates(z):
            p *= a
            out.append(out[-1] + p)
        return out

    def forget_unseen(self, rounds: int) -> None:
        """Decay the positions no round reached since the last call (``rounds``: rounds so far;
        a round at depth k says nothing about position k+1)."""
        f = self.unseen_decay ** (rounds - self._last_forget)
        acc, reach = self.acc, self.reach
        for i in range(max(2, self._deepest + 1), self.max_depth + 1):
            acc[i] *= f
            reach[i] *= f
        self._deepest, self._last_forget = 0, rounds
