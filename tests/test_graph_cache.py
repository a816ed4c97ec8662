"""Graphs kept by batch shape (patch 0038): a CPU context that alternates batch shapes reuses the
graphs it built for them and computes, bit for bit, what a context that rebuilds every graph
computes.

The reference context is made with llama.cpp's LLAMA_GRAPH_REUSE_DISABLE, so every one of its
decodes builds its graph afresh. The scripts change shape as the engines do: verify blocks of
several rows between one-row steps with rows removed from the cache after them, capture switched
on and off, and passes over several sequences of one context beside passes over one of them.
"""

from __future__ import annotations

import os

import llama_cpp
import numpy as np
import pytest

from laguna_dflash.runtime.llama import Context, ContextParams, Model


@pytest.fixture(scope="module")
def target(tiny_target):
    with Model(tiny_target["gguf"]) as m:
        yield m


def graphs_reused(ctx: Context) -> int:
    data = llama_cpp.llama_perf_context(ctx.ptr)
    return data.n_reused


def context(model: Model, rebuild_every_graph: bool, n_seq: int = 1) -> Context:
    key = "LLAMA_GRAPH_REUSE_DISABLE"
    old = os.environ.get(key)
    os.environ[key] = "1" if rebuild_every_graph else "0"
    try:
        return Context(model, ContextParams(n_ctx=512 * n_seq, n_batch=64, n_ubatch=64, kv_type="f32", n_seq=n_seq))
    finally:
        if old is None:
            del os.environ[key]
        else:
            os.environ[key] = old


def one_sequence_script(ctx: Context, prompt: list[int], capture_slot: int) -> list[np.ndarray]:
    """Verify blocks of 5 and 3 rows (two kept, the rest removed) between one-row steps, capture on
    for some stretches: every pass's logits (and captured rows while capture is on)."""
    out = []
    ctx.decode(prompt, np.arange(len(prompt)), logits="last")
    out.append(ctx.logits_row(len(prompt) - 1).copy())
    pos = len(prompt)
    for cycle in range(6):
        ctx.set_capture(capture_slot, cycle % 3 == 1)
        for kind in ("v5", "p", "p", "v3", "p", "v5", "p"):
            rows = {"v5": 5, "v3": 3, "p": 1}[kind]
            tokens = [(7 * pos + 3 * i) % 200 + 10 for i in range(rows)]
            ctx.decode(tokens, np.arange(pos, pos + rows), logits="all")
            out.append(ctx.logits_rows(range(rows)).copy())
            if cycle % 3 == 1:
                out.append(ctx.capture(capture_slot))
            keep = min(rows, 2)
            if keep < rows:
                ctx.seq_rm(pos + keep, -1)
            pos += keep
    return out


def test_alternating_shapes_reuse_kept_graphs_and_match_rebuilt_ones(target, tiny_target):
    prompt = list(range(20, 60))
    slot = target.n_layer // 2
    with context(target, rebuild_every_graph=True) as ref_ctx:
        reference = one_sequence_script(ref_ctx, prompt, slot)
        assert graphs_reused(ref_ctx) == 0
    with context(target, rebuild_every_graph=False) as ctx:
        kept = one_sequence_script(ctx, prompt, slot)
        reused = graphs_reused(ctx)
    assert len(kept) == len(reference)
    for i, (a, b) in enumerate(zip(kept, reference)):
        assert np.array_equal(a, b), f"pass {i}: max |kept - rebuilt| = {np.abs(a - b).max()}"
    # 43 decodes: the prompt, then six cycles of seven passes in three shapes, capture on in two
    # of them (six graphs in all, for four slots). Upstream's single previous graph was reused 6
    # times (the build through patch 0037), the kept graphs 27 times.
    assert reused >= 24, reused


def test_passes_over_several_sequences_match_rebuilt_ones(target):
    """The batched engine's passes: both sequences' verify rows, then one sequence's step while the
    other waits, in turn."""

    def script(ctx: Context) -> list[np.ndarray]:
        out, pos = [], [0, 0]
        for seq in (0, 1):
            prompt = [(13 * seq + i) % 90 + 5 for i in range(24)]
            ctx.decode_seqs([(seq, prompt, 0, len(prompt) - 1)])
            pos[seq] = len(prompt)
        for turn in range(8):
            parts = [(0, [11 + turn, 12, 13], pos[0], 0), (1, [21 + turn, 22, 23], pos[1], 0)]
            if turn % 2:
                parts = [(turn % 2, [31 + turn], pos[turn % 2], 0)]
            firsts = ctx.decode_seqs(parts)
            for (seq, tokens, _, _), first in zip(parts, firsts):
                out.append(ctx.logits_rows(range(first, first + len(tokens))).copy())
                ctx.seq_rm(pos[seq] + 1, -1, seq=seq)
                pos[seq] += 1
        return out

    with context(target, rebuild_every_graph=True, n_seq=2) as ref_ctx:
        reference = script(ref_ctx)
    with context(target, rebuild_every_graph=False, n_seq=2) as ctx:
        kept = script(ctx)
        reused = graphs_reused(ctx)
    for i, (a, b) in enumerate(zip(kept, reference)):
        assert np.array_equal(a, b), f"pass {i}: max |kept - rebuilt| = {np.abs(a - b).max()}"
    # the two shapes alternate: upstream reused no graph, the kept ones serve every pass after the
    # first of each shape
    assert reused >= 5, reused
