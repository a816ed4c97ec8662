"""The agent pair's stage-1 target starts with an induction circuit written into its weights
(scripts/training/induction_init.py): before any training it continues repeated random
sequences of word tokens, which the same model without the circuit cannot do; matching two
tokens, it also continues them where tokens recur, which matching one cannot."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from scripts.training import copy_curriculum, demo_pair, induction_init  # noqa: E402

from laguna_dflash.runtime import assets  # noqa: E402


def stage1_target(with_circuit: bool, match: int = 1):
    torch.manual_seed(0)
    model = transformers.LagunaForCausalLM(transformers.LagunaConfig(**demo_pair.target_config(8))).float().eval()
    if with_circuit:
        induction_init.install(model, seed=0, match=match)
    return model


def repeated_sequences(alphabet: int | None = None):
    """Random word-token runs of 4-40 tokens (drawn from the first ``alphabet`` word tokens), each
    followed by itself."""
    tok = transformers.AutoTokenizer.from_pretrained(assets.AGENT_DIR / "tokenizer")
    ids = np.asarray(tok.convert_tokens_to_ids(copy_curriculum.word_tokens(tok, 0)))
    return copy_curriculum.repeated_runs(ids, np.random.default_rng(3), 8, 192, alphabet=alphabet, longest=40)


def test_a_target_with_the_circuit_continues_repeats_before_training_and_one_without_does_not():
    x, labels = repeated_sequences()
    with_circuit = copy_curriculum.accuracy(stage1_target(True), x, labels)
    without = copy_curriculum.accuracy(stage1_target(False), x, labels)
    assert with_circuit >= 0.9, with_circuit
    assert without <= 0.05, without


def test_matching_two_tokens_continues_repeats_over_a_small_alphabet_where_matching_one_cannot():
    """Over 64 word tokens a 4-40 token run repeats its tokens, so the token after one of them is
    ambiguous to a one-token match; the two-token circuit tells the occurrences apart, and over
    the whole alphabet it copies as well as the one-token circuit."""
    one, two = stage1_target(True, 1), stage1_target(True, 2)
    x, labels = repeated_sequences(alphabet=64)
    assert copy_curriculum.accuracy(two, x, labels) >= 0.85
    assert copy_curriculum.accuracy(one, x, labels) <= 0.6
    x, labels = repeated_sequences()
    assert copy_curriculum.accuracy(two, x, labels) >= 0.9


def test_the_one_token_layout_is_the_one_run_d_was_trained_from_and_a_bad_match_is_refused():
    assert induction_init.layout(1) == induction_init.Layout(slice(0, 60), (slice(60, 120),), 120)
    two = induction_init.layout(2)
    assert two.constant < demo_pair.target_config(8)["hidden_size"]
    assert two.content.stop == two.previous[0].start and two.previous[0].stop == two.previous[1].start
    with pytest.raises(ValueError, match="match"):
        induction_init.install(stage1_target(False), match=3)


@pytest.mark.parametrize("offset", [1, 2])
def test_the_previous_token_heads_score_their_offset_highest_across_the_window(offset):
    cfg = transformers.LagunaConfig(**demo_pair.target_config(8))
    rope = cfg.rope_parameters["sliding_attention"]
    theta = rope["rope_theta"] ** (-np.arange(0, cfg.head_dim, 2) / cfg.head_dim)
    w = induction_init.offset_weights(theta, cfg.sliding_window, offset)
    offsets = np.arange(cfg.sliding_window + 1)
    score = np.cos(np.outer(offsets - offset, theta)) @ w
    assert np.isclose(w.sum(), 1) and (w >= 0).all()
    assert score.argmax() == offset
    assert score[offset] - np.delete(score, offset).max() > 0.2


def test_the_installed_previous_token_heads_write_the_tokens_one_and_two_back():
    """The two-back query shares its group's keys (written at the one-back weights), so its score
    is not offset_weights' own: what the installed heads write is checked here."""
    model = stage1_target(True, 2)
    x, _ = repeated_sequences()
    with torch.no_grad():
        hidden = model(input_ids=x[:2], output_hidden_states=True).hidden_states[induction_init.PREV_LAYER + 1]
    lay = induction_init.layout(2)
    content = hidden[:, :, lay.content]
    for back, block in enumerate(lay.previous, start=1):
        written = hidden[:, back:, block]
        assert torch.nn.functional.cosine_similarity(written, content[:, :-back], dim=-1).min() > 0.99
        assert torch.nn.functional.cosine_similarity(written, content[:, back:], dim=-1).abs().mean() < 0.2
