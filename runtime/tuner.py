"""Draft-depth policies: how many tokens to draft in the next round.

The engine asks ``choose()`` before each round and reports back with ``observe(depth,
accepted, t_draft, t_verify)``; depth 0 is a plain decoding step.
"""

from __future__ import annotations


class DepthPolicy:
    def choose(self) -> int:
        raise NotImplementedError

    def observe(self, depth: int, accepted: int, t_draft: float, t_verify: float) -> None:
        pass

    def describe(self) -> dict:
        return {}


class FixedDepth(DepthPolicy):
    def __init__(self, depth: int) -> None:
        self.depth = depth

    def choose(self) -> int:
        return self.depth

    def describe(self) -> dict:
        return {"policy": "fixed", "depth": self.depth}
