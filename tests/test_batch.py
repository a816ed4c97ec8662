"""The batched engine: every running sequence's rows in one target decode per round, and each
request's output exactly what it is when the request runs alone (issue 48).

The references run one request at a time on a one-slot engine; the batched runs start
requests at random rounds on random free slots of 2-8 slots, cancel some mid-way and mix depths
(plain, fixed depths, auto) and a seeded sampler. Exact means the same tokens, and for the
drafter the same drafts: the same rounds, drafts and acceptances, which only holds if every
slot's drafter reads its own sequence's captured rows."""

from __future__ import annotations

import itertools
import random

import pytest

from helpers.synthetic import built_xs_q4_K_M
from laguna_dflash.runtime import assets
from laguna_dflash.runtime.batch import EXACT_PASS_ROWS, BatchEngine, pass_rows_bound
from laguna_dflash.runtime.engine import EngineConfig, GenerateOptions
from laguna_dflash.runtime.lanes import LanedEngine, default_lanes, lane_threads
from laguna_dflash.runtime.open_pair import resolve_pair
from laguna_dflash.runtime.sampling import SamplingParams
from laguna_dflash.runtime.tuner.batch import BatchPlanner

PROMPTS = assets.read_prompts(assets.CODE_PROMPTS)
CONFIG = dict(n_ctx=512, n_threads=1, kv_type="f16", prompt_cache=False)


def requests() -> list[tuple[str, GenerateOptions]]:
    """Twelve requests: depths 0, 1, 3, 4, 7 and auto, two sampled with a seed."""
    rng = random.Random(48)
    out = []
    for i in range(12):
        depth = [0, 1, 3, 4, 7, "auto"][i % 6]
        sampling = SamplingParams(temperature=0.8, top_k=40, seed=100 + i) if i in (2, 9) else SamplingParams()
        out.append((PROMPTS[i % 5], GenerateOptions(n_predict=rng.randint(12, 40), n_max=depth,
                                                               sampling=sampling)))
    return out


@pytest.fixture(scope="module")
def pair():
    return resolve_pair(assets.TINY_TARGET, assets.converted_tiny_drafter())


@pytest.fixture(scope="module")
def solo(pair):
    """Each request alone, by the slot count of the engine it ran on: tokens and (rounds,
    drafted, accepted). A one-slot engine's sliding-window cache is a ring, a several-slot
    engine's keeps every cell: alone means alone on an engine of its kind."""
    out = {}
    for n_seq in (1, 2):
        with BatchEngine.open(pair, EngineConfig(**CONFIG), n_seq=n_seq) as engine:
            out[n_seq] = [_summary(engine.generate_all([p], o)[0]) for p, o in requests()]
    return out


def _summary(result) -> tuple:
    s = result.stats
    return result.tokens, (s.rounds, s.drafted, s.accepted)


@pytest.mark.parametrize("n_seq,lanes,prompt_cache", [(1, 1, True), (2, 1, False), (4, 1, True), (8, 1, False),
                                                      (4, 2, False), (5, 3, True)])
def test_each_request_equals_its_solo_output_among_arrivals_and_cancellations(pair, solo, n_seq, lanes, prompt_cache):
    """With the prompt cache on, a request may start from what its slot kept of an earlier one
    (the prompts repeat): the same tokens still, but its first drafts may see fewer rows. In
    lanes (runtime/lanes.py) each lane is an engine of its own size: 5 slots in 3 lanes make two
    lanes of two slots and one of one (a ring)."""
    reqs = requests()
    rng = random.Random(n_seq)
    cancel_at = {i: rng.randint(1, 6) for i in rng.sample(range(len(reqs)), 3)}  # request -> its round
    cfg = EngineConfig(**{**CONFIG, "prompt_cache": prompt_cache})
    engine = BatchEngine.open(pair, cfg, n_seq=n_seq) if lanes == 1 else LanedEngine.open(pair, cfg, n_seq, lanes)
    engine_size = {slot: len(range(slot % lanes, n_seq, lanes)) for slot in range(n_seq)}  # its lane's slots
    try:
        pending = list(range(len(reqs)))
        owner: dict[int, int] = {}
        rounds: dict[int, int] = {}
        results: dict[int, tuple] = {}
        widest = 0
        while pending or owner:
            free = [s for s in range(n_seq) if s not in owner]
            while pending and free and (not owner or rng.random() < 0.7):
                i = pending.pop(0)
                slot = free.pop(rng.randrange(len(free)))
                engine.start(slot, reqs[i][0], reqs[i][1])
                owner[slot], rounds[i] = i, 0
            widest = max(widest, engine.running)
            for fin in engine.step():
                i = owner.pop(fin.slot)
                assert fin.error is None, fin.error
                results[i] = (list(fin.tokens), fin.stop_reason, fin.stats, fin.slot)
            for slot, i in list(owner.items()):
                rounds[i] += 1
                if cancel_at.get(i) == rounds[i]:
                    fin = engine.cancel(slot)
                    del owner[slot]
                    assert fin.slot == slot
                    results[i] = (list(fin.tokens), "interrupted", None, slot)
        assert widest == n_seq, "the schedule never filled every slot"
        if prompt_cache:
            assert any(s.n_cached for _, reason, s, _ in results.values() if s is not None), "no prompt reused"
        for i, (tokens, reason, stats, slot) in results.items():
            want_tokens, want_counts = solo[min(engine_size[slot], 2)][i]
            if reason == "interrupted":
                assert tokens == want_tokens[:len(tokens)], f"request {i}: cancelled output is not a prefix of its own"
                continue
            assert tokens == want_tokens, f"request {i} (n_max {reqs[i][1].n_max}) differs from its solo output"
            if reqs[i][1].n_max != "auto" and not prompt_cache:  # auto's depths follow the round's wall time
                assert (stats.rounds, stats.drafted, stats.accepted) == want_counts, f"request {i}: other drafts"
    finally:
        engine.close()


def test_one_round_is_one_target_decode_over_every_running_sequence(pair, monkeypatch):
    from laguna_dflash.runtime import llama

    calls = []
    real = llama.Context.decode_seqs
    monkeypatch.setattr(llama.Context, "decode_seqs", lambda self, parts: calls.append(
        [(seq, len(t)) for seq, t, _, _ in parts]) or real(self, parts))
    with BatchEngine.open(pair, EngineConfig(**CONFIG), n_seq=3) as engine:
        for slot, depth in enumerate((0, 2, 4)):
            engine.start(slot, PROMPTS[slot][:80], GenerateOptions(n_predict=20, n_max=depth))
        for _ in range(5):
            engine.step()
        # a prompt's pass holds that prompt alone (the earliest first), the decoding sequences'
        # rounds take turns with them
        assert [[seq for seq, _ in c] for c in calls] == [[0], [0], [1], [0, 1], [2]]
        engine.step()
        assert calls[5] == [(0, 1), (1, 3), (2, 5)]  # a plain row and two verify blocks, one pass


def test_lanes_decode_their_own_sequences_at_once_each_on_its_share_of_threads(pair, monkeypatch):
    """4 slots in 2 lanes: slots 0 and 2 in lane 0, 1 and 3 in lane 1. Each lane decodes only its
    own two sequences, on one of the two threads, from a thread of its own (not the caller's),
    and the two lanes' decodes overlap in time."""
    import threading
    import time

    from laguna_dflash.runtime import llama

    calls = []
    real = llama.Context.decode_seqs

    def timed(self, parts):
        t0 = time.perf_counter()
        try:
            return real(self, parts)
        finally:
            calls.append((id(self), self.n_threads, threading.get_ident(), [seq for seq, _, _, _ in parts],
                          t0, time.perf_counter()))
    monkeypatch.setattr(llama.Context, "decode_seqs", timed)
    with LanedEngine.open(pair, EngineConfig(**{**CONFIG, "n_threads": 2}), n_seq=4, lanes=2) as engine:
        assert [engine.lane_of(s) for s in range(4)] == [0, 1, 0, 1]
        results = engine.generate_all([PROMPTS[i][:60] for i in range(4)], GenerateOptions(n_predict=24, n_max=3))
    assert all(len(r.tokens) == 24 for r in results)
    by_ctx: dict[int, list] = {}
    for c in calls:
        by_ctx.setdefault(c[0], []).append(c)
    assert len(by_ctx) == 2
    for ctx_calls in by_ctx.values():
        assert {c[1] for c in ctx_calls} == {1}, "a lane's context is not on one thread"
        assert {seq for c in ctx_calls for seq in c[3]} == {0, 1}, "a lane decoded other sequences than its two"
    (a, b) = [{c[2] for c in v} for v in by_ctx.values()]
    assert len(a) == len(b) == 1 and a != b and threading.get_ident() not in a | b
    lane0, lane1 = by_ctx.values()
    overlaps = sum(1 for x in lane0 for y in lane1 if x[4] < y[5] and y[4] < x[5])
    assert overlaps >= 5, "the lanes' decodes did not run at the same time"


def test_a_sequence_started_in_a_busy_lane_joins_it_at_its_next_round(pair):
    """Starting a slot waits for its lane's round in progress, not for the lane's other sequence
    to end: the lane's thread runs no further round while a start waits."""
    with LanedEngine.open(pair, EngineConfig(**{**CONFIG, "n_threads": 2}), n_seq=4, lanes=2) as engine:
        lane = engine.lanes[0]
        rounds = []
        real_step = lane.step
        lane.step = lambda: rounds.append(1) or real_step()
        engine.start(0, PROMPTS[0][:60], GenerateOptions(n_predict=200, n_max=3))
        while len(rounds) < 5:  # the lane's thread runs slot 0's rounds back to back
            engine.step()
        for attempt in range(5):
            before = len(rounds)
            engine.start(2, PROMPTS[1][:60], GenerateOptions(n_predict=200, n_max=3))
            assert len(rounds) - before <= 1, f"start {attempt} waited {len(rounds) - before} rounds of its lane"
            assert engine.busy(0) and engine.busy(2)
            engine.cancel(2)


def test_closing_lanes_mid_generation_stops_their_threads(pair):
    engine = LanedEngine.open(pair, EngineConfig(**{**CONFIG, "n_threads": 2}), n_seq=2, lanes=2)
    for slot in range(2):
        engine.start(slot, PROMPTS[slot][:60], GenerateOptions(n_predict=200, n_max=2))
    engine.step()
    threads = list(engine._threads)
    assert all(t.is_alive() for t in threads)
    engine.close()
    assert not any(t.is_alive() for t in threads)
    with pytest.raises(Exception, match="closed"):
        engine.step()


def test_cancelling_a_lane_slot_that_already_ended_returns_its_result_once(pair):
    """A lane runs its rounds without waiting for step(): a sequence can end before step()
    reports it. Cancelling it then returns that result, and step() does not return it again."""
    import time

    with LanedEngine.open(pair, EngineConfig(**{**CONFIG, "n_threads": 2}), n_seq=2, lanes=2) as engine:
        engine.start(1, PROMPTS[0][:40], GenerateOptions(n_predict=3, n_max=2))
        deadline = time.monotonic() + 30
        while engine.busy(1):  # lane 1 runs its rounds by itself
            assert time.monotonic() < deadline, "the lane did not finish a 3-token generation"
            time.sleep(0.005)
        fin = engine.cancel(1)
        assert fin is not None and fin.slot == 1 and fin.stop_reason != "interrupted" and len(fin.tokens) == 3
        assert engine.step() == [] and engine.running == 0 and engine.cancel(1) is None


def test_lane_threads_share_the_threads_at_least_one_each():
    assert lane_threads(2, 2) == [1, 1]
    assert lane_threads(5, 2) == [3, 2]
    assert lane_threads(1, 3) == [1, 1, 1]
    with pytest.raises(ValueError):
        lane_threads(2, 0)


def test_a_pass_of_a_new_shape_is_a_round_but_not_a_cost(pair, monkeypatch):
    """The first pass of a shape (rows per sequence, captured layers) rebuilds the target's graph
    and may carry a drafter's catch-up: its time is no sample of its depth's cost, while the
    passes that repeat the last one's shape are."""
    from laguna_dflash.runtime import llama

    with BatchEngine.open(pair, EngineConfig(**CONFIG), n_seq=2) as engine:
        passes, observed = [], []
        real_decode, real_observe = llama.Context.decode_seqs, engine.planner.observe
        monkeypatch.setattr(llama.Context, "decode_seqs", lambda self, parts: passes.append(
            (tuple(len(t) for _, t, _, _ in parts), frozenset(engine._captured))) or real_decode(self, parts))
        monkeypatch.setattr(engine.planner, "observe", lambda d, rows, t, timed=True, settled=True: observed.append(
            (passes[-1], passes[-2] if len(passes) > 1 else None, timed, settled)) or real_observe(d, rows, t, timed, settled))
        engine.generate_all([PROMPTS[0][:80], PROMPTS[1][:80]], GenerateOptions(n_predict=48, n_max="auto"))
    decoding = [(now, last, settled) for now, last, timed, settled in observed if timed]
    assert any(not settled for *_, settled in decoding) and any(settled for *_, settled in decoding)
    assert all(settled == (now == last) for now, last, settled in decoding)


class _PlainPass:
    """A pass planner's view where plain decoding leads, far from its next visit."""

    def plain_rounds_ahead(self) -> int:
        return 1 << 20

    def decision(self) -> dict:
        return {"why": "exploit", "depth": 0}


class PlainStretchPlanner(BatchPlanner):
    """Plans plain steps and lets 3 passes after each planned one run without a plan, except
    right after a stretch cut short, when it plans depth 2; logs each decode, plan, observe and
    stretch in order."""

    def __init__(self, engine, log: list) -> None:
        super().__init__(engine.pair.max_draft, engine.pair.drafter.sliding_window)
        self.log = log
        self.cut = False  # whether the last stretch was cut short

    def plan(self, participants, other_rows, context, deepest=None, begins=False) -> list[int]:
        depth = 2 if self.cut and participants else 0
        self.cut = False
        for i in participants:
            self.slot(i).planned = depth
        self.current = _PlainPass() if participants else None
        self._planned = (tuple(sorted(participants)), other_rows) if participants else None
        self.log.append(("plan", tuple(sorted(participants)), depth))
        return [depth] * len(participants)

    def observe(self, depths, other_rows, seconds, timed=True, settled=True) -> None:
        self.log.append(("observe",))

    def plain_stretch(self, context: int) -> int:
        return 3

    def stretch_ends(self, seconds: list[float]) -> None:
        assert all(t > 0 for t in seconds)
        self.stretch_slots, self.stretch_left = (), 0
        self.cut = len(seconds) < 4
        self.log.append(("stretch", len(seconds)))


def test_a_plain_stretch_runs_passes_without_the_planner_and_tells_each_once(pair, monkeypatch):
    """Where the planner allows it, the passes after a planned plain one run without a plan
    while its sequences alone decode, and each sequence runs its part without asking its own
    policy: the planner hears of each pass once (observed, or in a stretch told at its end), and
    each sequence's policy of each of its rounds once; a stretch holds only settled plain passes
    of its sequences, and is cut short by a prompt or a sequence's end, for every sequence in
    it. Every output equals plain decoding's alone."""
    from laguna_dflash.runtime import llama
    from laguna_dflash.runtime.tuner.batch import SlotDepth

    told_together = []
    real_told = SlotDepth.observe_plain_stretch
    monkeypatch.setattr(SlotDepth, "observe_plain_stretch",
                        lambda self, times: told_together.append(len(times)) or real_told(self, times))

    prompts = [PROMPTS[i][:60] for i in range(5)]
    with BatchEngine.open(pair, EngineConfig(**CONFIG), n_seq=1) as engine:
        want = [engine.generate_all([p], GenerateOptions(n_predict=n, n_max=0))[0].tokens
                for p, n in zip(prompts, (30, 18, 25, 40, 12))]
    with BatchEngine.open(pair, EngineConfig(**CONFIG), n_seq=2) as engine:
        log: list = []
        planner = engine.planner = PlainStretchPlanner(engine, log)
        for s in engine.slots:
            s.planner = planner
        real_decode = llama.Context.decode_seqs
        monkeypatch.setattr(llama.Context, "decode_seqs", lambda self, parts: log.append(
            ("pass", tuple(seq for seq, *_ in parts), tuple(len(t) for _, t, _, _ in parts),
             tuple(engine.slots[seq].opts.n_predict - len(engine.slots[seq].out) for seq, *_ in parts)))
            or real_decode(self, parts))
        got = engine.generate_all(prompts, [GenerateOptions(n_predict=n, n_max="auto") for n in (30, 18, 25, 40, 12)])
    assert [g.tokens for g in got] == want
    assert told_together and sum(planner.slot(i).rounds for i in (0, 1)) == sum(g.stats.rounds for g in got)
    passes = [e for e in log if e[0] == "pass"]
    told = sum(1 for e in log if e[0] == "observe") + sum(e[1] for e in log if e[0] == "stretch")
    assert told == len(passes)
    stretches = [e[1] for e in log if e[0] == "stretch"]
    assert stretches and max(stretches) == 4 and min(stretches) < 4  # 1 + 3; some cut short
    # a plan after a stretch cut short drafts: every sequence that chose its rows after it (it
    # was in the pass before the plan, not waiting across a prompt's) plays it, 2 drafts or what
    # its last tokens leave; none runs on in a stretch of its own
    checked = 0
    for j, e in enumerate(log):
        if e[0] != "plan" or not e[2] or not e[1]:
            continue
        before = next(p for p in reversed(log[:j]) if p[0] == "pass")
        after = next((p for p in log[j + 1:] if p[0] == "pass"), None)
        if after is None or after[1] != e[1] or not set(e[1]) <= set(before[1]):
            continue
        assert after[2] == tuple(1 + min(2, left - 1) for left in after[3]), (e, after)
        checked += 1
    assert checked >= 3
    # each stretch's passes: the planned sequences' plain steps, no prompt among them, in a row
    i = 0
    for j, e in enumerate(log):
        if e[0] == "plan":
            plan, i = e[1], j
        if e[0] == "stretch":
            held = [p for p in log[i + 1:j] if p[0] == "pass"][:e[1]]
            assert len(held) == e[1] and all(p[1] == plan and set(p[2]) == {1} for p in held), (plan, held)


def test_on_a_gpu_the_batched_engine_keeps_capture_on_and_plans_for_replayed_graphs(pair, monkeypatch):
    """As Engine does on a GPU: the planner prices changes of shape (runtime/tuner/batch.py) and
    the drafters keep capture on; on the CPU neither."""
    from laguna_dflash.runtime import batch
    from laguna_dflash.runtime.llama import Model
    from laguna_dflash.runtime.placement import ALL_LAYERS

    for on_gpu in (False, True):
        monkeypatch.setattr(batch, "gpu_offload_supported", lambda: on_gpu)
        with Model(pair.target.path, n_gpu_layers=ALL_LAYERS) as target:  # a CPU build keeps them here
            with BatchEngine(target, pair, EngineConfig(**CONFIG), n_seq=2) as engine:
                assert engine.graph_replay == engine.planner.graph_replay == on_gpu
                assert [s.drafter.keep_capture for s in engine.slots] == [on_gpu, on_gpu]


def test_the_server_runs_one_lane_on_a_cpu_and_one_per_slot_on_a_gpu():
    assert [default_lanes(n, "cpu") for n in (1, 4)] == [1, 1]
    assert [default_lanes(n, "cuda") for n in (1, 4)] == [1, 4]


def test_a_long_prompt_is_prefilled_in_parts_between_the_others_rounds(pair):
    long_prompt = "\n".join(PROMPTS[:4])
    with BatchEngine.open(pair, EngineConfig(**{**CONFIG, "n_ctx": 4096, "n_batch": 64}), n_seq=2) as engine:
        n_long = len(engine.tokenize(long_prompt))
        assert n_long > 4 * 64
        engine.start(0, PROMPTS[0][:60], GenerateOptions(n_predict=200, n_max=4))
        engine.step()
        assert engine.slots[0].state == "decoding"
        engine.start(1, long_prompt, GenerateOptions(n_predict=4, n_max=4))
        states = []
        while engine.slots[1].state == "prefill":
            n0 = len(engine.slots[0].out)
            engine.step()
            states.append(len(engine.slots[0].out) > n0)
        # the prompt's parts (64 rows each) and the decoding slot's rounds take turns
        assert len(states) >= 8 and "FF" not in "".join("T" if s else "F" for s in states), \
            f"the decoding slot stalled while the other prefilled: {states}"
    with BatchEngine.open(pair, EngineConfig(**{**CONFIG, "n_ctx": 4096}), n_seq=1) as engine:
        alone = engine.generate_all([long_prompt], GenerateOptions(n_predict=4, n_max=4))[0]
    with BatchEngine.open(pair, EngineConfig(**{**CONFIG, "n_ctx": 4096, "n_batch": 64}), n_seq=2) as engine:
        both = engine.generate_all([PROMPTS[0][:60], long_prompt], GenerateOptions(n_predict=4, n_max=4))
    assert both[1].tokens == alone.tokens


def test_a_refused_request_starts_nothing_and_the_slot_stays_free(pair):
    with BatchEngine.open(pair, EngineConfig(**CONFIG), n_seq=2) as engine:
        with pytest.raises(ValueError, match="token id out of range"):
            engine.start(0, [1, 2, 10 ** 9], GenerateOptions(n_predict=4))
        assert not engine.busy(0)
        out = engine.generate_all([PROMPTS[0]], GenerateOptions(n_predict=4))
        assert len(out[0].tokens) == 4


def test_one_slot_runs_as_the_engine_does(pair):
    from laguna_dflash.runtime.engine import Engine

    reqs = requests()[:6]
    with Engine.open(pair, EngineConfig(**CONFIG)) as engine:
        want = [engine.generate(p, o) for p, o in reqs]
    with BatchEngine.open(pair, EngineConfig(**CONFIG), n_seq=1) as engine:
        got = [engine.generate_all([p], o)[0] for p, o in reqs]
    assert [g.tokens for g in got] == [w.tokens for w in want]
    assert [g.text for g in got] == [w.text for w in want]


def test_auto_sequences_take_their_depths_from_one_plan_of_the_pass(pair):
    """Four ``auto`` requests: every round's depths come from the planner of a four-sequence pass
    (runtime/tuner/batch.py), which times the whole pass, not from a tuner per sequence."""
    with BatchEngine.open(pair, EngineConfig(**CONFIG), n_seq=4) as engine:
        out = engine.generate_all(PROMPTS[:4], GenerateOptions(n_predict=64, n_max="auto"))
        pd = engine.planner.passes[(4, 0)]
        # its probes (3 passes of 8 drafts in all, 3 of 16, 3 plain: 2 and 4 drafts a sequence
        # while their acceptance is alike) yield about 27 tokens a sequence, so all four run
        # together for those 9 passes whatever the clock says
        assert pd.rounds >= 9 and pd.costs.medians(), "the four-sequence pass was never timed"
        assert all(r.stats.policy.get("batched") for r in out)
        assert sum(r.stats.rounds for r in out) >= 4 * pd.rounds


def spy_on_the_planner(engine, monkeypatch) -> tuple[list, list]:
    """The sequences of each plan the engine asks of its planner, and of each pass it tells it
    of with whether that pass was timed, in order."""
    plans, observed = [], []
    real_plan, real_observe = engine.planner.plan, engine.planner.observe
    monkeypatch.setattr(engine.planner, "plan", lambda ids, rows, ctx, deepest, **kw: plans.append(list(ids))
                        or real_plan(ids, rows, ctx, deepest, **kw))
    monkeypatch.setattr(engine.planner, "observe", lambda d, rows, t, timed=True, **kw: observed.append((sorted(d), timed))
                        or real_observe(d, rows, t, timed, **kw))
    return plans, observed


def test_a_prompt_that_ends_joins_one_plan_with_the_decoding_sequences(pair, monkeypatch):
    """A prompt's pass holds that prompt alone; the plan made after it is for the next decoding
    pass, where the prompt's sequence joins those already decoding: one plan for all of them (a
    plan for the prompt's sequence alone gave it the depths of a one-sequence pass), and that
    pass is not timed (its other sequences drafted before the prompt's pass)."""
    with BatchEngine.open(pair, EngineConfig(**CONFIG), n_seq=3) as engine:
        plans, observed = spy_on_the_planner(engine, monkeypatch)
        opts = GenerateOptions(n_predict=40, n_max="auto")
        engine.start(0, PROMPTS[0][:80], opts)
        engine.start(1, PROMPTS[1][:80], opts)
        for _ in range(6):
            engine.step()
        assert engine.slots[0].state == engine.slots[1].state == "decoding"
        engine.start(2, PROMPTS[2][:80], opts)
        n = len(plans)
        engine.step()  # the prompt's pass (a decoding pass went last)
        assert plans[n] == [0, 1, 2] and observed[-1] == ([], False)
        engine.step()  # all three decode
        assert observed[-1] == ([0, 1, 2], False)
        engine.step()
        assert observed[-1] == ([0, 1, 2], True)


def test_sequences_at_fixed_depths_run_without_the_planner(pair, monkeypatch):
    """While no ``auto`` sequence runs (plain decoding and a fixed depth here), no pass is
    planned or timed; an ``auto`` sequence that starts among them is planned from its prompt's
    pass on, its first decoding pass untimed (the others drafted before the prompt's pass) and
    the next timed. Every output equals its output alone."""
    prompts = [PROMPTS[i][:80] for i in range(3)]
    n_maxes = (0, 2, "auto")
    with BatchEngine.open(pair, EngineConfig(**CONFIG), n_seq=1) as engine:
        want = [engine.generate_all([p], GenerateOptions(n_predict=40, n_max=n))[0].tokens
                for p, n in zip(prompts, n_maxes)]
    with BatchEngine.open(pair, EngineConfig(**CONFIG), n_seq=3) as engine:
        plans, observed = spy_on_the_planner(engine, monkeypatch)
        for i in (0, 1):
            engine.start(i, prompts[i], GenerateOptions(n_predict=40, n_max=n_maxes[i]))
        for _ in range(6):
            engine.step()
        assert engine.slots[0].state == engine.slots[1].state == "decoding"
        assert plans == [] and observed == []
        engine.start(2, prompts[2], GenerateOptions(n_predict=40, n_max="auto"))
        engine.step()  # a decoding pass went last: the prompt's pass
        assert plans == [[2]] and observed == [([], False)]
        engine.step()  # all three decode
        assert observed[-1] == ([2], False)
        engine.step()
        assert observed[-1] == ([2], True)
        got = {}
        while len(got) < 3:
            got.update({f.slot: f for f in engine.step()})
    assert [got[i].tokens for i in range(3)] == want


@pytest.mark.skipif(built_xs_q4_K_M(2) is None, reason="no XS-width Q4_K_M target: scripts/bench/bench_cost_model.py --build-only")
def test_q4_K_M_prompts_beside_other_sequences_equal_their_solo_outputs():
    """Where a pass of more than 16 rows computes a row by where it falls in the pass (Q4_K's
    4-row tiles, an expert's rows grouped across the pass: the XS-width Q4_K_M target), each
    request still equals its output alone: its prompt is decoded in passes of its own, cut as the
    one-slot engine cuts it (one prompt here is longer than that engine's 256-row microbatch).
    Measured on the 5-layer target with prompts sharing the others' passes: 2 of 4 outputs
    (started together) and 3 of 4 (a few rounds apart) parted from their solo ones, two at their
    first token."""
    target, _ = built_xs_q4_K_M(2)
    pair = resolve_pair(target)
    cfg = EngineConfig(n_ctx=1024, n_threads=2, kv_type="f16", prompt_cache=False)
    opts = GenerateOptions(n_predict=12, n_max=0)
    with BatchEngine.open(pair, cfg, n_seq=1) as engine:
        prompts = [engine.tokenize(p)[:n] for p, n in zip(PROMPTS, (32, 300, 45, 61))]
        assert len(prompts[1]) == 300
        solo = [engine.generate_all([p], opts)[0].tokens for p in prompts]
    with BatchEngine.open(pair, cfg, n_seq=4) as engine:
        together = [r.tokens for r in engine.generate_all(prompts, opts)]
        owner, staggered = {}, {}
        for rnd in range(400):
            if rnd % 3 == 0 and rnd // 3 < 4:
                engine.start(rnd // 3, prompts[rnd // 3], opts)
                owner[rnd // 3] = rnd // 3
            for fin in engine.step():
                staggered[owner.pop(fin.slot)] = list(fin.tokens)
            if len(staggered) == 4:
                break
    assert together == solo, "started together"
    assert [staggered[i] for i in range(4)] == solo, "started a few rounds apart"


def recorded_decoding_passes(monkeypatch) -> list[list[tuple[int, int]]]:
    """Every target decode from now on, as (sequence, rows) of its decoding parts (rows with
    logits from the first; a prompt part's are its last only): an empty list for a prompt's pass."""
    from laguna_dflash.runtime import llama

    passes = []
    real = llama.Context.decode_seqs
    monkeypatch.setattr(llama.Context, "decode_seqs", lambda self, parts: passes.append(
        [(seq, len(t)) for seq, t, _, first in parts if first == 0]) or real(self, parts))
    return passes


def test_no_decoding_pass_holds_more_rows_than_the_bound(pair, monkeypatch):
    """Under a rows bound (the bundled Q8_0 pair has none; forced here) no decoding pass holds
    more rows than it, with 1-8 sequences of every depth the drafter takes and auto, starting a
    round apart (a prompt's sequence joins others that drafted for fewer); no sequence waits
    more than a round for a pass; 4 sequences at n_max 4 draft 3 each while all four run."""
    assert pass_rows_bound(pair.target) is None
    passes = recorded_decoding_passes(monkeypatch)
    depths = itertools.cycle([*range(pair.max_draft + 1), "auto"])
    with BatchEngine.open(pair, EngineConfig(**CONFIG), n_seq=8) as engine:
        engine.max_pass_rows = EXACT_PASS_ROWS
        for n, depth in [(n, None) for n in range(1, 9)] + [(4, 4)]:
            passes.clear()
            for rnd in range(200):
                if rnd < n:
                    opts = GenerateOptions(n_predict=8, n_max=next(depths)) if depth is None else \
                        GenerateOptions(n_predict=32, n_max=depth)
                    engine.start(rnd, PROMPTS[rnd % 5][:40], opts)
                engine.step()
                if rnd >= n and not engine.running:
                    break
            decoding = [p for p in passes if p]
            assert max(sum(k for _, k in p) for p in decoding) <= EXACT_PASS_ROWS, (n, decoding)
            waits = {}  # sequence -> decoding passes since its last
            for p in decoding:
                for seq in waits:
                    waits[seq] += 1
                for seq, _ in p:
                    assert waits.get(seq, 0) <= 1, (n, seq, decoding)
                    waits[seq] = 0
        assert [(0, 4), (1, 4), (2, 4), (3, 4)] in decoding, decoding


def test_the_rows_bound_follows_the_weight_types_and_the_cpu_backend(monkeypatch):
    """The least bound the weights allow: none for F32, F16 and Q8_0, nor for Q6_K and Q4_K where
    the CPU backend has AVX2 and repacks them (rows in eights; every pass takes the rows kernel,
    patches 0014 and 0042); 16 otherwise."""
    from gguf import GGMLQuantizationType as Q

    from helpers.kernel_weights import rows_bound

    def bound(tensors, features):
        return rows_bound(monkeypatch, tensors, features)

    q4_K_M = [(Q.F32, (2048,)), (Q.Q4_K, (512, 2048)), (Q.Q4_K, (64, 512, 2048)), (Q.Q6_K, (100352, 2048))]
    assert bound([(Q.F32, (128,)), (Q.Q8_0, (256, 128))], {"AVX"}) is None
    assert bound([(Q.F32, (128,)), (Q.Q6_K, (256, 128))], {"AVX2"}) is None
    assert bound(q4_K_M, {"AVX", "AVX2"}) is None                        # every pass: the rows kernel
    assert bound(q4_K_M, {"AVX2", "AVX512"}) is None                     # no VNNI: the AVX2 rows kernel
    assert bound(q4_K_M, {"AVX2", "AVX512", "AVX512_VNNI"}) is None      # the 512-bit one
    assert bound(q4_K_M + [(Q.Q5_K, (512, 2048))], {"AVX2", "AVX512", "AVX512_VNNI"}) == EXACT_PASS_ROWS
    assert bound(q4_K_M, {"AVX"}) == EXACT_PASS_ROWS                      # no AVX2: 4-row tiles
    assert bound(q4_K_M + [(Q.Q6_K, (100, 2048))], {"AVX2"}) == EXACT_PASS_ROWS   # not repacked
    assert bound(q4_K_M + [(Q.Q5_K, (512, 2048))], {"AVX2"}) == EXACT_PASS_ROWS


@pytest.mark.skipif(built_xs_q4_K_M() is None, reason="no XS-width Q4_K_M target: scripts/bench/bench_cost_model.py --build-only")
def test_q4_K_M_sequences_at_depth_4_equal_their_solo_outputs(monkeypatch):
    """Four sequences at n_max 4 on the XS-width Q4_K_M target. Where Q4_K passes of more than 16
    rows took the 4-row tiles, which sum in another order than the one-row kernel, three of the
    four outputs parted from their solo ones at tokens 6, 2 and 5 in 20-row passes, and the rows
    bound held them to 16 (each drafting 3 while all four run). With AVX2 every pass takes the
    rows kernel (patches 0019, 0042): 20-row passes, each output equal to its output alone."""
    from laguna_dflash.runtime import llama

    target, drafter = built_xs_q4_K_M()
    pair = resolve_pair(target, drafter)
    cfg = EngineConfig(n_ctx=256, n_threads=1, kv_type="f16", prompt_cache=False)
    opts = GenerateOptions(n_predict=10, n_max=4)
    passes = recorded_decoding_passes(monkeypatch)
    with BatchEngine.open(pair, cfg, n_seq=4) as engine:
        avx2 = "AVX2" in llama.cpu_backend_features()
        assert engine.max_pass_rows == (None if avx2 else EXACT_PASS_ROWS)
        prompts = [engine.tokenize(p)[:8] for p in PROMPTS[:4]]
        together = [r.tokens for r in engine.generate_all(prompts, opts)]
        solo = [engine.generate_all([p], opts)[0].tokens for p in prompts]
    assert max(sum(k for _, k in p) for p in passes) == (20 if avx2 else EXACT_PASS_ROWS)
    assert together == solo


@pytest.mark.skipif(built_xs_q4_K_M() is None, reason="no XS-width Q4_K_M target: scripts/bench/bench_cost_model.py --build-only")
def test_q4_K_M_passes_of_any_rows_equal_solo_outputs_where_unbounded(monkeypatch):
    """Where the rows bound is lifted on a Q4_K_M target (AVX2: every Q4_K pass takes the rows
    kernel, patches 0037 and 0042), four sequences at n_max 12 decode in 52-row passes, past the
    32 rows of the bound AVX2 builds had before 0042, each output still equal to its output alone."""
    target, drafter = built_xs_q4_K_M()
    pair = resolve_pair(target, drafter)
    cfg = EngineConfig(n_ctx=256, n_threads=2, kv_type="f16", prompt_cache=False)
    opts = GenerateOptions(n_predict=24, n_max=12)  # depths are cut to the tokens left
    passes = recorded_decoding_passes(monkeypatch)
    with BatchEngine.open(pair, cfg, n_seq=4) as engine:
        if engine.max_pass_rows is not None:
            pytest.skip(f"this CPU backend bounds a Q4_K_M pass to {engine.max_pass_rows} rows")
        prompts = [engine.tokenize(p)[:8] for p in PROMPTS[:4]]
        together = [r.tokens for r in engine.generate_all(prompts, opts)]
        solo = [engine.generate_all([p], opts)[0].tokens for p in prompts]
    assert max(sum(k for _, k in p) for p in passes) == 52
    assert together == solo
