"""The patched Laguna target: logits against transformers, and complete hidden-state capture.

Tolerances: with an F32 KV cache llama.cpp and transformers differ only by summation order,
about 1e-5 on logits of magnitude ~5 (SPEC §6); we allow 1e-4 absolute. Capture is compared
bit-for-bit wherever the same kernels run on the same rows (different n_ubatch splits, capture
on or off), since any difference there would be a bookkeeping bug, not rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from laguna_dflash.runtime.llama import Context, ContextParams, LlamaError, Model

LOGIT_TOL = 1e-4
RESIDUAL_TOL = 1e-4


@pytest.fixture(scope="module")
def target(tiny_target):
    with Model(tiny_target["gguf"]) as m:
        yield m


@pytest.fixture(scope="module")
def reference(tiny_target):
    return dict(np.load(tiny_target["reference"]))


def prefill(model, tokens, n_ubatch=512, n_batch=512, slots=(), logits="all"):
    """Decode tokens in chunks of n_batch; return logits of every row and captured rows per slot."""
    params = ContextParams(n_ctx=512, n_batch=n_batch, n_ubatch=n_ubatch, kv_type="f32")
    with Context(model, params) as ctx:
        for s in slots:
            ctx.set_capture(s)
        lg, caps = [], {s: [] for s in slots}
        for i0 in range(0, len(tokens), n_batch):
            chunk = tokens[i0:i0 + n_batch]
            ctx.decode(chunk, np.arange(i0, i0 + len(chunk)), logits=logits)
            if logits == "all":
                lg.append(ctx.logits_rows(range(len(chunk))))
            for s in slots:
                caps[s].append(ctx.capture(s))
        return (np.concatenate(lg) if lg else None), {s: np.concatenate(v) for s, v in caps.items()}


def test_logits_match_transformers(target, reference):
    logits, _ = prefill(target, reference["tokens"])
    assert logits.shape == reference["logits"].shape
    err = np.abs(logits - reference["logits"]).max()
    assert err < LOGIT_TOL, f"max |llama.cpp - transformers| = {err}"
    assert (logits.argmax(-1) == reference["logits"].argmax(-1)).all()


def test_capture_matches_reference_residual_stream(target, reference):
    n_layer = target.n_layer
    # slot s is the input of layer s = the stream after HF layer s-1; slot n_layer is after the last layer
    slots = (1, n_layer // 2, n_layer)
    _, caps = prefill(target, reference["tokens"], slots=slots, logits="last")
    for s in slots:
        rows = caps[s]
        assert rows.shape == (len(reference["tokens"]), target.n_embd), s
        err = np.abs(rows - reference["residuals"][s - 1]).max()
        assert err < RESIDUAL_TOL, f"slot {s}: max error {err}"


def test_capture_every_row_of_final_layer_even_when_only_last_logit_requested(target, reference):
    _, caps = prefill(target, reference["tokens"], slots=(target.n_layer,), logits="last")
    rows = caps[target.n_layer]
    # the rows must differ from each other: a broken reduction would repeat or zero them
    assert np.abs(rows[:-1] - reference["residuals"][-1][:-1]).max() < RESIDUAL_TOL
    assert np.abs(rows).sum(axis=1).min() > 0


@pytest.mark.parametrize("n_ubatch", [7, 64])
def test_capture_is_identical_for_any_ubatch_split(target, reference, n_ubatch):
    slots = tuple(range(target.n_layer + 1))
    base_logits, base = prefill(target, reference["tokens"], n_ubatch=512, slots=slots)
    logits, caps = prefill(target, reference["tokens"], n_ubatch=n_ubatch, slots=slots)
    for s in slots:
        assert caps[s].shape == base[s].shape == (len(reference["tokens"]), target.n_embd)
        np.testing.assert_array_equal(caps[s], base[s], err_msg=f"slot {s}, n_ubatch {n_ubatch}")
    np.testing.assert_array_equal(logits, base_logits)


def test_capture_across_n_batch_chunks_equals_one_decode(target, reference):
    slots = (1, target.n_layer)
    _, whole = prefill(target, reference["tokens"], slots=slots)
    _, chunked = prefill(target, reference["tokens"], n_batch=32, n_ubatch=16, slots=slots)
    for s in slots:
        np.testing.assert_allclose(chunked[s], whole[s], atol=RESIDUAL_TOL, rtol=0)


def test_logits_identical_with_capture_on_and_off(target, reference):
    off, _ = prefill(target, reference["tokens"])
    on, _ = prefill(target, reference["tokens"], slots=tuple(range(target.n_layer + 1)))
    np.testing.assert_array_equal(on, off)


def test_capture_misuse_raises_instead_of_aborting(target):
    with Context(target, ContextParams(n_ctx=64, n_batch=16, n_ubatch=16)) as ctx:
        with pytest.raises(LlamaError, match="out of range"):
            ctx.set_capture(target.n_layer + 1)
        with pytest.raises(LlamaError, match="not enabled"):
            ctx.capture(1)
        ctx.set_capture(1)
        with pytest.raises(LlamaError, match="no data"):
            ctx.capture(1)
        with pytest.raises(LlamaError, match="exceeds n_batch"):
            ctx.decode(list(range(17)), np.arange(17))
        with pytest.raises(LlamaError, match="token id out of range"):
            ctx.decode([target.n_vocab], [0])
    with pytest.raises(LlamaError, match="not a GGUF"):
        Model(__file__)


def test_capture_switched_between_one_row_steps_is_fresh(target, reference):
    """One-row decodes reuse their graph; switching capture on must not reuse the graph built
    without it (patch 0005 compares the capture flags instead of forcing a scheduler reserve):
    every row captured after a switch equals the row of a context that captured throughout."""
    tokens = [int(t) for t in reference["tokens"]]
    slots = (2, target.n_layer)
    _, always = prefill(target, tokens, n_batch=1, n_ubatch=1, slots=slots, logits="last")
    params = ContextParams(n_ctx=512, n_batch=16, n_ubatch=16, kv_type="f32")
    with Context(target, params) as ctx:
        switched = {s: {} for s in slots}
        for i, tok in enumerate(tokens):
            on = (i // 3) % 2 == 1  # three steps off, three on, ...
            if i % 3 == 0:
                for s in slots:
                    ctx.set_capture(s, on)
            ctx.decode([tok], [i])
            if on:
                for s in slots:
                    switched[s][i] = ctx.capture(s)[0]
    assert len(switched[slots[0]]) >= 3
    for s in slots:
        for i, row in switched[s].items():
            np.testing.assert_array_equal(row, always[s][i], err_msg=f"slot {s}, row {i}")
