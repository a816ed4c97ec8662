"""What the engine may ask of a drafter: the proposer interface, written down.

:class:`runtime.drafter.Drafter` (the DFlash drafter in llama.cpp) implements it; the engine
(runtime/engine.py) and the prompt cache call nothing else. The order of the calls:

1. once, after both contexts exist: ``enable_capture()`` (the target captures the drafter's
   layers).
2. per sequence, before the prompt: ``set_capture(drafting)`` (off for a plain run),
   ``drop_pending()``; then the prompt cache ``trim``\\s (drafting) or ``truncate``\\s (plain)
   the drafter's context to the prefix it reuses, or the engine calls ``reset()``.
3. per prefilled chunk of the prompt (drafting): ``queue_visible(captured_features(), ...)``.
4. per round, drafting: ``catch_up(n_past)`` (the queued rows: the prompt's, the plain
   steps'), ``draft(bonus, k)`` (k proposals; ``draft_logits`` under an output constraint), the
   target verifies, then ``inject_captured(1 + n_accepted, n_past)``.
   A plain round inside a drafting sequence is wrapped in ``plain_step_begins(rounds_ahead)``
   and ``plain_step_ends()`` (the row is queued for the next catch-up, or skipped); the
   ``unread_steps(rounds_ahead)`` after it may run unwrapped, told at once by ``skip_pending(n)``.
5. ``close()``.

Positions are the target's: the drafter's context row p is the target's hidden state at p.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class ProposerSpec(Protocol):
    @property
    def max_draft(self) -> int:
        """The most tokens one ``draft`` may propose (block_size - 1)."""

    @property
    def sliding_window(self) -> int:
        """How far back a draft sees (0: every context row)."""


class Proposer(Protocol):
    spec: ProposerSpec
    #: capture stays on through plain steps whose rows no draft reads (the engine sets it where
    #: the target's backend replays graphs, which a switch of capture interrupts)
    keep_capture: bool

    def enable_capture(self) -> None: ...

    def set_capture(self, on: bool) -> None:
        """Whether the target's next decodes capture rows for the drafter."""

    def drop_pending(self) -> None:
        """Forget rows queued by the last sequence's final plain steps."""

    def reset(self) -> None:
        """Forget every context row (a sequence starts at position 0)."""

    def trim(self, n_keep: int, next_query: int) -> None:
        """Keep what the context holds of the first ``n_keep`` positions for a draft at
        ``next_query``; rows it lacks are skipped (the target's cache is never recomputed)."""

    def truncate(self, n_keep: int) -> None:
        """Drop context positions >= n_keep."""

    def captured_features(self) -> np.ndarray:
        """The rows the target captured in its last decode, fused [T, n_layers * H]."""

    def queue_visible(self, features: np.ndarray, start_pos: int, next_query: int) -> None:
        """Context rows for positions start_pos.., read at the next ``catch_up``; those no query
        at or after ``next_query`` can see are skipped."""

    def plain_step_begins(self, plain_rounds_ahead: int) -> None: ...

    def plain_step_ends(self) -> None: ...

    def unread_steps(self, plain_rounds_ahead: int) -> int:
        """How many plain steps after this one (``plain_rounds_ahead`` promised after it) read
        no row: they may run unwrapped and be told with ``skip_pending``."""

    def skip_pending(self, extra: int) -> None:
        """Drop the queued rows and ``extra`` more unread ones (plain steps that ran unwrapped)."""

    def catch_up(self, next_query: int) -> bool:
        """Inject the queued rows of the plain steps before a draft; whether there were any."""

    def draft(self, bonus: int, n_draft: int) -> list[int]:
        """``n_draft`` proposed tokens after ``bonus`` (greedy over the drafter's logits)."""

    def draft_logits(self, bonus: int, n_draft: int) -> np.ndarray:
        """The logits [n_draft, n_vocab] ``draft`` takes its argmax of (a constrained round
        picks each row's best allowed token instead)."""

    def inject_captured(self, n: int, start_pos: int) -> None:
        """The first ``n`` rows of the target's last decode (bonus + accepted drafts) as
        context rows for positions start_pos.."""

    def close(self) -> None: ...
