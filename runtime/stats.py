"""What one generation measured (:class:`Stats`) and the clock around the round loop that
measures it (:class:`Recorder`), which also feeds the depth policy each round's wall time and
writes the trace."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .tuner import DepthPolicy


@dataclass
class Stats:
    n_prompt: int = 0
    n_cached: int = 0  # prompt tokens taken from the prompt cache (not prefilled)
    checkpoint: bool = False  # the prompt cache restarted from a context checkpoint
    n_generated: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_at: list[int] = field(default_factory=list)  # per draft position: how often drafted
    accepted_at: list[int] = field(default_factory=list)  # ... and how often accepted
    # rounds by drafts accepted (index: how many; a round at depth 0 counts as 0): sums to rounds
    accepted_histogram: list[int] = field(default_factory=list)
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
        while len(self.accepted_histogram) <= n_accepted:
            self.accepted_histogram.append(0)
        self.accepted_histogram[n_accepted] += 1
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
            "n_prompt": self.n_prompt, "n_cached": self.n_cached, "checkpoint": self.checkpoint,
            "n_generated": self.n_generated, "rounds": self.rounds,
            "drafted": self.drafted, "accepted": self.accepted,
            "mean_accepted_per_round": self.mean_accepted,
            "acceptance_by_position": self.acceptance_by_position,
            "accepted_histogram": list(self.accepted_histogram),
            "depth_rounds": {str(k): v for k, v in sorted(self.depth_rounds.items())},
            "tokens_per_s": self.tokens_per_s,
            "time_s": {"prefill": self.t_prefill, "generate": self.t_total, "draft": self.t_draft,
                       "verify": self.t_verify, "host": self.t_host, "policy": self.t_policy},
            "policy": self.policy,
        }



class Recorder:
    """The timing and tracing around the round loop. The loop marks where each phase ends;
    the time since the previous mark goes to that phase's total in Stats ("host" to none:
    Stats.t_host is what the others leave). At a round's end the depth policy is told the
    round's wall time (from round_begins, catch-up apart; a plain stretch's rounds together at
    its end) and the trace gets one record."""

    _FIELDS = {"draft": "t_draft", "catchup": "t_draft", "verify": "t_verify", "policy": "t_policy"}

    def __init__(self, stats: Stats, policy: DepthPolicy, trace: Callable[[dict], None] | None) -> None:
        self.stats, self.policy, self.trace = stats, policy, trace
        self.totals = dict.fromkeys(("draft", "catchup", "verify", "policy", "host"), 0.0)
        self.clock = time.perf_counter
        self.stretch: list[float] = []  # the times of a plain stretch's rounds not yet told

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
                   n_past: int, stretch: bool = False) -> None:
        """``stretch``: a plain round of a stretch the policy allowed (plain_stretch), kept
        until :meth:`stretch_ends` tells it the stretch's rounds together."""
        now = self.clock()
        self.totals["host"] += now - self.last
        if stretch:
            self.stretch.append(now - self.t_round)
        elif depth:
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

    def stretch_ends(self) -> int:
        """Tell the policy the kept stretch's rounds; how many there were."""
        n = len(self.stretch)
        if n:
            t0 = self.clock()
            self.policy.observe_plain_stretch(self.stretch)
            self.stretch = []
            self.last = self.clock()
            self.totals["policy"] += self.last - t0
        return n

    def generation_ends(self, n_generated: int) -> None:
        s = self.stats
        s.t_total = self.clock() - self.t_start
        for phase, field_name in self._FIELDS.items():
            setattr(s, field_name, getattr(s, field_name) + self.totals[phase])
        s.n_generated = n_generated
        s.policy = self.policy.describe()
