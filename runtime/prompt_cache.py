"""The prompt cache: an engine's KV caches keep the last sequence, and a new prompt is prefilled
only after the longest token prefix it shares with it (a chat's next turn re-reads only the new
messages; llama-server's rule for sliding-window layers).

A target whose sliding-window layers keep a ring of cells (the last window, not every position)
loses the cells of a shared prefix's last window once the sequence runs a ring past it: a prompt
that departs from the cached sequence there (a chat's last reply rendered back otherwise than it
was generated) would be prefilled from 0. Context checkpoints, as llama-server's: a copy of the
last window's cells taken at the end of each prompt's prefill; such a prompt restarts from the
newest one taken on a prefix it shares with the cached sequence, and the full-attention layers,
which keep every position, are trimmed to that prefix."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from .llama import Context
from .params import SERVER
from .proposer import Proposer

#: checkpoints a prompt cache keeps (llama-server's --ctx-checkpoints default too)
DEFAULT_CHECKPOINTS = SERVER["ctx_checkpoints"].default


def first_seen(query: int, window: int) -> int:
    """The first position a query at ``query`` sees through a sliding window of ``window``
    (llama.cpp's standard window: a key at p is visible while query - p < window)."""
    return max(0, query - window + 1)


@dataclass
class Checkpoint:
    """The sliding-window cells of positions [pos_min, len(tokens)) after ``tokens`` were
    decoded: valid only for a sequence that starts with these tokens. It holds the cells a query
    at the last prompt token's position sees, so a checkpoint of a sequence longer than the window
    restarts a prompt that keeps all its tokens, the same prompt again among them (whose last
    token is decoded again for its logits)."""

    tokens: np.ndarray
    pos_min: int
    data: ctypes.Array

    @property
    def n(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        return len(self.data)


class PromptCache:
    def __init__(self, enabled: bool, checkpoints: int = DEFAULT_CHECKPOINTS) -> None:
        self.enabled = enabled
        self.max_checkpoints = checkpoints if enabled else 0
        self.tokens: list[int] = []  # the tokens whose rows the caches hold
        # oldest first; each taken on a prefix of the sequence the caches hold (reuse drops the
        # others), and checked against the new prompt's tokens again before it is restored
        self.checkpoints: list[Checkpoint] = []
        self.restored = False  # whether the last reuse restarted from a checkpoint

    def shared_prefix(self, tokens) -> int:
        """How many leading ``tokens`` the caches hold from the last sequence (0 when off). It
        reads a snapshot: a running generation has emptied it until it ends."""
        cached = self.tokens
        if not self.enabled:
            return 0
        n = min(len(cached), len(tokens))
        if n == 0:
            return 0
        diff = np.flatnonzero(np.asarray(cached[:n]) != np.asarray(list(tokens[:n])))
        return int(diff[0]) if len(diff) else n

    def forget(self) -> None:
        self.tokens = []
        self.checkpoints = []

    @property
    def checkpoint_bytes(self) -> int:
        return sum(c.nbytes for c in self.checkpoints)

    def reuse(self, prompt_tokens: list[int], ctx: Context, window: int, proposer: Proposer | None,
              drafting: bool) -> int:
        """Trim the caches to the longest prefix of the prompt that they can reuse and return
        the position prefill starts from (0: the caller clears them)."""
        # the last prompt token is always decoded: its logits give the first new token
        n_keep = min(self.shared_prefix(prompt_tokens), len(prompt_tokens) - 1)
        self.tokens = []  # until this sequence completes, the caches hold no finished one
        self.restored = False
        if n_keep > 0 and window > 0:
            # the target's sliding-window layers keep only the cells of a recent window, which
            # must hold every position the first new query (at n_keep) sees
            lo = ctx.pos_min()
            if lo < 0:
                n_keep = 0
            elif lo > first_seen(n_keep, window):
                n_keep = self._restore(prompt_tokens, n_keep, ctx, window)
                self.restored = n_keep > 0
        # a checkpoint past the kept prefix holds cells of tokens this sequence replaces
        self.checkpoints = [c for c in self.checkpoints if c.n <= n_keep]
        if n_keep > 0 and proposer is not None:
            if drafting:  # the first draft reads the rows of its window that the drafter holds
                proposer.trim(n_keep, len(prompt_tokens))
            else:  # a plain run: keep the drafter's rows of the shared prefix valid
                proposer.truncate(n_keep)
        if n_keep > 0:
            ctx.seq_rm(n_keep, -1)
        return n_keep

    def _restore(self, prompt_tokens: list[int], n_keep: int, ctx: Context, window: int) -> int:
        """Put back the checkpoint that keeps the most of the first ``n_keep`` tokens with the
        window before its end; how many it keeps (0: none could, the sliding-window cells may
        be gone)."""
        prompt = np.asarray(prompt_tokens[:n_keep])
        best, best_n = None, 0
        for c in self.checkpoints:
            n = min(n_keep, c.n)
            if n > best_n and c.pos_min <= first_seen(n, window) and np.array_equal(c.tokens[:n], prompt[:n]):
                best, best_n = c, n
        if best is None or not ctx.restore_window(best.data):
            return 0
        if not 0 <= ctx.pos_min() <= first_seen(best_n, window):  # the cells it restored, not those predicted
            return 0
        # the full-attention layers hold the first n_keep positions of this prompt: the caller's
        # seq_rm cuts them, and the restored cells past best_n, to best_n
        return best_n

    def checkpoint(self, prompt_tokens: list[int], ctx: Context, window: int) -> None:
        """After the prompt's prefill: keep a copy of the sliding-window cells when they are a
        ring (a cache that keeps every cell needs none), the oldest copy dropped past the limit."""
        if not self.max_checkpoints or window <= 0 or ctx.params.swa_full:
            return
        if ctx.pos_max() + 1 != len(prompt_tokens):
            return
        data = ctx.save_window()
        if data is None:
            return
        # what the copy is good for: the cells a query at the last prompt token sees (_restore
        # checks what it restored)
        pos_min = max(ctx.pos_min(), first_seen(len(prompt_tokens) - 1, window))
        self.checkpoints.append(Checkpoint(np.asarray(prompt_tokens, dtype=np.int32), pos_min, data))
        del self.checkpoints[:-self.max_checkpoints]

    def remember(self, sequence: list[int], n_rows: int) -> None:
        """The sequence just generated, of which the target holds the first ``n_rows`` rows (an
        accepted draft after a stop is left out: recomputed if needed)."""
        if self.enabled:
            self.tokens = sequence[:min(len(sequence), n_rows)]
