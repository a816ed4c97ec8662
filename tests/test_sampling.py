"""The numpy sampler: greedy fast path, penalties, filters, seeding."""

import numpy as np
import pytest

from laguna_dflash.runtime.sampling import Sampler, SamplingParams


def test_greedy_takes_the_argmax_without_copying():
    logits = np.array([0.1, 3.0, 2.0], dtype=np.float32)
    assert Sampler(SamplingParams()).sample(logits) == 1


def test_repeat_penalty_demotes_recent_tokens():
    logits = np.array([0.1, 3.0, 2.0], dtype=np.float32)
    s = Sampler(SamplingParams(repeat_penalty=2.0, repeat_last_n=4))
    assert s.sample(logits, [1]) == 2  # 3.0 / 2 < 2.0
    assert s.sample(logits, [1, 0, 0, 0, 0]) == 1  # token 1 fell out of the last 4
    whole = Sampler(SamplingParams(repeat_penalty=2.0, repeat_last_n=-1))
    assert whole.sample(logits, [1] + [0] * 100) == 2


def test_filters_restrict_the_support():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    seen = {Sampler(SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0, seed=s)).sample(logits)
            for s in range(200)}
    assert seen == {0, 1}
    seen = {Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=0.7, min_p=0.0, seed=s)).sample(logits)
            for s in range(200)}
    assert seen == {0, 1}
    seen = {Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.25, seed=s)).sample(logits)
            for s in range(300)}
    assert seen == {0, 1, 2}


def test_seed_reproduces_and_temperature_matches_frequencies():
    logits = np.log(np.array([0.6, 0.4]))
    a = [Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)).sample(logits) for _ in range(3)]
    assert len(set(a)) == 1
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0))
    freq = np.mean([s.sample(logits) == 0 for _ in range(4000)])
    assert abs(freq - 0.6) < 0.03


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="top_p"):
        Sampler(SamplingParams(top_p=0))


def test_top_k_candidates_are_the_head_of_a_stable_sort():
    """The partial selection keeps what a full stable descending sort gives, ties included."""
    from laguna_dflash.runtime.sampling import _top_k

    rng = np.random.default_rng(1)
    for trial in range(50):
        n = int(rng.integers(5, 300))
        logits = rng.integers(-3, 4, size=n).astype(np.float64) if trial % 2 else rng.normal(size=n)
        for k in (1, 2, 3, n - 1):
            assert np.array_equal(_top_k(logits, k), np.argsort(-logits, kind="stable")[:k]), (trial, k)
