"""The depth tuner replayed on the laguna-tiny pair's recorded acceptance and costs.

A recording (made by ``scripts/bench/record_acceptance.py``) holds the shipped drafter's match length
at every position of every prompt's greedy output, and the pair's round costs and timing noise
on a CPU. Two are kept: ``replay.json``, made on a busy day of this shared machine (plain steps
40% slower than usual, round times up to 7x their median), and ``replay-calm.json``, made on a
calm one (session 3; its recorder still counted the generations' cut last rounds in the noise,
so its lowest 2.5% of round times are too low). ``replay-cuda.json`` has the same acceptance
and the clock of both models on an H200 (session 5: rounds cost almost the same up to depth 7
and 60% more from depth 8, where the verify batch switches kernels; its depth-change cost
came out negative and counts as zero). ``replay-stair.json`` (session 7, a calm day) has costs
that rise in steps of two depths on this CPU (depth 3 costs what 4 does, 5 more than 6) and the
measured drift of the clock (successive rounds' times are correlated: the replay splits the
recorded spread into a slow factor and a fast one). ``replay-cuda-run2.json`` is the H200's
clock again (the patch series through 0023) with what a change of batch shape costs there
(``change_s``: the first two rounds after any change, a prompt's prefill included, run without
the replayed CUDA graph, 7.3 and 9.9 ms over a settled 1.2-2.7 ms; where those figures come
from: the file's ``change_s_from``); the live tuner lost on it (0.56 of the best fixed depth on
code) until it learnt to time only settled rounds and to change depth only where a change pays.
Replays are deterministic per seed, so these checks are exact regressions for issue 7's
acceptance lines, on every clock (the GPUs' code lines are held as regression bounds: the tuner
does not reach 0.95 there over twelve orders).
"""

from __future__ import annotations

import functools
import random
import statistics

import pytest

from laguna_dflash.runtime import assets
from helpers.depth_replay import (RECORDED, Judgement, Recording, choice_quality, judge, judge_stream, prompt_order,
                            ratio_over_repeats, repeat_interval, replay, settle_round)
from laguna_dflash.runtime.tuner import AutoDepth, DepthPolicy, FixedDepth

RECORDINGS = {"busy": RECORDED / "replay.json", "calm": RECORDED / "replay-calm.json",
              "gpu": RECORDED / "replay-cuda.json", "stair": RECORDED / "replay-stair.json",
              "gpu-switch": RECORDED / "replay-cuda-run2.json"}
SEEDS = 12


@pytest.fixture(scope="module")
def rec() -> Recording:
    return Recording.load(RECORDINGS["busy"])


@functools.cache
def judged(clock: str, workload: str) -> Judgement:
    """Auto on ``workload``, with its own round costs, over SEEDS prompt orders."""
    rec = Recording.load(RECORDINGS[clock], costs_of=workload)
    return judge(AutoDepth, rec, rec.workloads[workload], SEEDS)


@pytest.mark.parametrize("clock", RECORDINGS)
def test_the_recording_is_of_the_shipped_drafter(clock):
    rec = Recording.load(RECORDINGS[clock])
    assert rec.drafter_digest == assets.drafter_digest(), (
        "the shipped drafter changed: run python -m scripts.bench.record_acceptance --out " + str(RECORDINGS["busy"]))
    assert set(rec.workloads) >= {"code", "prose", "degraded"}
    assert len(rec.round_s) == 16 and rec.round_s[0] < rec.round_s[1] < rec.round_s[15]


def test_replay_moves_by_accepted_plus_one_and_charges_each_round():
    rec = Recording(workloads={"w": [[2] * 20]}, round_s=[1.0, 2.0, 3.0, 4.0], plain_skip_s=0.75,
                    depth_change_s=0.5, catchup_s=0.125, catchup_per_row_s=0.25, noise_quantiles=[1.0, 1.0],
                    n_predict=10)
    r = replay(FixedDepth(3), rec, rec.workloads["w"], noise=False)
    # one token from the prefill, then rounds of 2 accepted + 1; the last round is capped so it
    # does not pass n_predict, which changes the depth
    assert r.tokens == 10 and r.depths == [3, 3, 2]
    assert r.seconds == pytest.approx(2 * 4.0 + (3.0 + 0.5))
    policy = iter([0, 0, 2, 2, 2, 2])

    class Script(DepthPolicy):
        def choose(self):
            return next(policy)

    r = replay(Script(), rec, rec.workloads["w"], noise=False)
    # two plain steps that read their rows, then a drafting round that pays the depth change and
    # the catch-up on two rows; the last plain step promises nothing either (FixedDepth(0) would)
    assert r.depths == [0, 0, 2, 2, 0]
    assert r.seconds == pytest.approx(1.0 + 1.0 + (3.0 + 0.5 + 0.125 + 2 * 0.25) + 3.0 + (1.0 + 0.5))
    # plain decoding proper promises plain steps forever: no rows read, the cheaper step
    assert replay(FixedDepth(0), rec, rec.workloads["w"], noise=False).seconds == pytest.approx(9 * 0.75)


def test_replay_charges_the_catch_up_of_the_capture_horizon_only():
    """Plain steps promised a stretch longer than the capture horizon skip their rows; switching
    capture back on rebuilds the graphs (charged as a depth change), and the catch-up reads the
    rows read since."""
    rec = Recording(workloads={"w": [[2] * 20]}, round_s=[1.0, 2.0, 3.0, 4.0], plain_skip_s=0.75,
                    depth_change_s=0.5, catchup_s=0.125, catchup_per_row_s=0.25, noise_quantiles=[1.0, 1.0],
                    n_predict=8, window=2)  # a window of 2: the horizon is 2 rows
    script = iter([(0, 5), (0, 2), (0, 1), (0, 0), (2, 0)])

    class Promising(DepthPolicy):
        def choose(self):
            self.depth, self.ahead = next(script)
            return self.depth

        def plain_rounds_ahead(self):
            return self.ahead

    r = replay(Promising(), rec, rec.workloads["w"], noise=False)
    assert rec.horizon == 2 and r.depths == [0, 0, 0, 0, 2]
    assert r.seconds == pytest.approx(0.75 + 0.75 + (1.0 + 0.5) + 1.0 + (3.0 + 0.5 + 0.125 + 2 * 0.25))


def test_a_graph_replaying_clock_charges_the_rounds_after_every_change_of_shape():
    """On a GPU clock each prompt's first rounds (its prefill changed the batch shape) and the
    first rounds after a change of depth pay ``change_s``, one figure per round; plain steps
    promised past the horizon keep capture on: they cost a plain step, and no switch follows."""
    rec = Recording(workloads={"w": [[2] * 20]}, round_s=[1.0, 2.0, 3.0, 4.0], plain_skip_s=0.75,
                    depth_change_s=-0.5, catchup_s=0.0, catchup_per_row_s=0.0, noise_quantiles=[1.0, 1.0],
                    n_predict=10, graph_replay=True, change_s=(0.5, 0.25))
    r = replay(FixedDepth(3), rec, rec.workloads["w"] * 2, noise=False)
    # per prompt: 3, 3 (the prefill's change), then 2 cut at the end (a change again)
    assert r.depths == [3, 3, 2] * 2
    assert r.seconds == pytest.approx(2 * ((4.0 + 0.5) + (4.0 + 0.25) + (3.0 + 0.5)))
    r = replay(FixedDepth(0), rec, rec.workloads["w"], noise=False)
    assert r.seconds == pytest.approx(9 * 1.0 + 0.5 + 0.25)
    assert Recording.load(RECORDINGS["gpu-switch"]).graph_replay and not Recording.load(RECORDINGS["busy"]).graph_replay


# Issue 7's code line (0.95 of the best fixed depth, choices after round 64 as good) holds on
# the calm clock. On the busy one, whose round times reach 7x their median, the tuner's cost
# estimates are noisier than any fixed depth's speed: 0.954 over 40 orders (docs/results/autotune-replay/README.md),
# held here as a regression bound, not as the line. The stair clock holds the line (0.969 over
# 40 orders, the worst 0.884). On the GPU clocks, 0.948 and 0.949 over these 12 orders (the
# prompt file's own order: 0.95 with the switch costs), where the tuner that knew nothing of
# switches reached 0.938 without them and 0.68 with them.
CODE_BOUNDS = {"calm": (0.95, 0.88, 0.95), "busy": (0.92, 0.85, 0.93), "gpu": (0.94, 0.90, 0.96),
               "stair": (0.95, 0.87, 0.95), "gpu-switch": (0.94, 0.89, 0.96)}  # mean, worst, choices


@pytest.mark.parametrize("clock", RECORDINGS)
def test_auto_reaches_95_percent_of_the_best_fixed_depth_on_code(clock):
    mean, worst, _ = CODE_BOUNDS[clock]
    vs_best = judged(clock, "code").vs_best_fixed
    assert statistics.mean(vs_best) >= mean, vs_best
    assert min(vs_best) >= worst, vs_best


@pytest.mark.parametrize("clock", RECORDINGS)
def test_auto_keeps_97_percent_of_plain_decoding_with_a_degraded_drafter(clock):
    vs_plain = judged(clock, "degraded").vs_plain
    assert statistics.mean(vs_plain) >= 0.97, vs_plain
    assert min(vs_plain) >= 0.95, vs_plain


@pytest.mark.parametrize("clock", RECORDINGS)
@pytest.mark.parametrize("workload", ["code", "degraded"])
def test_auto_exploits_good_depths_after_64_rounds(clock, workload):
    quality = judged(clock, workload).choice_quality
    assert statistics.mean(quality) >= (CODE_BOUNDS[clock][2] if workload == "code" else 0.95), quality


@pytest.mark.parametrize("clock", RECORDINGS)
def test_a_busy_clock_does_not_shut_the_drafter_off(clock):
    """Tables gain 1.9x from drafting. On a busy machine a visit or two can make every depth look
    hopeless; the tuner once took that for "plain decoding is clearly best" and kept the drafter
    off for two windows (1024 rounds: whole streams), 0.54 of the best fixed depth."""
    vs_plain = judged(clock, "table").vs_plain
    assert min(vs_plain) >= 1.3, vs_plain


def test_on_a_gpu_the_contexts_told_cost_no_switches():
    """The engine tells the tuner each round's context, and a short request's prompt and output
    often straddle a doubling (here prompts of 60-260 tokens, 96 more generated). Where each
    change of batch shape costs two slow rounds, bands of one doubling made the tuner re-time
    and re-decide at the crossings: code 0.934 of the best fixed depth over these orders
    against 0.949 untold. Bands of three doublings there: 0.953."""
    rec = Recording.load(RECORDINGS["gpu-switch"], costs_of="code")
    ratios = []
    for seed in range(SEEDS):
        order = prompt_order(rec.workloads["code"], seed)
        rng = random.Random(seed)
        lengths = [rng.randint(60, 260) for _ in order]
        best = max(replay(FixedDepth(k), rec, order, seed=seed).tokens_per_s for k in range(rec.max_depth + 1))
        auto = AutoDepth(rec.max_depth, window=rec.window, graph_replay=True)
        ratios.append(replay(auto, rec, order, seed=seed, prompt_tokens=lengths).tokens_per_s / best)
    assert statistics.mean(ratios) >= 0.945, ratios


def lag_one_correlation(x: list[float]) -> float:
    m = statistics.fmean(x)
    return sum((a - m) * (b - m) for a, b in zip(x, x[1:])) / sum((a - m) ** 2 for a in x)


def test_drift_makes_successive_rounds_alike_without_widening_the_spread(rec):
    """A shared machine's round times drift (live, depth 4 on code: lag-one correlation 0.6,
    docs/results/autotune-history/README.md); the replay splits the recorded spread into a slow factor and a fast one.
    Every depth costs the same here, so a round's time is its noise draw alone: two policies
    meet the same draws round by round, and the slow factor only correlates them."""
    import dataclasses
    import math

    from helpers.depth_replay import Scripted  # a fixed depth that keeps every round's report

    flat = Recording(**{**rec.__dict__, "round_s": [1.0] * 16, "plain_skip_s": 1.0, "depth_change_s": 0.0,
                        "catchup_s": 0.0, "catchup_per_row_s": 0.0})
    prompts = [[0] * 400] * 4
    drifting = dataclasses.replace(flat, drift_phi=0.9, drift_share=0.7)
    logs = {}
    for name, clock in (("iid", flat), ("drift", drifting)):
        a, b = Scripted([2]), Scripted([3])
        replay(a, clock, prompts, seed=3)
        replay(b, clock, prompts, seed=3)
        times_a, times_b = [t for _, _, t, _ in a.log], [t for _, _, t, _ in b.log]
        n = min(len(times_a), len(times_b))
        assert times_a[:n] == times_b[:n]
        logs[name] = [math.log(min(max(t, 0.5), 2.0)) for t in times_a]  # a stall is not drift
    assert abs(lag_one_correlation(logs["iid"])) < 0.15
    assert lag_one_correlation(logs["drift"]) > 0.4

    def iqr(x):
        q = statistics.quantiles(x, n=4)
        return q[2] - q[0]

    assert 0.7 < iqr(logs["drift"]) / iqr(logs["iid"]) < 1.4


def test_the_recorder_measures_drift_from_the_round_times():
    """``record_acceptance.drift`` fits share * phi**lag to the autocorrelation of the rounds'
    log time ratios: a slow AR(1) factor (phi 0.9, 65% of the variance) plus independent noise
    comes back close, independent draws come back as no drift."""
    import math

    import numpy as np

    from helpers.depth_replay import drift

    rng = np.random.default_rng(0)
    runs, flat = [], []
    for _ in range(16):
        slow, xs = 0.0, []
        for _ in range(400):
            slow = 0.9 * slow + math.sqrt(1 - 0.81) * rng.normal(0.0, math.sqrt(0.65) * 0.1)
            xs.append(math.exp(slow + rng.normal(0.0, math.sqrt(0.35) * 0.1)))
        runs.append(xs)
        flat.append(list(np.exp(rng.normal(0.0, 0.1, 400))))
    d = drift(runs)
    assert 0.85 < d["drift_phi"] < 0.95 and 0.55 < d["drift_share"] < 0.75, d
    assert drift(flat)["drift_share"] < 0.1


@pytest.mark.parametrize("clock", ["calm", "stair"])
def test_prose_does_not_wait_in_plain_decoding(clock):
    """Prose gains 1.4x from drafting, but its first prompts start with a few hard rounds. When
    leaving plain decoding also asked for a win with acceptance one standard error lower, the
    tuner exploited plain decoding for 100-120 rounds in some orders (live in run 17 too: two
    repeats of three); now at most a few dozen, in every order."""
    rec = Recording.load(RECORDINGS[clock], costs_of="prose")
    waits = []
    for seed in range(SEEDS):
        order = prompt_order(rec.workloads["prose"], seed)
        r = replay(AutoDepth(rec.max_depth, window=rec.window), rec, order, seed=seed)
        waits.append(sum(1 for d, why in zip(r.depths, r.why) if d == 0 and why == "exploit"))
    assert max(waits) <= 48, waits


def test_a_clock_can_make_the_plain_steps_after_drafting_dearer():
    """``plain_settle``: the 2nd, 3rd, ... plain steps after a drafting round cost its factors
    more (the 1st pays the change of depth, as before); a prompt's pass clears it."""
    from helpers.depth_replay import Scripted

    rec = Recording(workloads={"w": [[0] * 10]}, round_s=[1.0, 2.0], plain_skip_s=1.0, depth_change_s=0.5,
                    catchup_s=0.0, catchup_per_row_s=0.0, noise_quantiles=[1.0, 1.0], n_predict=7)
    settled = Recording(**{**rec.__dict__, "plain_settle": (1.5, 1.2)})
    plain = replay(Scripted([1, 0]), rec, [[0] * 10] * 2, noise=False)
    dear = replay(Scripted([1, 0]), settled, [[0] * 10] * 2, noise=False)
    # a drafting round (2), then five plain steps: the first + the change, then 1.5x, 1.2x, 1x, 1x
    assert plain.prompt_seconds == [2.0 + 1.5 + 4 * 1.0, 6 * 1.0]
    assert dear.prompt_seconds == pytest.approx([2.0 + 1.5 + 1.5 + 1.2 + 2 * 1.0, 6 * 1.0])


def test_each_prompt_can_run_on_its_own_clock():
    fast = Recording(workloads={"w": [[0] * 10]}, round_s=[1.0, 2.0], plain_skip_s=1.0, depth_change_s=0.0,
                     catchup_s=0.0, catchup_per_row_s=0.0, noise_quantiles=[1.0, 1.0], n_predict=4)
    slow = Recording(**{**fast.__dict__, "round_s": [3.0, 6.0], "plain_skip_s": 3.0})
    r = replay(FixedDepth(0), fast, [[0] * 10] * 2, noise=False, clocks=[fast, slow])
    assert r.prompt_seconds == [3 * 1.0, 3 * 3.0] and r.seconds == 12.0


@pytest.mark.parametrize("clock", RECORDINGS)
def test_one_tuner_follows_code_then_tables_then_prose(clock):
    """As the live sweep runs it: one tuner through the three prompt files in turn. Prose after
    tables is the weak part on the calm clock (0.93 over 40 orders; live 0.89): the tuner stays
    near the tables' depth (docs/results/autotune-replay/README.md). Regression bounds."""
    recs = {n: Recording.load(RECORDINGS[clock], costs_of=n) for n in ("code", "table", "prose")}
    parts = judge_stream(AutoDepth, recs, SEEDS)
    for name, ratios in parts.items():
        assert statistics.mean(ratios) >= (0.92 if name != "code" else CODE_BOUNDS[clock][0]), (name, ratios)


def test_one_misleading_round_does_not_put_exploring_off(rec):
    """Early cost estimates rest on a round or two, and a shared machine's round times have
    tails both ways (see the recording's noise quantiles); a visit that seemed to cost
    many rounds' worth must not stop the exploring that corrects them. While drafting is best,
    visits stay at most ``max_explore_every`` rounds apart, on every one of 40 code orders."""

    class Watched(AutoDepth):
        def choose(self) -> int:
            depth = super().choose()
            if self._decision["why"] == "explore" and self._visit_first and self.best != 0:
                starts.append(self.rounds)
            return depth

    longest = []
    for seed in range(40):
        order = list(rec.workloads["code"])
        random.Random(seed).shuffle(order)
        starts: list[int] = []
        tuner = Watched(rec.max_depth, window=rec.window)
        replay(tuner, rec, order, seed=seed)
        longest.append(max(b - a for a, b in zip(starts, starts[1:])))
    assert max(longest) <= tuner.max_explore + tuner.visit_rounds, longest


def test_settle_round_is_strict():
    why = ["probe"] * 2 + ["exploit"] * 6
    assert settle_round([2, 4, 1, 3, 3, 3, 3, 3], why, {3}) == 3
    assert settle_round([2, 4, 3, 3, 3, 3, 3, 1], why, {3}) is None
    assert choice_quality([2, 4, 1, 3], ["probe", "probe", "exploit", "exploit"], {1: 50.0, 3: 100.0}, start=0) == 0.75
    # a depth kept where a change was refused is as much the tuner's choice
    assert choice_quality([2, 4, 1, 3], ["probe", "probe", "stay", "exploit"], {1: 50.0, 3: 100.0}, start=0) == 0.75
    assert settle_round([2, 4, 3, 3, 1, 3], ["probe"] * 2 + ["exploit", "exploit", "stay", "exploit"], {3}) == 5


def _repeats(n: int, seed: int, spread: float = 0.05) -> tuple[dict, dict]:
    """n repeats of 100 tokens for auto and two fixed depths, timed with independent noise:
    depth 4 is the fastest (1 s), depth 6 close behind (1.02 s), auto 3% slower than depth 4"""
    rng = random.Random(seed)
    base = {"auto": 1.03, "4": 1.0, "6": 1.02}
    seconds = {k: [b * (1 + rng.gauss(0, spread)) for _ in range(n)] for k, b in base.items()}
    return {k: [100.0] * n for k in base}, seconds


def test_ratio_over_repeats_pools_repeats_before_dividing():
    tokens = {"auto": [100, 300], "4": [100, 100]}
    seconds = {"auto": [1.0, 2.0], "4": [1.0, 0.5]}
    assert ratio_over_repeats(tokens, seconds, "auto", ["4"]) == pytest.approx((400 / 3.0) / (200 / 1.5))
    assert ratio_over_repeats(tokens, seconds, "auto", ["4"], [1, 1]) == pytest.approx(150 / 200)


def test_repeat_interval_collapses_without_noise_and_narrows_with_repeats():
    tokens, seconds = _repeats(9, seed=1, spread=0.0)
    lo, hi = repeat_interval(tokens, seconds, "auto", ["4", "6"])
    assert lo == pytest.approx(1 / 1.03) and hi == pytest.approx(1 / 1.03)
    widths = []
    for n in (9, 144):
        tokens, seconds = _repeats(n, seed=2)
        lo, hi = repeat_interval(tokens, seconds, "auto", ["4", "6"])
        assert lo <= ratio_over_repeats(tokens, seconds, "auto", ["4", "6"]) <= hi
        widths.append(hi - lo)
    assert widths[1] < widths[0] / 2


def test_repeat_interval_chooses_the_best_depth_in_each_resample():
    # depth 6 is faster in one repeat of three; a resample made of that repeat alone measures
    # auto against depth 6 there, which a fixed choice of depth 4 would miss
    tokens = {k: [100.0] * 3 for k in ("auto", "4", "6")}
    seconds = {"auto": [1.0, 1.0, 1.0], "4": [1.0, 1.0, 1.2], "6": [1.1, 1.1, 0.9]}
    lo, _ = repeat_interval(tokens, seconds, "auto", ["4", "6"], level=0.99)
    assert lo == pytest.approx(0.9)
    lo_fixed, _ = repeat_interval(tokens, seconds, "auto", ["4"], level=0.99)
    assert lo_fixed == pytest.approx(1.0)


class VisitWatch(AutoDepth):
    """AutoDepth that keeps, per exploring visit, the depth it went to, the depth chosen the round
    before (the depth running) and, once the visit ended, how many rounds it put the next one off."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.visits: list[tuple[int, int]] = []  # (visited, running)
        self.waits: list[int] = []  # while drafting was best

    def choose(self) -> int:
        running = self._chose
        depth = super().choose()
        if self._decision["why"] == "explore" and self._visit_first and self._visit_left == self.visit_rounds - 1:
            self.visits.append((depth, running))
        return depth

    def _schedule_after_exploring(self, depth: int, t_round: float, t_catchup: float) -> None:
        super()._schedule_after_exploring(depth, t_round, t_catchup)
        if self._visit is None and self.best != 0:
            self.waits.append(self.next_explore - self.rounds)


def watched_visits(clock: str, workload: str) -> list[VisitWatch]:
    rec = Recording.load(RECORDINGS[clock], costs_of=workload)
    tuners = []
    for seed in range(SEEDS):
        tuner = VisitWatch(rec.max_depth, window=rec.window, graph_replay=rec.graph_replay)
        replay(tuner, rec, prompt_order(rec.workloads[workload], seed), seed=seed)
        tuners.append(tuner)
    return tuners


# Run 3's traces on an H200 (docs/results/gpu/README.md) showed both behaviours below; replayed,
# each is what keeps the GPU's exploring cheap, and changing it alone costs more than it brings:
# stepping from the depth running, gpu-switch code 0.947 -> 0.953 but tables 0.928 -> 0.920 and
# run 1's clock (gpu) code 0.951 -> 0.947 over 40 orders; the wait capped at the exploration
# interval, gpu-switch code 0.947 -> 0.931, tables 0.928 -> 0.911, prose 0.965 -> 0.953 (a visit
# there costs up to a switch, about 850 rounds of a 1% budget). Held as strict expected failures
# so that a change to either is a decision taken with the replay, not by accident.
@pytest.mark.xfail(strict=True, reason="a visit steps from the best depth; the first one, at a sequence's start after "
                   "a refused change, goes to the depth the last sequence ran (fixing it alone loses tables 0.8%)")
def test_on_a_gpu_no_visit_goes_to_the_depth_running():
    visits = [v for t in watched_visits("gpu-switch", "code") for v in t.visits]
    assert visits and not [v for v in visits if v[0] == v[1]], visits


@pytest.mark.xfail(strict=True, reason="a visit's switches are budgeted up to max_wait, past max_explore_every "
                   "(capping it loses code 1.6%, tables 1.7% on the gpu-switch clock)")
def test_on_a_gpu_visits_while_drafting_wait_at_most_the_exploration_interval():
    tuners = watched_visits("gpu-switch", "code")
    waits = [w for t in tuners for w in t.waits]
    assert waits and max(waits) <= tuners[0].max_explore, waits
