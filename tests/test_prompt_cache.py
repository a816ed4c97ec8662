"""The engine's prompt cache: a new prompt reuses the longest token prefix it shares with the
last sequence, and its output is token for token a fresh engine's (F32 caches) — over prompts
that share and then diverge, multi-turn chats, a target whose sliding-window cache has evicted
the shared part, and a drafter that lacks rows of its window. The drafts too are a fresh
engine's while the drafter holds the rows of its first window; when it lacks some, they are
skipped (the target never re-decodes what it holds for the drafter's sake) and only the first
drafts may differ. A prompt that departs from the cached sequence before the cells the
sliding-window ring still holds restarts from a context checkpoint, keyed by its tokens."""

from __future__ import annotations

import numpy as np
import pytest

from laguna_dflash.runtime import assets
from laguna_dflash.runtime.chat_template import ChatTemplate
from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions
from laguna_dflash.runtime.batch import BatchEngine
from laguna_dflash.runtime.llama import Model
from laguna_dflash.runtime.open_pair import resolve_pair
from laguna_dflash.runtime.sampling import SamplingParams
from laguna_dflash.runtime.tuner import DepthPolicy
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


def both(cached: Engine, fresh: Engine, prompt, drafts_as_fresh: bool = True, **opts):
    """Generate with both engines; assert the same tokens and (``drafts_as_fresh``) the same
    drafts round by round."""
    traces = ([], [])
    results = []
    for eng, trace in zip((cached, fresh), traces):
        o = GenerateOptions(**{"n_predict": 24, "n_max": 4, **opts},
                            trace=lambda r, t=trace: t.append((r["pos"], r["drafted"], r["accepted"])))
        results.append(eng.generate(prompt, o))
    assert results[0].tokens == results[1].tokens
    if drafts_as_fresh:
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
        # the drafter holds only the rows the last sequence's drafts could see (from 77 on),
        # none of the first draft's window here: it starts over after the kept 30
        prev = both(cached, fresh, q, drafts_as_fresh=False)
        nxt = q + prev.tokens + tokens(6)
        # the target holds all but the last answer token and keeps them; the one before came
        # from a plain step (the last round has no room to draft) whose row the drafter never
        # read, so the drafter starts over after the kept prefix
        assert both(cached, fresh, nxt, drafts_as_fresh=False).stats.n_cached == len(q) + len(prev.tokens) - 1
        # the same prompt again, then a prefix of it: all but the last token reused
        assert both(cached, fresh, nxt, drafts_as_fresh=False).stats.n_cached == len(nxt) - 1
        assert both(cached, fresh, nxt[:50], drafts_as_fresh=False).stats.n_cached == 49
        # sampling: the same seed draws the same tokens from the same logits (the drafter
        # restarted above, so its rows, not the tokens, may still differ from a fresh engine's)
        s = both(cached, fresh, nxt[:40] + tokens(3), drafts_as_fresh=False,
                 sampling=SamplingParams(temperature=0.9, seed=3))
        assert s.stats.n_cached == 40
        # other depths, and plain decoding, on the kept caches
        for depth in (0, 1, 15):
            assert both(cached, fresh, nxt[:60] + tokens(4), drafts_as_fresh=False,
                        n_max=depth).stats.n_cached >= 40


def test_after_a_plain_run_a_drafting_run_keeps_the_whole_prefix(pair):
    """After a plain run (n_max 0) the drafter holds no rows of what that run decoded: the next
    drafting run still reuses all the target holds (its first drafts see only the new rows), and
    its tokens are a fresh engine's."""
    target, drafter = pair
    cached, fresh = engines(target, drafter)
    with cached, fresh:
        p = tokens(60)
        a = both(cached, fresh, p)
        b_prompt = p + a.tokens + tokens(5)
        b = both(cached, fresh, b_prompt, n_max=0)
        assert b.stats.n_cached == len(p) + len(a.tokens) - 1
        c_prompt = b_prompt + b.tokens + tokens(5)
        c = both(cached, fresh, c_prompt, drafts_as_fresh=False)
        assert c.stats.n_cached == len(b_prompt) + len(b.tokens) - 1
        assert c.stats.drafted > 0


class PlainStretches(DepthPolicy):
    """Depth 4 and runs of plain steps that promise more plain steps, so their rows are never
    captured (as ``--n-max auto`` does when drafting does not pay), in a fixed pattern."""

    def __init__(self) -> None:
        self.round = 0

    def choose(self) -> int:
        self.round += 1
        return 4 if self.round % 7 < 3 else 0

    def plain_rounds_ahead(self) -> int:
        return 1 << 20


def test_a_drafting_engine_keeps_as_much_of_each_turn_as_a_plain_one(pair):
    """Turns whose last rounds were plain steps the drafter never read: the drafting engine keeps
    the whole shared prefix, as the plain engine does, and gives the plain engine's tokens. (Had
    it re-decoded positions for the drafter, their K/V would come from a batch of another shape,
    and on quantized targets the last bits, so greedy near-ties, would follow how the last turn
    was drafted: docs/results/agent-server/README.md.)"""
    target, drafter = pair
    cfg = {"n_ctx": 1024, "kv_type": "f32", "n_threads": 1}
    with Engine(target, drafter, EngineConfig(**cfg)) as spec, Engine(target, drafter, EngineConfig(**cfg)) as plain:
        prompt = tokens(60)
        for turn in range(4):
            a = spec.generate(prompt, GenerateOptions(n_predict=30, n_max=PlainStretches()))
            b = plain.generate(prompt, GenerateOptions(n_predict=30, n_max=0))
            assert a.tokens == b.tokens, f"turn {turn + 1}"
            assert a.stats.n_cached == b.stats.n_cached, f"turn {turn + 1}: kept {a.stats.n_cached} of the prompt, plain {b.stats.n_cached}"
            assert a.stats.drafted > 0
            prompt = prompt + a.tokens + tokens(8)


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
        # the target's window is there and all of p[:290] is kept; the drafter holds rows
        # from 300 - WINDOW + 1 on (what the first draft of p saw), not the ones the first
        # draft at 293 sees: it starts over
        assert both(cached, fresh, p[:290] + tokens(3), drafts_as_fresh=False).stats.n_cached == 290


TARGET_WINDOW = 32  # the tiny target's sliding window (tests/helpers/tiny_target.py)


def branch_before_the_ring(cached, fresh, n_max, a_len=100, b_len=250):
    """A prompt A, then A + B, then A + 60 other tokens: the third shares A with the cached
    sequence, whose ring of sliding-window cells no longer holds A's last window."""
    a, b, c = tokens(a_len), tokens(b_len), tokens(60)
    assert both(cached, fresh, a, n_max=n_max).stats.n_cached == 0
    assert both(cached, fresh, a + b, n_max=n_max).stats.n_cached == a_len
    assert cached.ctx.pos_min() > a_len - TARGET_WINDOW, "precondition: the ring evicted A's last window"
    return a, both(cached, fresh, a + c, n_max=n_max)


@pytest.mark.parametrize("n_max,n_ubatch,a_len,b_len", [(0, None, 100, 250), (4, None, 100, 250),
                                                        (4, 300, 600, 520)])
def test_a_prompt_departing_before_the_ring_restarts_from_a_checkpoint(pair, n_max, n_ubatch, a_len, b_len):
    """The third prompt is prefilled from the checkpoint taken after A, not from 0, and gives a
    fresh engine's tokens; its first draft's window (24 rows) lies in the prefilled part, so the
    drafts are a fresh engine's too. The checkpoints stay bounded. With a microbatch of 300 the
    ring is 512 cells and A wraps around it: the restored cells sit where a fresh engine's do,
    but fewer of the ring's cells are in use than in a fresh engine's."""
    target, drafter = pair
    cfg = {"n_ctx": 2048} if n_ubatch is None else {"n_ctx": 2048, "n_ubatch": n_ubatch}
    cached, fresh = engines(target, drafter, **cfg)
    with cached, fresh:
        _, res = branch_before_the_ring(cached, fresh, n_max, a_len, b_len)
        assert res.stats.n_cached == a_len and res.stats.checkpoint
        assert [c.n for c in cached.prompt_cache.checkpoints] == [a_len, a_len + 60]  # A + B's was dropped
        # llama.cpp copies only the cells a later query can see: A's last window
        assert cached.prompt_cache.checkpoints[0].pos_min == max(0, a_len - TARGET_WINDOW)
        # the next turn goes on from the kept caches (no checkpoint needed)
        prompt = list(cached.prompt_cache.tokens) + tokens(8)
        follow = both(cached, fresh, prompt, n_max=n_max, drafts_as_fresh=False)
        assert follow.stats.n_cached == len(prompt) - 8 and not follow.stats.checkpoint
        for _ in range(10):
            prompt = list(cached.prompt_cache.tokens) + tokens(5)
            both(cached, fresh, prompt, n_max=n_max, drafts_as_fresh=False)
        assert len(cached.prompt_cache.checkpoints) == 8
        assert cached.prompt_cache.checkpoint_bytes > 0


@pytest.mark.parametrize("n_max", [0, 4])
def test_the_same_prompt_after_a_reply_past_the_window_restarts_from_its_checkpoint(pair, tiny_target, n_max):
    """A request sent again (a client's retry, a regenerated reply) after a reply longer than the
    window, whose cells the ring has overwritten, restarts from the checkpoint taken after its own
    prefill: every token but the last kept (decoded again for its logits), the checkpoint holding
    exactly the cells that token's query sees, and the tokens are a fresh engine's. So in the
    server's one-slot engine too."""
    target, drafter = pair
    cached, fresh = engines(target, drafter, n_ctx=2048)
    cfg = EngineConfig(n_ctx=2048, kv_type="f32", n_threads=1)
    with cached, fresh, BatchEngine(target, resolve_pair(tiny_target["gguf"], drafter), cfg, n_seq=1) as batch:
        # a generator of its own: whether the reply runs past the ring depends on these tokens
        a = [int(t) for t in np.random.default_rng(31).integers(16, 512, size=100)]
        opts = {"n_max": n_max, "n_predict": 320}
        first = both(cached, fresh, a, drafts_as_fresh=False, **opts)
        assert cached.ctx.pos_min() > len(a) - TARGET_WINDOW, "precondition: the ring overwrote the prompt's window"
        again = both(cached, fresh, a, drafts_as_fresh=False, **opts)
        assert again.stats.checkpoint and again.stats.n_cached == len(a) - 1
        assert again.tokens == first.tokens
        for kept, restored in ((0, False), (len(a) - 1, True)):
            (res,) = batch.generate_all([a], GenerateOptions(**opts))
            assert (res.stats.n_cached, res.stats.checkpoint, res.tokens) == (kept, restored, first.tokens)


def test_without_checkpoints_the_same_prompt_is_prefilled_from_scratch(pair):
    """The control: with --ctx-checkpoints 0 the scenario above keeps nothing."""
    target, drafter = pair
    cached, fresh = engines(target, drafter, ctx_checkpoints=0)
    with cached, fresh:
        _, res = branch_before_the_ring(cached, fresh, 4)
        assert res.stats.n_cached == 0 and not res.stats.checkpoint
        assert not cached.prompt_cache.checkpoints


def test_a_checkpoint_is_restored_only_for_the_tokens_it_was_taken_on(pair):
    """A checkpoint of another sequence (the same length, other tokens) is never restored, nor
    one that lacks the window before the prefix kept. The test can fail: the same checkpoint
    keyed by the wrong tokens is restored, and the tokens then differ from a fresh engine's."""
    target, drafter = pair
    cached, fresh = engines(target, drafter)
    other, _ = engines(target, drafter)
    with cached, fresh, other:
        a, b, c = tokens(100), tokens(250), tokens(12)
        a2 = a[:50] + tokens(50)
        other.generate(a2, GenerateOptions(n_predict=4, n_max=0))
        (foreign,) = other.prompt_cache.checkpoints
        both(cached, fresh, a, drafts_as_fresh=False)
        both(cached, fresh, a + b, drafts_as_fresh=False)
        cached.prompt_cache.checkpoints = [foreign]
        res = both(cached, fresh, a + c, drafts_as_fresh=False)
        assert res.stats.n_cached == 0 and not res.stats.checkpoint

        both(cached, fresh, a, drafts_as_fresh=False)
        both(cached, fresh, a + b, drafts_as_fresh=False)
        # a checkpoint of A holds A's last window only: a prompt sharing half of A cannot use it,
        # even where its record says it holds every cell
        own = cached.prompt_cache.checkpoints[0]
        assert own.n == 100
        own.pos_min = 0
        res = both(cached, fresh, a[:50] + c, drafts_as_fresh=False)
        assert res.stats.n_cached == 0 and not res.stats.checkpoint

        both(cached, fresh, a, drafts_as_fresh=False)
        both(cached, fresh, a + b, drafts_as_fresh=False)
        foreign.tokens = np.asarray(a, dtype=np.int32)  # the key lies: the cells are a2's
        cached.prompt_cache.checkpoints = [foreign]
        wrong = cached.generate(a + c, GenerateOptions(n_predict=24, n_max=4))
        assert wrong.stats.checkpoint and wrong.stats.n_cached == 100
        right = fresh.generate(a + c, GenerateOptions(n_predict=24, n_max=4))
        assert wrong.tokens != right.tokens


def test_the_one_slot_batch_engine_restarts_from_a_checkpoint(pair, tiny_target):
    """The server's path: a one-slot BatchEngine (a ring too) keeps its checkpoints in its slot's
    prompt cache and gives the one-sequence engine's tokens."""
    target, drafter = pair
    cfg = EngineConfig(n_ctx=1024, kv_type="f32", n_threads=1)
    a, b, c = tokens(100), tokens(250), tokens(60)
    with BatchEngine(target, resolve_pair(tiny_target["gguf"], drafter), cfg, n_seq=1) as batch, \
            Engine(target, drafter, EngineConfig(n_ctx=1024, kv_type="f32", n_threads=1, prompt_cache=False)) as fresh:
        for prompt, kept in ((a, 0), (a + b, 100), (a + c, 100)):
            opts = GenerateOptions(n_predict=24, n_max=4)
            (res,) = batch.generate_all([prompt], opts)
            assert res.tokens == fresh.generate(prompt, opts).tokens
            assert res.stats.n_cached == kept
        assert res.stats.checkpoint
        assert batch.slots[0].prompt_cache.checkpoints[0].n == 100


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
                # a turn's last round may be a plain step whose row the drafter never read:
                # the target still keeps it, and only the drafts may differ from a fresh engine's
                res = both(cached, fresh, prompt, drafts_as_fresh=False, n_predict=16)
                if turn:
                    assert res.stats.n_cached >= prev_len, f"turn {turn + 1} re-read the conversation"
                messages.append({"role": "assistant", "content": res.text})
                prev_len = len(prompt)
