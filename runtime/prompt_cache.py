"""The prompt cache: an engine's KV caches keep the last sequence, and a new prompt is prefilled
only after the longest token prefix it shares with it (a chat's next turn re-reads only the new
messages; llama-server's rule for sliding-window layers)."""

from __future__ import annotations

import numpy as np

from .llama import Context
from .proposer import Proposer


class PromptCache:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.tokens: list[int] = []  # the tokens whose rows the caches hold

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

    def reuse(self, prompt_tokens: list[int], ctx: Context, window: int, proposer: Proposer | None,
              drafting: bool) -> int:
        """Trim the caches to the longest prefix of the prompt that they can reuse and return
        the position prefill starts from (0: the caller clears them)."""
        # the last prompt token is always decoded: its logits give the first new token
        n_keep = min(self.shared_prefix(prompt_tokens), len(prompt_tokens) - 1)
        self.tokens = []  # until this sequence completes, the caches hold no finished one
        if n_keep > 0 and window > 0:
            # the target's sliding-window layers keep only the cells of a recent window; the
            # first new query must see the positions after n_keep - window (llama-server's rule)
            lo = ctx.pos_min()
            if lo < 0 or lo > max(0, n_keep - window):
                n_keep = 0
        if n_keep > 0 and proposer is not None:
            if drafting:  # the first draft reads the rows of its window that the drafter holds
                proposer.trim(n_keep, len(prompt_tokens))
            else:  # a plain run: keep the drafter's rows of the shared prefix valid
                proposer.truncate(n_keep)
        if n_keep > 0:
            ctx.seq_rm(n_keep, -1)
        return n_keep

    def remember(self, sequence: list[int], n_rows: int) -> None:
        """The sequence just generated, of which the target holds the first ``n_rows`` rows (an
        accepted draft after a stop is left out: recomputed if needed)."""
        if self.enabled:
            self.tokens = sequence[:min(len(sequence), n_rows)]
