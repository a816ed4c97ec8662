"""Depths for several sequences that share one target pass (runtime/batch.py).

In a batch every sequence's round lasts as long as the whole pass: one target decode over all
rows, every drafting slot's drafter pass, every slot's host work. A sequence that tuned its own
depth against that time would count the others' rows as its own cost and not its rows as theirs:
each extra draft row of one sequence slows all of them, which its own tokens per second do not
see, so each drafts deeper than is best for the pass (and every change of another sequence's
depth moves its samples). The planner instead chooses the pass, from the wall time of whole
passes and each sequence's own acceptance (:class:`PassDepth`, the :class:`AutoDepth` rules).

Every sequence of a pass drafts the same depth. Each sequence has its own KV stream, and llama.cpp
then puts the same number of rows of each sequence in a microbatch: sequences of different row
counts split the pass into one microbatch per distinct count, each a whole pass over the weights
(measured on the code pair at 4 sequences, ``-t 2``: depths 2, 2, 4, 8 took 22 ms a round, depths
4, 4, 4, 4 took 14), which costs more than giving the drafts to the sequences that accept most
gains. So a plan is one depth ``d`` for all its sequences, chosen by expected tokens (the sum of
theirs) per second of a pass at ``d``.

    planner = BatchPlanner(max_depth=15, window=512)
    policy = planner.slot(0)               # each sequence's DepthPolicy (runtime/rounds.py asks it)
    planner.plan([0, 1, 2, 3], other_rows=0, context=1800)   # before the sequences choose
    ... the sequences choose, draft; one target decode ...
    planner.observe({0: 4, 1: 4, 2: 4, 3: 4}, other_rows=0, seconds=0.012, timed=True)

A pass is keyed by its participants' count and the rows other sequences (fixed depths) add,
and keeps costs of its own. A pass of a width still in its probes starts from the nearest width
past them (beside as many other rows), at its first plan or as soon as there is one: that
width's costs, scaled by the count of sequences, stand as one sample each, and its best depth as
the incumbent, instead of the rest of its probes. Sequences start and end, so passes of fewer
sequences are common, and some are rarely or never timed: a pass of the sequences that decode
while another one's prompt does comes right after that prompt's pass, and the first widths of a
batch are planned before any pass was timed. A pass that also prefilled a prompt, whose
sequences were not those planned, or where a sequence cut its depth at its end, is not timed.
``plan(..., deepest=d)`` never gives a sequence more than ``d`` drafts (the engine's bound on a
pass's rows, runtime/batch.py); a pass first planned under it chooses among depths ``0..d``.
On a backend that replays graphs (``graph_replay``: a GPU) each pass's policy follows
AutoDepth's GPU rules, and ``plan(..., begins=True)`` tells it that a sequence's first pass
after its prompt is among the participants, where the shape changes anyway.

Where plain decoding leads a pass, its plain stretch (AutoDepth's) is the engine's to run:
after a planned plain pass of the running sequences alone, ``plain_stretch`` passes more run
without a plan (``stretch_slots``, ``stretch_left``), each sequence's round without asking its
:class:`SlotDepth`, and ``stretch_ends`` tells the pass's policy their times; a sequence's
policy tells it whether the stretch still stands, since another sequence's end or prompt
ends it early for all of them.
"""

from __future__ import annotations

from .acceptance import AcceptanceModel
from .policy import AutoDepth, DepthPolicy


class PassAcceptance:
    """The acceptance view :class:`AutoDepth` reads, over the depth every sequence of a pass
    drafts: the expected tokens at depth ``d`` are the sum of each sequence's own."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.slots: list[SlotDepth] = []

    def observe(self, depth: int, accepted: int) -> None:
        """Each sequence observes its own round (SlotDepth.observe)."""

    def expected_tokens(self, z: float = 0.0) -> list[float]:
        out = [0.0] * (self.max_depth + 1)
        for s in self.slots:
            for d, e in enumerate(s.accept.expected_tokens(z)[:self.max_depth + 1]):
                out[d] += e
        return out

    def estimates(self, z: float = 0.0) -> list[float]:
        """The participants' mean acceptance per position (for the trace)."""
        rows = [s.accept.estimates(z)[:self.max_depth] for s in self.slots] or [[0.0] * self.max_depth]
        return [sum(col) / len(rows) for col in zip(*rows)]

    def evidence(self, position: int) -> float:
        return sum(s.accept.evidence(position) for s in self.slots)

    def forget_unseen(self, rounds: int) -> None:
        for s in self.slots:
            s.accept.forget_unseen(s.rounds)


class PassDepth(AutoDepth):
    """:class:`AutoDepth` over the depth every sequence of a pass of ``n`` drafts."""

    def __init__(self, n: int, max_depth: int, window: int = 0, graph_replay: bool = False) -> None:
        super().__init__(max_depth, window=window, graph_replay=graph_replay)
        self.n = n
        self.accept = PassAcceptance(max_depth)

    def observe(self, depth: int, accepted: int, t_round: float, t_catchup: float = 0.0, settled: bool = True) -> None:
        if not settled:
            self._timed = False
        super().observe(depth, accepted, t_round, t_catchup)


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

    def plain_stretch(self, n_past: int, per_round: int = 1) -> int:
        # the passes of the planner's stretch after the planned one, if this sequence is in it
        planner = self.planner
        return max(0, planner.stretch_left - 1) if self.index in planner.stretch_slots else 0

    def stretch_holds(self) -> bool:
        return self.index in self.planner.stretch_slots

    def observe_plain_stretch(self, times: list[float]) -> None:
        self.chosen[0] = self.chosen.get(0, 0) + len(times)
        self.rounds += len(times)

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

    def __init__(self, max_depth: int, window: int = 0, graph_replay: bool = False) -> None:
        self.max_depth, self.window, self.graph_replay = max_depth, window, graph_replay
        self.passes: dict[tuple[int, int], PassDepth] = {}
        self._slots: dict[int, SlotDepth] = {}
        self.current: PassDepth | None = None
        self._planned: tuple[tuple[int, ...], int] | None = None
        self.last_total = 0
        # a plain stretch under way (runtime/batch.py runs it): its sequences, and its passes
        # still to run, the next one included; each sequence runs its part without asking
        self.stretch_slots: tuple[int, ...] = ()
        self.stretch_left = 0

    def slot(self, index: int) -> SlotDepth:
        if index not in self._slots:
            self._slots[index] = SlotDepth(self, index)
        return self._slots[index]

    def plan(self, participants: list[int], other_rows: int, context: int, deepest: int | None = None,
             begins: bool = False) -> list[int]:
        """Depths for the next pass of ``participants`` (sequence indices), beside ``other_rows``
        rows of other sequences, with ``context`` positions in all their caches, none deeper
        than ``deepest`` (None: the drafter's deepest); ``begins``: a sequence's first pass after
        its prompt is among them, where the shape changes anyway (AutoDepth.sequence_begins)."""
        participants = sorted(participants)
        deepest = self.max_depth if deepest is None else min(deepest, self.max_depth)
        if not participants or deepest <= 0:  # nothing to choose: plain steps
            for i in participants:
                self.slot(i).planned = 0
            self.current, self._planned, self.last_total = None, None, 0
            return [0] * len(participants)
        key = (len(participants), other_rows)
        pd = self.passes.get(key)
        fresh = pd is None
        if fresh:
            pd = self.passes[key] = PassDepth(len(participants), deepest, self.window, self.graph_replay)
        if begins:
            pd.sequence_begins()
        slots = [self.slot(i) for i in participants]
        pd.accept.slots = slots
        pd.context(context)
        if fresh or (pd.probing and not pd.graph_replay):
            self._start_from_nearest(pd, other_rows)
        depth = min(pd.choose(), deepest)
        for s in slots:
            s.planned = depth
        self.current, self.last_total = pd, depth * len(slots)
        self._planned = (tuple(participants), other_rows)
        return [depth] * len(slots)

    def _start_from_nearest(self, pd: PassDepth, other_rows: int) -> None:
        """A width's planner still in its probes takes the nearest timed width's costs, scaled by
        the count of sequences (a sequence's rows cost about as much in any pass), and its best
        depth. A width whose passes are rarely or never timed would otherwise stay in its probes:
        they advance only on timed passes."""
        timed = [p for (n, rows), p in self.passes.items()
                 if rows == other_rows and p is not pd and not p.probing and p.costs.medians()]
        if not timed:
            return
        near = min(timed, key=lambda p: (abs(p.n - pd.n), -p.n))
        for depth, cost in near.costs.medians().items():
            if depth <= pd.max_depth:
                pd.costs.add(depth, cost * pd.n / near.n)
        pd.start_at(min(near.best, pd.max_depth))

    def plain_stretch(self, context: int) -> int:
        """After a plan of plain steps for its sequences alone: how many passes after the planned
        one may run as plain steps without a plan (AutoDepth.plain_stretch; each pass adds a
        position to each sequence). Their times and the planned one's go to :meth:`stretch_ends`."""
        pd = self.current
        return pd.plain_stretch(context, per_round=pd.n) if pd is not None and self._planned else 0

    def stretch_ends(self, seconds: list[float]) -> None:
        """The planned pass and those of its stretch ran, in ``seconds`` each (a stretch cut
        short: fewer), settled plain passes of the planned sequences."""
        self.stretch_slots, self.stretch_left = (), 0
        pd = self.current
        if pd is None or not seconds:
            return
        pd.observe(0, 0, seconds[0])
        pd.observe_plain_stretch(seconds[1:])

    def observe(self, depths: dict[int, int], other_rows: int, seconds: float, timed: bool = True,
                settled: bool = True) -> None:
        """The pass of the last plan ran: ``depths`` per participating sequence as decoded (a
        sequence may cut its depth at its end), in ``seconds`` of wall time. A pass of other
        participants than planned, ``timed`` False (it prefilled too), or of unequal depths (it
        ran in several microbatches) says nothing of costs. One not ``settled`` (the first of
        its shape, which rebuilt the target's graph) is a round of its pass's policy whose time
        is not its depth's cost."""
        pd, planned = self.current, self._planned
        if pd is None or planned is None:
            return
        self._planned = None
        if not timed or (tuple(sorted(depths)), other_rows) != planned or len(set(depths.values())) > 1:
            return
        pd.observe(next(iter(depths.values())), 0, seconds, settled=settled)
