"""The engine's fast paths give what the general calls give: a one-row step and a verify block
decode like ``decode``, block logits are the rows' logits, captured rows gathered straight into
the drafter's batch inject like the copied features, the one-argmax greedy accept agrees with
sampling row by row, and the microbatch chosen for a sliding window keeps output exact."""

from __future__ import annotations

import numpy as np
import pytest

from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions
from laguna_dflash.runtime.llama import Context, ContextParams, LlamaError, Model, microbatch_for_window
from laguna_dflash.runtime.sampling import Sampler, SamplingParams

from test_engine import PROMPT, make_drafter


@pytest.fixture(scope="module")
def target(tiny_target):
    with Model(tiny_target["gguf"]) as m:
        yield m


@pytest.fixture(scope="module")
def drafter_gguf(tmp_path_factory, tiny_target):
    return make_drafter(tmp_path_factory.mktemp("host"), "d", tiny_target["gguf"])


def ctx_for(model):
    return Context(model, ContextParams(n_ctx=512, n_batch=64, n_ubatch=64, kv_type="f32"))


def test_step_and_decode_block_give_the_logits_of_decode(target):
    tokens = PROMPT[:20]
    with ctx_for(target) as a, ctx_for(target) as b:
        for c in (a, b):
            c.decode(tokens, np.arange(len(tokens)), logits="last")
        a.decode([7], [20], logits="last")
        b.step(7, 20)
        assert np.array_equal(a.logits_row(0), b.logits_row(0))
        block = [5, 9, 11, 13]
        a.decode(block, np.arange(21, 25), logits="all")
        b.decode_block(block, 21)
        rows = b.logits_block(len(block))
        assert rows.shape == (4, target.n_vocab)
        for i in range(4):
            assert np.array_equal(a.logits_row(i), rows[i])
            assert np.array_equal(b.logits_view(i), rows[i])
        assert np.array_equal(b.logits_block(2, first=2), rows[2:])


def test_fast_paths_refuse_what_decode_refuses(target):
    with ctx_for(target) as c:
        with pytest.raises(LlamaError, match="token id out of range"):
            c.step(target.n_vocab, 0)
        with pytest.raises(LlamaError, match="token id out of range"):
            c.decode_block([1, -1], 0)
        with pytest.raises(LlamaError, match="context size"):
            c.step(1, 512)
        with pytest.raises(LlamaError, match="context size"):
            c.decode_block([1, 2], 511)
        with pytest.raises(LlamaError, match="outside 1..64"):
            c.decode_block([1] * 65, 0)
        with pytest.raises(LlamaError, match="expected >= 0"):
            c.decode([1], [-1])


def test_gathered_injection_equals_copied_features(target, drafter_gguf):
    """inject_captured (target capture buffers -> drafter batch, no copy in between) leaves the
    drafter in the state inject(captured_features()) does: the same next draft logits."""
    from laguna_dflash.runtime.drafter import Drafter

    tokens = PROMPT[:30]
    drafts = []
    for gathered in (False, True):
        with ctx_for(target) as t:
            d = Drafter(drafter_gguf, t, kv_type="f32")
            d.enable_capture()
            t.decode(tokens[:25], np.arange(25), logits="last")
            d.inject(d.captured_features(), 0)
            t.decode_block(tokens[25:30], 25)
            assert np.array_equal(t.capture_view(d.capture_slots[0], 3), t.capture(d.capture_slots[0])[:3])
            if gathered:
                d.inject_captured(3, 25)
            else:
                d.inject(d.captured_features(slice(0, 3)), 25)
            assert d.n_context == 28
            drafts.append(d.draft_logits(int(tokens[27]), 4))
            d.close()
    assert np.array_equal(drafts[0], drafts[1])


def test_queued_plain_step_rows_are_the_captured_rows(target, drafter_gguf):
    from laguna_dflash.runtime.drafter import Drafter

    with ctx_for(target) as t:
        d = Drafter(drafter_gguf, t, kv_type="f32")
        d.enable_capture()
        t.decode(PROMPT[:10], np.arange(10), logits="last")
        rows = []
        for i in range(20):  # past the pending buffer's first size, so it grows
            t.step(int(PROMPT[10 + i]), 10 + i)
            rows.append(d.captured_features())
            d.queue_row()
        assert d.n_pending == 20
        assert np.array_equal(d._rows[:20], np.concatenate(rows))
        # a prompt's rows queue before any plain step's, so a catch-up reads them in order
        with pytest.raises(LlamaError, match="before any plain step"):
            d.queue_visible(rows[0], 30, 31)
        d.close()


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(repeat_penalty=1.3, repeat_last_n=8),
                                    SamplingParams(temperature=0.9, seed=3)])
def test_accept_agrees_with_sampling_row_by_row(params):
    """Drafts are what a same-seeded sampler picks row by row, one of them changed (or none):
    accept stops at the changed one and returns the sampler's own pick there."""
    rng = np.random.default_rng(0)
    history = [int(t) for t in rng.integers(0, 50, size=12)]
    for trial in range(30):
        logits = rng.normal(size=(5, 50)).astype(np.float32)
        probe = Sampler(params)
        picks = []
        for i in range(5):
            picks.append(probe.sample(logits[i], history + picks if probe.history_len else ()))
        wrong = trial % 5  # 4: no draft is wrong, all four are accepted
        drafts = picks[:4]
        if wrong < 4:
            drafts[wrong] = (drafts[wrong] + 1) % 50
        assert Sampler(params).accept(logits, drafts, history) == (wrong, picks[wrong])


def test_microbatch_keeps_the_window_cache_smallest():
    assert microbatch_for_window(128, 512) == 128  # 128 + 128 = 256 cells, as for 64 rows
    assert microbatch_for_window(512, 512) == 256  # 768 cells
    assert microbatch_for_window(32, 512) == 224
    assert microbatch_for_window(0, 512) == 512  # no window: the whole batch
    assert microbatch_for_window(128, 100) == 100
    assert microbatch_for_window(128, 32) == 32
    assert microbatch_for_window(128, 512, floor=200) == 384  # 128 + 200 -> 512 cells


def test_default_microbatch_is_exact_and_fits_the_window(target, drafter_gguf):
    with Engine(target, drafter_gguf, EngineConfig(n_ctx=1024, kv_type="f32")) as eng:
        assert eng.ctx.params.n_ubatch == microbatch_for_window(32, 512)
        plain = eng.generate(PROMPT, GenerateOptions(n_predict=40, n_max=0))
        for depth in (1, 4, 15):
            assert eng.generate(PROMPT, GenerateOptions(n_predict=40, n_max=depth)).tokens == plain.tokens
    with Engine(target, drafter_gguf, EngineConfig(n_ctx=1024, kv_type="f32", n_ubatch=512)) as eng:
        assert eng.generate(PROMPT, GenerateOptions(n_predict=40, n_max=0)).tokens == plain.tokens
