"""The Laguna DFlash drafter inside llama.cpp: capture, context injection, draft blocks.

A :class:`Drafter` owns the drafter model and a context that borrows the target's embedding
and head through ``ctx_other``. The target context captures the drafter's layers; the rows it
produces are *injected* (fused features → the drafter's K/V cache at the target positions);
``draft`` runs one block ``[bonus, MASK, ...]`` and returns the logits of the proposals, then
removes the block's own K/V so only context stays cached (SPEC §3).
"""

from __future__ import annotations

import math

import numpy as np

from . import bindings
from .llama import Context, ContextParams, LlamaError, Model, microbatch_for_window
from ..convert.gguf.specs import DrafterSpec, check_pair, read_drafter, read_target

#: After a stretch of plain steps the drafter reads the rows of only the last CATCHUP_ROWS of
#: them (of its whole window, if that is smaller). Each row read costs a plain step 1-2% (the
#: target's capture, the copy), and on the tiny pair drafts after 150 plain steps were accepted
#: as often with the last 32-128 rows in context as with all 512 (docs/results/autotune-history/README.md).
CATCHUP_ROWS = 64


def fuse_features(rows_by_slot: list[np.ndarray]) -> np.ndarray:
    """Concatenate captured rows [T, H] of each target layer (in target_layer_ids order) to [T, n*H]."""
    return np.concatenate(rows_by_slot, axis=1)


def capture_horizon(window: int) -> float:
    """How many plain steps before a drafting round read their rows for a drafter of this
    sliding window: CATCHUP_ROWS at most, the window if smaller; without a window (0) every
    row stays visible, so every plain step reads its row."""
    return min(window, CATCHUP_ROWS) if window > 0 else math.inf


class Drafter:
    def __init__(self, path, target_ctx: Context, n_gpu_layers: int = 0,
                 n_batch: int = 512, kv_type: str = "f16", n_threads: int = 0,
                 spec: DrafterSpec | None = None, check_target: bool = True,
                 model: Model | None = None) -> None:
        """``model``: the drafter already loaded (several drafters over one model, e.g. the
        server's slots); it stays open when this drafter closes."""
        self.spec = spec or read_drafter(path)
        if check_target:
            check_pair(self.spec, read_target(target_ctx.model.path))
        self.target_ctx = target_ctx
        self._owns_model = model is None
        self.model = model if model is not None else Model(self.spec.path, n_gpu_layers=n_gpu_layers)
        if not bindings.lib().laguna_ext_model_is_dflash_laguna(self.model.ptr):
            raise LlamaError(f"{self.spec.path}: loaded, but not as a Laguna DFlash drafter")
        # the block (<= block_size rows) must decode as one ubatch, so the SWA cache only
        # evicts cells no later query can see (see runtime docs on rollback); within that, the
        # microbatch that keeps the window's cache smallest (a draft attends to all of it)
        n_batch = max(n_batch, self.spec.block_size)
        n_ubatch = microbatch_for_window(self.spec.sliding_window, n_batch, floor=max(64, self.spec.block_size))
        params = ContextParams(n_ctx=target_ctx.n_ctx, n_batch=n_batch, n_ubatch=n_ubatch,
                               kv_type=kv_type, n_threads=n_threads or target_ctx.n_threads)
        self.ctx = Context(self.model, params, other=target_ctx)
        self.ctx.set_causal(True)
        self._block = [self.spec.mask_token_id] * self.spec.block_size
        self.n_context = 0  # positions [0, n_context) are in the drafter's cache
        self._cache_empty = True
        self._width = len(self.spec.capture_slots) * target_ctx.model.n_embd
        # rows captured but not yet injected, in position order: a prompt's parts as the target
        # gave them (see queue_visible), then the plain steps' rows since (see queue_row)
        self._parts: list[np.ndarray] = []
        self._rows = np.empty((0, self._width), dtype=np.float32)
        self._n_rows = 0  # the plain steps' rows in _rows
        #: plain steps this close to a drafting round read their rows (see plain_step_begins)
        self.capture_horizon = capture_horizon(self.spec.sliding_window)
        self.capturing = False  # whether the target captures this drafter's layers
        # whether capture stays on through plain steps whose rows no draft reads: on a backend
        # that replays graphs (CUDA) a switch makes the next two steps run without one, each
        # several steps' time, while capturing costs a step half a percent (Engine sets it)
        self.keep_capture = False
        self._reading = True  # whether the current plain step's row is for a draft

    @property
    def n_pending(self) -> int:
        """Rows queued for the next draft: the prompt's and the plain steps'."""
        return self._n_rows + sum(len(p) for p in self._parts)

    # -- capture on the target side

    @property
    def capture_slots(self) -> list[int]:
        return self.spec.capture_slots

    def enable_capture(self) -> None:
        self.set_capture(True)

    def set_capture(self, on: bool) -> None:
        """Whether the target captures this drafter's layers; switched only on a change, since a
        switch costs the target's next decode a graph rebuild."""
        if on != self.capturing:
            for s in self.capture_slots:
                self.target_ctx.set_capture(s, on)
            self.capturing = on

    # -- catch-up: plain steps between drafting rounds

    def plain_step_begins(self, plain_rounds_ahead: int) -> None:
        """Before a plain step: its row is for a draft only if fewer than ``capture_horizon``
        plain rounds are promised after this one; the target captures it only then (each
        captured row is copied out of the graph, off the device on a GPU), or always with
        ``keep_capture``."""
        self._reading = plain_rounds_ahead < self.capture_horizon
        self.set_capture(self._reading or self.keep_capture)

    def plain_step_ends(self) -> None:
        """After a plain step: its row waits for the next draft, or is skipped for good (no
        later query sees it)."""
        if self.capturing and self._reading:
            self.queue_row()
        else:
            self.skip_pending(1)

    def unread_steps(self, plain_rounds_ahead: int) -> int:
        """How many plain steps after one with ``plain_rounds_ahead`` promised after it read no
        row either (the engine may run them without ``plain_step_begins``/``ends`` and tell
        them with :meth:`skip_pending`)."""
        if plain_rounds_ahead < self.capture_horizon:
            return 0
        return int(plain_rounds_ahead - self.capture_horizon)

    def catch_up(self, next_query: int) -> bool:
        """Before a draft: capture on again, and the queued rows (of the prompt and the plain
        steps since) injected; whether there were any (their time is the catch-up's, not the
        draft's)."""
        self.set_capture(True)
        if not self.n_pending:
            return False
        self.flush_pending(next_query)
        return True

    def captured_features(self, rows: slice | None = None) -> np.ndarray:
        """Fused features [T, n_ids * H] of the target's last decode (optionally a row slice)."""
        if rows is None and self.target_ctx.last_n_tokens == 1:
            # a plain step's single row: each slot's row is one contiguous piece of the output
            h = self.target_ctx.model.n_embd
            out = np.empty((1, len(self.capture_slots) * h), dtype=np.float32)
            flat = out.reshape(-1)
            for i, s in enumerate(self.capture_slots):
                self.target_ctx.capture_into(s, flat[i * h:(i + 1) * h].reshape(1, h))
            return out
        parts = [self.target_ctx.capture(s) for s in self.capture_slots]
        if rows is not None:
            parts = [p[rows] for p in parts]
        return fuse_features(parts)

    # -- context

    def inject_captured(self, n: int, start_pos: int) -> None:
        """Append the first n rows of the target's last decode as context rows for positions
        start_pos.., gathered from the target's capture buffers straight into the drafter's
        batch (a round's rollback: the bonus and the accepted drafts)."""
        if start_pos != self.n_context:
            raise LlamaError(f"context injection at position {start_pos}, expected {self.n_context}")
        if n > self.ctx.n_batch:
            self.inject(self.captured_features(slice(0, n)), start_pos)
            return
        h = self.target_ctx.model.n_embd
        rows = self.ctx.embd_rows(self._width, n)
        for i, s in enumerate(self.capture_slots):
            rows[:, i * h:(i + 1) * h] = self.target_ctx.capture_view(s, n)
        self.ctx.decode_embd_rows(self._width, n, start_pos)
        self._cache_empty = False
        self.n_context += n

    def queue_row(self) -> None:
        """Keep the row the target captured in its last (one-row) decode for the next
        ``flush_pending``: plain steps inject lazily, a drafting round reads them all at once."""
        if self._n_rows == len(self._rows):
            grown = np.empty((max(16, 2 * len(self._rows)), self._width), dtype=np.float32)
            grown[:self._n_rows] = self._rows[:self._n_rows]
            self._rows = grown
        h = self.target_ctx.model.n_embd
        row = self._rows[self._n_rows]
        for i, s in enumerate(self.capture_slots):
            row[i * h:(i + 1) * h] = self.target_ctx.capture_view(s, 1)[0]
        self._n_rows += 1

    def queue_visible(self, features: np.ndarray, start_pos: int, next_query: int) -> None:
        """A prompt part's rows, for positions start_pos..: those a query at ``next_query`` can
        see wait for the next draft like a plain step's row, the others are skipped. A sequence
        that stays plain past the capture horizon then never computes them (its first plain step
        there skips every queued row). The queue holds less than a window of them, each part as
        the target gave it (no copy), read later in the batch it would have been read in now; a
        drafter without a window sees every row, so it reads them now instead."""
        if start_pos != self.n_context + self.n_pending or self._n_rows:  # a prompt's rows come first
            raise LlamaError(f"queued rows at position {start_pos}, expected {self.n_context + self.n_pending}"
                             f"{' before any plain step' if self._n_rows else ''}")
        if not self.spec.sliding_window:  # nothing is queued before it: no part ever waits
            self.inject(features, start_pos)
            return
        skip = self._out_of_sight(len(features), start_pos, next_query)
        if skip:  # the queued rows come before these: out of sight too
            self.skip_pending(skip)
        if skip < len(features):
            self._parts.append(features[skip:])

    def flush_pending(self, next_query: int) -> None:
        """Inject the queued rows (those a query at next_query can see)."""
        for part in self._parts:
            self.inject_visible(part, self.n_context, next_query)
        if self._n_rows:
            self.inject_visible(self._rows[:self._n_rows], self.n_context, next_query)
        self._forget_queue()

    def _forget_queue(self) -> None:
        self._parts.clear()  # in place: a plain stretch past the horizon forgets every step
        self._n_rows = 0

    def drop_pending(self) -> None:
        """Forget the queued rows without accounting for them (a new sequence starts)."""
        self._forget_queue()

    def skip_pending(self, extra: int) -> None:
        """Drop the queued rows and ``extra`` more unread ones: no future query will see them."""
        self.skip_context(self.n_pending + extra)
        self._forget_queue()

    def inject(self, features: np.ndarray, start_pos: int) -> None:
        """Append context rows for target positions start_pos .. start_pos + T - 1."""
        if start_pos != self.n_context:
            raise LlamaError(f"context injection at position {start_pos}, expected {self.n_context}")
        n = len(features)
        self._cache_empty = self._cache_empty and n == 0
        for i0 in range(0, n, self.ctx.n_batch):
            chunk = features[i0:i0 + self.ctx.n_batch]
            self.ctx.decode_embd(chunk, np.arange(start_pos + i0, start_pos + i0 + len(chunk)))
        self.n_context += n

    def inject_visible(self, features: np.ndarray, start_pos: int, next_query: int) -> None:
        """Like inject, but rows that no query at or after ``next_query`` can see through the
        sliding window (position <= next_query - window) are skipped, not computed. Without a
        window (full attention) every row stays visible and is injected."""
        if not self.spec.sliding_window:
            self.inject(features, start_pos)
            return
        skip = self._out_of_sight(len(features), start_pos, next_query)
        if skip:
            if start_pos != self.n_context:
                raise LlamaError(f"context injection at position {start_pos}, expected {self.n_context}")
            self.skip_context(skip)
        if skip < len(features):
            self.inject(features[skip:], start_pos + skip)

    def _out_of_sight(self, n: int, start_pos: int, next_query: int) -> int:
        """How many of ``n`` rows from start_pos on no query at or after ``next_query`` sees
        through the sliding window (a leading run of them)."""
        return min(n, max(0, next_query - self.spec.sliding_window + 1 - start_pos))

    def skip_context(self, n: int) -> None:
        """Account for n context rows that no future query can see (they are never computed).
        Every row before them is out of sight too, and llama.cpp wants a sequence's positions
        without gaps, so the drafter's cache starts over after them."""
        if n > 0:
            if not self._cache_empty:  # a plain stretch skips rows one at a time: clear once
                self.ctx.clear()
                self._cache_empty = True
            self.n_context += n

    def reset(self) -> None:
        """Forget every context row (a new sequence starts at position 0)."""
        self.ctx.clear()
        self.n_context = 0
        self._forget_queue()
        self._cache_empty = True

    def trim(self, n_keep: int, next_query: int) -> None:
        """For a new sequence that shares its first ``n_keep`` positions with the cached one and
        drafts first at ``next_query``: keep the rows the cache holds of those positions when
        they cover the draft's window up to ``n_keep``, else start over after them. Rows the cache
        lacks (plain steps at the end of the last sequence read no rows, nor did its prompt if it
        never drafted; the sliding-window cache evicted older ones) are then skipped, never
        recomputed: the target re-decoding positions it already holds would rewrite their K/V in
        another batch shape, whose last bits differ, and greedy output would then depend on how
        the last sequence was drafted.
        The first drafts of such a sequence see fewer rows; later ones see every row."""
        window = self.spec.sliding_window
        need = max(0, next_query - window + 1) if window > 0 else 0  # first row the draft sees
        lo, hi = self.ctx.pos_min(), min(self.ctx.pos_max() + 1, self.n_context)
        if need < n_keep <= hi and 0 <= lo <= need:
            self.ctx.seq_rm(n_keep, -1)
            self.n_context = n_keep
            self._cache_empty = False
        else:
            self.reset()
            self.skip_context(n_keep)

    def truncate(self, n_keep: int) -> None:
        """Drop context positions >= n_keep."""
        if n_keep < self.n_context:
            self.ctx.seq_rm(n_keep, -1)
            self.n_context = n_keep

    # -- drafting

    def block_logits(self, block: list[int], first_row: int = 0) -> np.ndarray:
        """Logits of rows first_row.. of a block decoded at position n_context; the block's
        own K/V are removed afterwards, so only context stays cached."""
        if not 1 <= len(block) <= self.spec.block_size:
            raise LlamaError(f"block of {len(block)} tokens outside 1..{self.spec.block_size}")
        pos0 = self.n_context
        rows = np.zeros(len(block), dtype=bool)
        rows[first_row:] = True
        self.ctx.decode(block, np.arange(pos0, pos0 + len(block)), logits=rows)
        try:
            return self.ctx.logits_rows(range(first_row, len(block)))
        finally:
            self.ctx.seq_rm(pos0, -1)

    def draft_logits(self, bonus: int, n_draft: int) -> np.ndarray:
        """Logits [n_draft, vocab] for the block [bonus, MASK * n_draft]; row 0, which
        re-predicts the bonus, is not computed."""
        if not 1 <= n_draft <= self.spec.max_draft:
            raise LlamaError(f"n_draft {n_draft} outside 1..{self.spec.max_draft}")
        return self.block_logits([bonus] + [self.spec.mask_token_id] * n_draft, first_row=1)

    def draft(self, bonus: int, n_draft: int) -> list[int]:
        """The drafter's greedy proposals for the block [bonus, MASK * n_draft]."""
        if not 1 <= n_draft <= self.spec.max_draft:
            raise LlamaError(f"n_draft {n_draft} outside 1..{self.spec.max_draft}")
        pos0 = self.n_context
        self._block[0] = bonus
        self.ctx.decode_block(self._block[:n_draft + 1], pos0, first_output=1)
        try:
            return self.ctx.logits_block(n_draft, first=1).argmax(axis=1).tolist()
        finally:
            self.ctx.seq_rm(pos0, -1)

    def close(self) -> None:
        self.ctx.close()
        if self._owns_model:
            self.model.close()

    def __enter__(self) -> "Drafter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
