"""The sliding-window cache's layout does not depend on history (patch 0006).

A speculative round writes drafts and removes the rejected ones; a prompt cache truncates the
last reply and prefills a new turn. Afterwards every next-token logit must be bit for bit what a
context that only ever appended the same tokens computes: the CPU kernels sum attention in cell
order, so a ring laid out differently changes the last bits and flips greedy near-ties."""

from __future__ import annotations

import numpy as np
import pytest

from laguna_dflash.runtime.llama import Context, ContextParams, Model

N_UBATCH = 64  # the window ring holds window + ubatch cells, padded: small, so it wraps often


@pytest.fixture(scope="module")
def target(tiny_target):
    with Model(tiny_target["gguf"]) as m:
        yield m


def context(target) -> Context:
    return Context(target, ContextParams(n_ctx=1024, n_batch=N_UBATCH, n_ubatch=N_UBATCH, kv_type="f32", n_threads=1))


def tokens(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(16, 512, size=n)]


def test_logits_after_rollbacks_and_truncation_equal_an_append_only_run(target):
    text = tokens(700, 1)
    prompt, rest = text[:150], text[150:]

    fresh = context(target)
    for p0 in range(0, len(prompt), N_UBATCH):
        fresh.decode_block(prompt[p0:p0 + N_UBATCH], p0)
    want = []
    for i, t in enumerate(rest):
        fresh.step(t, len(prompt) + i)
        want.append(fresh.logits_row(0).copy())

    rng = np.random.default_rng(2)
    spec = context(target)
    for p0 in range(0, len(prompt), N_UBATCH):
        spec.decode_block(prompt[p0:p0 + N_UBATCH], p0)
    got, i = [], 0
    while i < len(rest):
        if i == 300:  # a new turn: the cache drops the last 40 tokens and prefills them again
            back = 40
            spec.seq_rm(len(prompt) + i - back)
            spec.decode_block(rest[i - back:i], len(prompt) + i - back)
        depth = int(rng.integers(1, 8))
        accepted = int(rng.integers(0, depth + 1))
        drafts = [int(t) for t in rng.integers(16, 512, size=depth)]  # wrong guesses, mostly
        block = [rest[i], *rest[i + 1:i + 1 + accepted], *drafts[accepted:]][:depth + 1]
        pos0 = len(prompt) + i
        spec.decode_block(block, pos0)
        kept = min(accepted + 1, len(rest) - i)
        rows = spec.logits_block(len(block))
        got.extend(rows[k].copy() for k in range(kept))
        spec.seq_rm(pos0 + kept)
        i += kept
    assert len(got) == len(want)
    differing = [k for k in range(len(want)) if not np.array_equal(got[k], want[k])]
    assert differing == [], f"{len(differing)} of {len(want)} steps differ, first at {differing[:5]}"
