"""Depths for several sequences that share one target pass (runtime/batch.py).

In a batch every sequence's round lasts as long as the whole pass: one target decode over all
rows, every drafting slot's drafter pass, every slot's host work. A sequence that tuned its own
depth against that time would count the others' rows as its own cost and not its rows as theirs:
each extra draft row of one sequence slows all of them, which its own tokens per second do not
see, so each drafts deeper than is best for the pass (and every change of another sequence's
depth moves its samples). The planner instead chooses the pass: how many drafts ``K`` the
participating sequences get in all, from the wall time of whole passes (:class:`PassDepth`, the
:class:`AutoDepth` rules over ``K``) and from each sequence's own acceptance, and which sequences
get them (the ``K`` drafts of greatest expected yield, :func:`allocate`).

    planner = BatchPlanner(max_depth=15, window=512)
    policy = planner.slot(0)               # each sequence's DepthPolicy (runtime/rounds.py asks it)
    planner.plan([0, 1, 2, 3], other_rows=0, context=1800)   # before the sequences choose
    ... the sequences choose, draft; one target decode ...
    planner.observe({0: 4, 1: 4, 2: 0, 3: 2}, other_rows=0, seconds=0.012, timed=True)

A pass is keyed by its participants' count and the rows other sequences (fixed depths) add:
its costs do not carry over to a pass of other width. A pass that also prefilled a prompt, or
whose sequences were not those planned, is not timed.
"""

from __future__ import annotations

from .acceptance import AcceptanceModel
from .policy import EXPLOIT_REACH, AutoDepth, DepthPolicy


def marginals(estimates: list[float]) -> list[float]:
    """Expected tokens each further draft adds, from a sequence's acceptance per position."""
    out, p = [], 1.0
    for a in estimates:
        p *= a
        out.append(p)
    return out


def allocate(per_slot: list[list[float]], total: int) -> list[int]:
    """Depths summing to ``total`` that maximise the expected tokens: each draft goes where it
    adds most. A sequence's marginals never rise with depth (acceptance is a product), so the
    ``total`` largest of them all take a leading run of each sequence's."""
    ranked = sorted(((m, i, j) for i, ms in enumerate(per_slot) for j, m in enumerate(ms)),
                    key=lambda x: (-x[0], x[2], x[1]))
    depths = [0] * len(per_slot)
    for _, i, _ in ranked[:total]:
        depths[i] += 1
    return depths


class PassAcceptance:
    """The acceptance view :class:`AutoDepth` reads, over a pass's total drafts: the expected
    tokens of ``K`` drafts are each sequence's bonus token plus the K largest marginals."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth  # per sequence
        self.slots: list[SlotDepth] = []

    def observe(self, depth: int, accepted: int) -> None:
        """Each sequence observes its own round (SlotDepth.observe)."""

    def _per_slot(self, z: float) -> list[list[float]]:
        return [marginals(s.accept.estimates(z)) for s in self.slots]

    def expected_tokens(self, z: float = 0.0) -> list[float]:
        flat = sorted((m for ms in self._per_slot(z) for m in ms), reverse=True)
        out = [float(len(self.slots))]
        for m in flat:
            out.append(out[-1] + m)
        return out

    def estimates(self, z: float = 0.0) -> list[float]:
        """The participants' mean acceptance per position (for the trace)."""
        rows = [s.accept.estimates(z) for s in self.slots] or [[0.0] * self.max_depth]
        return [sum(col) / len(rows) for col in zip(*rows)]

    def evidence(self, position: int) -> float:
        return sum(s.accept.evidence(position) for s in self.slots)

    def forget_unseen(self, rounds: int) -> None:
        for s in self.slots:
            s.accept.forget_unseen(s.rounds)

    def split(self, total: int) -> list[int]:
        return allocate(self._per_slot(0.0), total)


class PassDepth(AutoDepth):
    """:class:`AutoDepth` over the total drafts of a pass of ``n`` sequences: its probes,
    exploring steps and reach scaled by ``n`` (one draft more or less per sequence)."""

    def __init__(self, n: int, max_depth: int, window: int = 0) -> None:
        super().__init__(n * max_depth, probe=(2 * n, 4 * n, 0), window=window,
                         explore_turns=tuple(None if t is None else t * n for t in (1, -1, 1, -1, 2, -1, None)))
        self.reach = n * EXPLOIT_REACH
        self.accept = PassAcceptance(max_depth)


class SlotDepth(DepthPolicy):
    """One sequence's policy under a planner: it plays the depth the last plan gave it and keeps
    its own acceptance (carried across its requests, as a lone engine's ``auto`` does)."""

    def __init__(self, planner: "BatchPlanner", index: int) -> None:
        self.planner, self.index = planner, index
        self.accept = AcceptanceModel(planner.max_depth)
        self.rounds = 0
        self.planned = 0
        self.n_past = 0
        self.chosen: dict[int, int] = {}

    def context(self, n_past: int) -> None:
        self.n_past = n_past

    def choose(self) -> int:
        self.chosen[self.planned] = self.chosen.get(self.planned, 0) + 1
        return self.planned

    def observe(self, depth: int, accepted: int, t_round: float, t_catchup: float = 0.0) -> None:
        self.rounds += 1
        self.accept.observe(depth, accepted)

    def plain_rounds_ahead(self) -> int:
        current = self.planner.current
        return current.plain_rounds_ahead() if current is not None and self.planned == 0 else 0

    def decision(self) -> dict:
        current = self.planner.current
        why = current.decision().get("why") if current is not None else "probe"
        return {"policy": "auto", "why": why, "depth": self.planned, "pass_drafts": self.planner.last_total}

    def describe(self) -> dict:
        return {"policy": "auto", "batched": True, "rounds": self.rounds,
                "chosen": {str(k): v for k, v in sorted(self.chosen.items())},
                "acceptance": [round(a, 3) for a in self.accept.estimates()]}


class BatchPlanner:
    """The depths of every ``auto`` sequence of a batch, one plan per pass (module docstring)."""

    def __init__(self, max_depth: int, window: int = 0) -> None:
        self.max_depth, self.window = max_depth, window
        self.passes: dict[tuple[int, int], PassDepth] = {}
        self._slots: dict[int, SlotDepth] = {}
        self.current: PassDepth | None = None
        self._planned: tuple[tuple[int, ...], int] | None = None
        self.last_total = 0
        self._split: list[int] = []
        self._split_key: tuple | None = None
        self._split_due = 0

    def slot(self, index: int) -> SlotDepth:
        if index not in self._slots:
            self._slots[index] = SlotDepth(self, index)
        return self._slots[index]

    def plan(self, participants: list[int], other_rows: int, context: int) -> list[int]:
        """Depths for the next pass of ``participants`` (sequence indices), beside ``other_rows``
        rows of other sequences, with ``context`` positions in all their caches."""
        participants = sorted(participants)
        if not participants:
            self.current, self._planned = None, None
            return []
        key = (len(participants), other_rows)
        pd = self.passes.get(key)
        if pd is None:
            pd = self.passes[key] = PassDepth(len(participants), self.max_depth, self.window)
        slots = [self.slot(i) for i in participants]
        pd.accept.slots = slots
        pd.context(context)
        total = pd.choose()
        # the split follows acceptance, which moves slowly: redone at a refit's pace, or at once
        # when the total or the participants change
        split_key = (total, tuple(participants))
        if split_key != self._split_key or pd.rounds >= self._split_due:
            self._split = pd.accept.split(total)
            self._split_key, self._split_due = split_key, pd.rounds + pd.refit_every
        depths = self._split
        for s, d in zip(slots, depths):
            s.planned = d
        self.current, self.last_total = pd, total
        self._planned = (tuple(participants), other_rows)
        return depths

    def observe(self, depths: dict[int, int], other_rows: int, seconds: float, timed: bool = True) -> None:
        """The pass of the last plan ran: ``depths`` per participating sequence as decoded (a
        sequence may cut its depth at its end), in ``seconds`` of wall time. A pass of other
        participants than planned, or ``timed`` False (it prefilled too), says nothing of costs."""
        pd, planned = self.current, self._planned
        if pd is None or planned is None:
            return
        self._planned = None
        if not timed or (tuple(sorted(depths)), other_rows) != planned:
            return
        pd.observe(sum(depths.values()), 0, seconds)
