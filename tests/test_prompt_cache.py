"""The engine's prompt cache: a new prompt reuses the longest token prefix it shares with the
last sequence, and its output is token for token a fresh engine's (F32 caches), drafts
included — over prompts that share and then diverge, multi-turn chats, a target whose
sliding-window cache has evicted the shared part, and a drafter that lacks rows of its window."""

from __future__ import annotations

import numpy as np
import pytest

from laguna_dflash.runtime import assets
from laguna_dflash.runtime.chat_template import ChatTemplate
from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions
from laguna_dflash.runtime.llama import Model
from laguna_dflash.runtime.sampling import SamplingParams
from server_harness import TEMPLATE
from test_engine import WINDOW, make_drafter

RNG = np.random.default_rng(23)


def tokens(n: int) -> list[int]:
    return [int(t) for t in RNG.integers(16, 512, size=n)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_target):
    drafter = make_drafter(tmp_path_factory.mktemp("prompt-cache"), "d", tiny_target["gguf"])
    with Model(tiny_target["gguf"]) as target:
        yield target, drafter


def engines(target, drafter, **cfg):
    base = {"n_ctx": 1024, "kv_type": "f32", "n_threads": 1, **cfg}
    return (Engine(target, drafter, EngineConfig(**base)),
            Engine(target, drafter, EngineConfig(**base, prompt_cache=False)))


def both(cached: Engine, fresh: Engine, prompt, **opts):
    """Generate with both engines; assert the same tokens and the same drafts round by round."""
    traces = ([], [])
    results = []
    for eng, trace in zip((cached, fresh), traces):
        o = GenerateOptions(**{"n_predict": 24, "n_max": 4, **opts},
                            trace=lambda r, t=trace: t.append((r["pos"], r["drafted"], r["accepted"])))
        results.append(eng.generate(prompt, o))
    assert results[0].tokens == results[1].tokens
    assert traces[0] == traces[1], "the drafter saw other context rows than a fresh engine's"
    assert results[1].stats.n_cached == 0
    return results[0]


def test_shared_then_diverging_prompts_reuse_the_prefix_and_equal_a_fresh_engine(pair):
    target, drafter = pair
    cached, fresh = engines(target, drafter)
    with cached, fresh:
        p = tokens(100)
        assert both(cached, fresh, p).stats.n_cached == 0
        # diverges near the end: the drafter holds the rows of the first draft's window
        assert both(cached, fresh, p[:90] + tokens(10)).stats.n_cached == 90
        # diverges early: nothing kept is visible to the first draft (window 24), target prefix kept
        assert both(cached, fresh, p[:30] + tokens(70)).stats.n_cached == 30
        # a continuation of the last sequence (prompt + answer + more), as a chat's next turn
        q = p[:30] + tokens(5)
        prev = both(cached, fresh, q)
        nxt = q + prev.tokens + tokens(6)
        # the target holds all but the last answer token; that one's predecessor came from a
        # plain step (the last round has no room to draft), whose row the drafter never read:
        # the target recomputes it
        assert both(cached, fresh, nxt).stats.n_cached == len(q) + len(prev.tokens) - 2
        # the same prompt again, then a prefix of it: all but the last token reused
        assert both(cached, fresh, nxt).stats.n_cached == len(nxt) - 1
        assert both(cached, fresh, nxt[:50]).stats.n_cached == 49
        # sampling: the same seed draws the same tokens from the same logits
        s = both(cached, fresh, nxt[:40] + tokens(3), sampling=SamplingParams(temperature=0.9, seed=3))
        assert s.stats.n_cached == 40
        # other depths, and plain decoding, on the kept caches
        for depth in (0, 1, 15):
            assert both(cached, fresh, nxt[:60] + tokens(4), n_max=depth).stats.n_cached >= 40


def test_a_plain_run_leaves_the_drafter_rows_to_recompute(pair):
    """After a plain run (n_max 0) the drafter holds no rows of what that run decoded: the next
    drafting run recomputes the rows of its first window from the target, no more."""
    target, drafter = pair
    cached, fresh = engines(target, drafter)
    with cached, fresh:
        p = tokens(60)
        a = both(cached, fresh, p)
        b_prompt = p + a.tokens + tokens(5)
        b = both(cached, fresh, b_prompt, n_max=0)
        assert b.stats.n_cached == len(p) + len(a.tokens) - 1
        c_prompt = b_prompt + b.tokens + tokens(5)
        c = both(cached, fresh, c_prompt)
        # the first draft sees the last WINDOW - 1 context rows: recomputed from there
        assert c.stats.n_cached == len(c_prompt) - WINDOW + 1
        assert c.stats.drafted > 0


def test_a_target_window_evicted_from_its_cache_is_not_reused(pair):
    """A small microbatch gives the target's sliding-window layers a cache of 256 cells; after a
    longer sequence the shared prefix's window is gone from it and the prompt is prefilled from
    scratch, while a prefix that ends inside the kept window is reused."""
    target, drafter = pair
    cached, fresh = engines(target, drafter, n_ubatch=16)
    with cached, fresh:
        p = tokens(300)
        both(cached, fresh, p)
        assert cached.ctx.pos_min() > 40, "precondition: the sliding-window cache evicted the oldest cells"
        assert both(cached, fresh, p[:40] + tokens(20)).stats.n_cached == 0
        both(cached, fresh, p)
        # the target's window is there; the drafter holds rows from 300 - WINDOW + 1 on (what
        # the first draft of p saw), so the target recomputes the rows it lacks
        assert both(cached, fresh, p[:290] + tokens(3)).stats.n_cached == 293 - WINDOW + 1


def test_an_abandoned_stream_leaves_no_stale_cache(pair):
    target, drafter = pair
    cached, fresh = engines(target, drafter)
    with cached, fresh:
        p = tokens(50)
        both(cached, fresh, p)
        it = cached.stream(p[:45] + tokens(5), GenerateOptions(n_predict=40, n_max=4))
        next(it)
        it.close()  # the generator ends mid-sequence: its caches are not a finished sequence
        assert cached.cached_prefix(p) == 0
        assert both(cached, fresh, p).stats.n_cached == 0


def test_prompt_cache_off_prefills_everything(pair):
    target, drafter = pair
    with Engine(target, drafter, EngineConfig(n_ctx=512, kv_type="f32", n_threads=1, prompt_cache=False)) as eng:
        p = tokens(40)
        eng.generate(p, GenerateOptions(n_predict=8))
        assert eng.cached_prefix(p) == 0
        assert eng.generate(p, GenerateOptions(n_predict=8)).stats.n_cached == 0


def test_multi_turn_chat_equals_a_fresh_engine_on_the_bundled_pair():
    """Five turns of a chat through a template: from turn 2 on, the previous turns (prompt and
    answer) come from the cache, and each answer equals a fresh engine's."""
    template = ChatTemplate(TEMPLATE, source="test template")
    with Model(assets.TINY_TARGET) as target:
        cached, fresh = engines(target, assets.converted_tiny_drafter(), n_ctx=2048)
        with cached, fresh:
            messages = []
            questions = ["def parse(path):", "class Config:", "import os\nimport sys", "def main():", "# tests"]
            prev_len = 0
            for turn, q in enumerate(questions):
                messages.append({"role": "user", "content": q})
                prompt = cached.tokenize(template.render(messages, add_generation_prompt=True))
                res = both(cached, fresh, prompt, n_predict=16)
                if turn:
                    assert res.stats.n_cached >= prev_len, f"turn {turn + 1} re-read the conversation"
                messages.append({"role": "assistant", "content": res.text})
                prev_len = len(prompt)
