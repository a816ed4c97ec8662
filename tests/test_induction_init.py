"""The agent pair's stage-1 target starts with an induction circuit written into its weights
(scripts/training/induction_init.py): before any training it continues repeated random
sequences of word tokens, which the same model without the circuit cannot do."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from training import copy_curriculum, demo_pair, induction_init  # noqa: E402

from laguna_dflash.runtime import assets  # noqa: E402


def stage1_target(with_circuit: bool):
    torch.manual_seed(0)
    model = transformers.LagunaForCausalLM(transformers.LagunaConfig(**demo_pair.target_config(8))).float().eval()
    if with_circuit:
        induction_init.install(model, seed=0)
    return model


def repeated_sequences():
    """Random word-token runs of 4-40 tokens, each followed by itself."""
    tok = transformers.AutoTokenizer.from_pretrained(assets.AGENT_DIR / "tokenizer")
    ids = np.asarray(tok.convert_tokens_to_ids(copy_curriculum.word_tokens(tok, 0)))
    return copy_curriculum.repeated_runs(ids, np.random.default_rng(3), 8, 192, longest=40)


def test_a_target_with_the_circuit_continues_repeats_before_training_and_one_without_does_not():
    x, labels = repeated_sequences()
    with_circuit = copy_curriculum.accuracy(stage1_target(True), x, labels)
    without = copy_curriculum.accuracy(stage1_target(False), x, labels)
    assert with_circuit >= 0.9, with_circuit
    assert without <= 0.05, without


def test_the_previous_token_heads_score_one_position_back_highest_across_the_window():
    cfg = transformers.LagunaConfig(**demo_pair.target_config(8))
    rope = cfg.rope_parameters["sliding_attention"]
    theta = rope["rope_theta"] ** (-np.arange(0, cfg.head_dim, 2) / cfg.head_dim)
    w = induction_init.offset_weights(theta, cfg.sliding_window)
    offsets = np.arange(cfg.sliding_window + 1)
    score = np.cos(np.outer(offsets - 1, theta)) @ w
    assert np.isclose(w.sum(), 1) and (w >= 0).all()
    assert score.argmax() == 1
    assert score[1] - np.delete(score, 1).max() > 0.2
