"""Token sampling on logit rows: greedy, or llama.cpp's chain (penalties, top-k, top-p, min-p,
temperature) with a seeded generator.

Speculative sampling here is *sample-and-compare*: every verify row is sampled with the same
sampler as plain decoding, given the same prefix, and a draft is accepted only while the sample
equals it. Each emitted token is therefore drawn from the target's own distribution, so the
output distribution is the target's whatever the drafter proposes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # <= 0: greedy
    top_k: int = 40  # <= 0: off
    top_p: float = 0.95  # >= 1: off
    min_p: float = 0.05  # <= 0: off
    repeat_penalty: float = 1.0  # 1: off
    repeat_last_n: int = 64  # -1: the whole history, 0: off
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def validate(self) -> None:
        if self.top_p <= 0:
            raise ValueError(f"top_p: expected > 0, found {self.top_p}")
        if self.repeat_penalty <= 0:
            raise ValueError(f"repeat_penalty: expected > 0, found {self.repeat_penalty}")


class Sampler:
    def __init__(self, params: SamplingParams) -> None:
        params.validate()
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        #: how many previous tokens ``sample`` looks at (0: it ignores history)
        penalized = params.repeat_penalty != 1.0 and params.repeat_last_n != 0
        self.history_len = (params.repeat_last_n if params.repeat_last_n > 0 else 1 << 30) if penalized else 0

    def _penalize(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        p = self.params
        if not self.history_len or not len(history):
            return logits
        recent = np.unique(np.asarray(list(history)[-self.history_len:], dtype=np.int64))
        out = logits.copy()
        vals = out[recent]
        out[recent] = np.where(vals > 0, vals / p.repeat_penalty, vals * p.repeat_penalty)
        return out

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """One token from a row of logits; history is every token before it (for penalties)."""
        p = self.params
        if p.greedy and not self.history_len:
            return int(np.argmax(logits))  # the hot path: no copy, no widening
        logits = self._penalize(np.asarray(logits, dtype=np.float64), history)
        if p.greedy:
            return int(np.argmax(logits))
        # candidates in descending order, as llama.cpp's chain sees them
        order = np.argsort(-logits, kind="stable")
        if p.top_k > 0:
            order = order[:p.top_k]
        cand = logits[order]
        probs = np.exp(cand - cand[0])
        probs /= probs.sum()
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
            order, cand, probs = order[:keep], cand[:keep], probs[:keep]
        if p.min_p > 0.0:
            keep = probs >= p.min_p * probs[0]
            order, cand = order[keep], cand[keep]
        scaled = (cand - cand[0]) / p.temperature
        probs = np.exp(scaled)
        probs /= probs.sum()
        return int(order[self.rng.choice(len(order), p=probs)])
