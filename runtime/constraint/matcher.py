"""Following one generation under a compiled constraint: :class:`Matcher` (masks, consuming,
rolling back, how much of a draft the grammar allows) and :class:`ConstrainedSampler`, the
engine's sampler under a constraint."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..sampling import Sampler, SamplingParams


class ConstraintFailed(RuntimeError):
    """llguidance gave up on a generation (a lexer or parser limit reached in the middle of the
    output): nothing but an end token is allowed from there, though the output is not complete.
    The server's fault, not the request's: HTTP 500 with llguidance's reason."""


class Matcher:
    """One generation's position in a compiled constraint (CompiledConstraint.matcher())."""

    def __init__(self, llg_matcher, n_vocab: int, eog: frozenset[int] = frozenset()) -> None:
        self.n_vocab = n_vocab
        self._m = llg_matcher
        self._eog = eog
        # an end token consumed where the output was complete: the generation is over (kept
        # here, since llguidance consumes no token once it has stopped)
        self._ended = False
        self._check()
        self._bits = np.zeros((self.n_vocab + 31) // 32, dtype=np.int32)
        self.n_mask = 0  # full masks computed (for the stats and the benchmark)

    def _check(self) -> None:
        if self._m.is_error():
            raise RuntimeError(f"constraint matcher: {self._m.get_error()}")

    def allowed(self) -> np.ndarray:
        """Boolean mask [n_vocab] of the tokens the grammar allows next (end tokens only where
        the output is complete; nothing after an end token)."""
        if self._ended:
            return np.zeros(self.n_vocab, dtype=bool)
        self._m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        self.n_mask += 1
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")
        return bits[:self.n_vocab].astype(bool)

    def masked(self, logits: np.ndarray) -> np.ndarray:
        """A copy of ``logits`` with -inf at every forbidden token."""
        return np.where(self.allowed(), logits, -np.inf).astype(np.float32, copy=False)

    def admissible(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar allows from here (no mask computed, no
        state changed)."""
        if self._ended or not len(tokens):
            return 0
        toks = [int(t) for t in tokens]
        cut = next((i for i, t in enumerate(toks) if t in self._eog), len(toks))
        n = self._m.validate_tokens(toks[:cut]) if cut else 0
        if n < cut or cut == len(toks):
            return n
        # an end token: allowed where the output before it is complete (asked of the state
        # after the prefix, since llguidance refuses end tokens once it has stopped)
        k = self._m.try_consume_tokens(toks[:cut]) if cut else 0
        try:
            return n + 1 if self._m.is_accepting() else n
        finally:
            if k:
                self._m.rollback(k)

    def draft(self, logits: np.ndarray) -> list[int]:
        """The drafter's proposals under the grammar: row ``i`` of the drafter's block logits
        [k, n_vocab] read in the state after the proposals before it, its masked argmax (a mask
        only where the plain argmax is forbidden). Stops early where the grammar allows
        nothing more. No state changes."""
        drafts: list[int] = []
        try:
            for row in logits:
                tok = int(np.argmax(row))
                if not self.try_consume([tok]):
                    allowed = self.allowed()
                    if not allowed.any():
                        break
                    tok = int(np.argmax(np.where(allowed, row, -np.inf)))
                    if not self.try_consume([tok]):
                        break
                drafts.append(tok)
                if self._ended:
                    break
        finally:
            self.rollback(len(drafts))
        return drafts

    def is_allowed(self, token: int) -> bool:
        return self.admissible([token]) == 1

    def try_consume(self, tokens: Sequence[int]) -> int:
        """Consume the longest allowed prefix of ``tokens``; returns its length."""
        n = 0
        for i, t in enumerate(tokens):
            if int(t) in self._eog:
                done = self._m.try_consume_tokens([int(x) for x in tokens[n:i]]) if i > n else 0
                n += done
                if n < i or self._ended or not self._m.is_accepting():
                    return n
                self._ended = True
                return n + 1
        if n < len(tokens) and not self._ended:
            n += self._m.try_consume_tokens([int(x) for x in tokens[n:]])
        return n

    def consume(self, tokens: Sequence[int]) -> None:
        """Consume ``tokens``, every one of which must be allowed (ValueError otherwise, the
        matcher unchanged; ConstraintFailed where llguidance has given up)."""
        n = self.try_consume(tokens)
        if n != len(tokens):
            self.rollback(n)
            if self._m.is_error():
                raise ConstraintFailed(f"the output constraint failed: {self._m.get_error().splitlines()[0]}")
            raise ValueError(f"token {int(tokens[n])} is not allowed by the constraint here")

    def rollback(self, n: int) -> None:
        """Forget the last ``n`` consumed tokens."""
        if n and self._ended:
            self._ended, n = False, n - 1
        if n and not self._m.rollback(n):
            raise RuntimeError(f"constraint matcher: cannot roll back {n} tokens: {self._m.get_error()}")

    @property
    def accepting(self) -> bool:
        """The output so far is complete: end of generation is allowed here."""
        return self._m.is_accepting()

    @property
    def ended(self) -> bool:
        """An end token was consumed: nothing follows."""
        return self._ended

    @property
    def end_token(self) -> int:
        return min(self._eog) if self._eog else 0

    @property
    def stopped(self) -> bool:
        """The output is complete: nothing but an end token is allowed, or one was consumed."""
        return self._ended or self._m.is_stopped()


class ConstrainedSampler(Sampler):
    """The user's sampler on the target's logits with the forbidden tokens removed. It consumes
    every token it returns, so the engine calls ``sample`` once per emitted token and
    ``accept`` once per verify (drafts cut first with ``matcher.admissible``)."""

    def __init__(self, params: SamplingParams, matcher: Matcher) -> None:
        super().__init__(params)
        self.matcher = matcher

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        if self.matcher.ended:
            # the row after an accepted end token: generation stops at that token, this one is
            # never emitted
            return self.matcher.end_token
        if self.params.greedy and not self.history_len:
            tok = int(np.argmax(logits))
            if self.matcher.try_consume([tok]):
                return tok
        tok = super().sample(self.matcher.masked(logits), history)
        self.matcher.consume([tok])
        return tok

    def accept(self, logits: np.ndarray, drafts: list[int], history: Sequence[int] = ()) -> tuple[int, int]:
        if self.params.greedy and not self.history_len:
            # rows whose argmax equals an allowed draft need no mask: that argmax is the masked one
            choice = logits.argmax(axis=1).tolist()
            n = 0
            while n < len(drafts) and choice[n] == drafts[n]:
                n += 1
            n = self.matcher.try_consume(drafts[:n])
            return n, self.sample(logits[n])
        # one row at a time: self.sample masks each row for the state after the drafts before it
        return super().accept(logits, drafts, history)

    @property
    def finished(self) -> bool:
        return self.matcher.stopped
