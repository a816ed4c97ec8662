"""Depths for several sequences in one pass (runtime/tuner/batch.py), replayed on the laguna-tiny
pair's recorded acceptance (issue 48: ``auto`` picks each round's depths from the cost of the
whole pass).

The pass clock is the calm recording's (tests/fixtures/recordings/replay-calm.json): a plain
step 2.78 ms and each depth about 0.65 ms more, split as a target pass of 2.12 ms plus 0.52 ms a
row, a drafter pass of 0.23 ms plus 0.14 ms a draft, 0.14 ms of host work per sequence (the
drafter and host parts from tests/test_tuner_context.py's measurements), with the recorded
noise and its depth-change cost: one more sequence in a pass costs what one more verify row does,
and a pass runs one microbatch, paying the target pass's fixed part, per distinct row count
among its sequences (a KV stream per sequence: helpers.depth_replay.PassClock).
"""

from __future__ import annotations

import functools
import statistics

import pytest

from helpers.depth_replay import RECORDED, PassClock, Recording, prompt_order, replay_batch
from laguna_dflash.runtime.tuner import AutoDepth, FixedDepth
from laguna_dflash.runtime.tuner.batch import BatchPlanner

CLOCK = PassClock(pass_s=2.12e-3, row_s=0.52e-3, draft_s=0.23e-3, draft_row_s=0.14e-3, host_s=0.14e-3,
                  depth_change_s=0.7e-3)
SEEDS = 6
MIXES = {"code": ["code"] * 4, "code+degraded": ["code", "degraded"] * 2,
         "four kinds": ["code", "table", "prose", "degraded"]}


@functools.cache
def recording() -> Recording:
    return Recording.load(RECORDED / "replay-calm.json")


def streams(mix: str, seed: int) -> list[list[list[int]]]:
    rec = recording()
    return [prompt_order(rec.workloads[w], 7 * seed + i) for i, w in enumerate(MIXES[mix])]


def planned(mix: str, seed: int):
    rec = recording()
    planner = BatchPlanner(rec.max_depth, rec.window)
    n = len(MIXES[mix])
    return replay_batch([planner.slot(i) for i in range(n)], CLOCK, streams(mix, seed), rec.n_predict,
                        rec.noise_quantiles, seed, planner=planner)


def solo_planned(mix: str, seed: int):
    """What each sequence's own tuner does in the batch: it times its rounds, which last the pass."""
    rec = recording()
    n = len(MIXES[mix])
    return replay_batch([AutoDepth(rec.max_depth, window=rec.window) for _ in range(n)], CLOCK,
                        streams(mix, seed), rec.n_predict, rec.noise_quantiles, seed)


@functools.cache
def best_fixed(mix: str, seed: int) -> float:
    """The best depth every sequence plays, tokens/s."""
    rec = recording()
    n = len(MIXES[mix])
    return max(replay_batch([FixedDepth(k)] * n, CLOCK, streams(mix, seed), rec.n_predict, rec.noise_quantiles,
                            seed).tokens_per_s for k in range(rec.max_depth + 1))


def test_one_sequence_plans_as_its_own_tuner_does():
    """With one sequence the pass is its round: the planner's choices are AutoDepth's, round by round."""
    rec = recording()
    prompts = [prompt_order(rec.workloads["code"], 3)]
    planner = BatchPlanner(rec.max_depth, rec.window)
    a = replay_batch([planner.slot(0)], CLOCK, prompts, rec.n_predict, rec.noise_quantiles, 1, planner=planner)
    b = replay_batch([AutoDepth(rec.max_depth, window=rec.window)], CLOCK, prompts, rec.n_predict,
                     rec.noise_quantiles, 1)
    assert a.depths == b.depths and a.rounds > 200


def test_a_pass_is_timed_only_as_planned():
    planner = BatchPlanner(max_depth=4)
    assert planner.plan([2, 0], other_rows=0, context=200) == [2, 2]  # the first probe, for both
    pd = planner.current
    assert set(planner.passes) == {(2, 0)} and pd.max_depth == 4
    planner.observe({0: 2, 1: 2}, 0, 0.01)  # other sequences than planned
    planner.plan([0, 2], 0, 200)
    planner.observe({0: 2, 2: 2}, 0, 0.01, timed=False)  # it prefilled a prompt too
    planner.plan([0, 2], 0, 200)
    planner.observe({0: 2, 2: 1}, 0, 0.01)  # one sequence cut its depth at its end: two microbatches
    assert pd.rounds == 0 and not pd.costs.cost
    for _ in range(pd.probe_rounds):  # the first round of a probe is untimed (graph rebuilds)
        assert planner.plan([0, 2], 0, 200) == [2, 2]
        planner.observe({0: 2, 2: 2}, 0, 0.01)
    assert pd.rounds == pd.probe_rounds and pd.costs.medians() == {2: 0.01}
    planner.plan([0, 2], other_rows=5, context=200)  # a fixed-depth sequence beside them: another pass
    assert planner.current is not pd and set(planner.passes) == {(2, 0), (2, 5)}


def _time_four_where_plain_is_best(planner: BatchPlanner) -> None:
    """200 timed passes of four sequences: plain 4 ms a pass, each draft 3.5 ms more, a draft or
    so accepted a round, so plain is best."""
    four = [0, 1, 2, 3]
    for _ in range(200):
        depths = planner.plan(four, other_rows=0, context=400)
        for i, d in zip(four, depths):
            planner.slot(i).observe(d, min(d, 1), 0.0)
        planner.observe(dict(zip(four, depths)), 0, 0.004 + 0.0035 * depths[0])


def test_a_plain_stretch_of_a_pass_counts_each_sequences_positions():
    """Where plain decoding leads a pass of four, the planner lets the passes before the next
    visit run without a plan, within the context band of the pass: each pass adds a position to
    each of its sequences (four here), so 40 positions below the band's end (512) leave 9
    passes. The planned pass and its stretch told together leave the pass's planner as when
    told one by one."""
    planner = BatchPlanner(max_depth=8)
    _time_four_where_plain_is_best(planner)
    four, pd = [0, 1, 2, 3], planner.passes[(4, 0)]
    for _ in range(400):
        depths = planner.plan(four, other_rows=0, context=512 - 40)
        if depths == [0] * 4 and pd.plain_rounds_ahead() >= 20:
            break
        planner.observe(dict(zip(four, depths)), 0, 0.004 + 0.0035 * depths[0])
    assert depths == [0] * 4 and pd.plain_rounds_ahead() >= 20
    assert planner.plain_stretch(512 - 40) == 9
    assert planner.plain_stretch(400) == min(16, pd.plain_rounds_ahead())  # STRETCH_ROUNDS
    rounds, chosen = pd.rounds, dict(pd.chosen)
    planner.stretch_ends([0.004] * 10)
    assert pd.rounds == rounds + 10 and pd.chosen[0] == chosen[0] + 9  # the planned pass chose once
    assert pd.costs.recent(0, 10) == pytest.approx(0.004)


def _plan_three_untimed(planner: BatchPlanner) -> list[int]:
    """40 passes of three sequences, none timed (each follows a prompt's pass): their depths."""
    three = []
    for _ in range(40):
        depths = planner.plan([0, 1, 2], other_rows=0, context=300)
        assert len(set(depths)) == 1
        three.append(depths[0])
        planner.observe(dict.fromkeys([0, 1, 2], three[-1]), 0, 0.003, timed=False)
    return three


def test_a_pass_of_a_new_width_starts_from_the_nearest_timed_one():
    """Four sequences timed: plain 4 ms a pass, depth 4 18 ms, acceptance that makes plain best.
    A pass of three (the fourth's prompt decoding) plans plain at once and keeps it, though none
    of its passes is ever timed (each follows that prompt's pass); with probes of its own it
    drafted at depths 2 and 4 for ever (live at 4 streams: 22 such passes over 3 repetitions)."""
    planner = BatchPlanner(max_depth=8)
    _time_four_where_plain_is_best(planner)
    wide = planner.passes[(4, 0)]
    assert wide.best == 0 and wide.costs.medians()[0] == pytest.approx(0.004)
    three = _plan_three_untimed(planner)
    assert three[0] == 0 and sum(d > 0 for d in three) <= 2, three  # at most one visit
    assert planner.passes[(3, 0)].costs.medians()[0] == pytest.approx(0.003)  # four's 4 ms, scaled to three


def test_a_width_planned_before_any_pass_was_timed_leaves_its_probes_once_one_is():
    """The first passes of a batch run fewer sequences (the others' prompts still decoding), so
    those widths are planned before any width was timed and start with probes; if their passes
    are never timed they drafted at the first probe's depth for ever (live at 4 streams after
    patch 0026: a pass of three at depth 2 in every repetition, where plain cost a quarter)."""
    planner = BatchPlanner(max_depth=8)
    assert planner.plan([0, 1, 2], other_rows=0, context=100) == [2, 2, 2]  # a probe: nothing timed yet
    planner.observe(dict.fromkeys([0, 1, 2], 2), 0, 0.01, timed=False)
    _time_four_where_plain_is_best(planner)
    assert planner.passes[(4, 0)].best == 0
    three = _plan_three_untimed(planner)
    assert three[0] == 0 and sum(d > 0 for d in three) <= 2, three
    assert not planner.passes[(3, 0)].probing


@pytest.mark.parametrize("mix", MIXES)
def test_planning_the_pass_beats_each_sequence_planning_alone(mix):
    """Each sequence's own tuner counts the pass as its cost and its extra rows as nobody's: it
    drafts deeper than is best for the pass, and other sequences' changes move its samples. The
    planner must win clearly (this fails if the batch falls back to per-sequence planning)."""
    gains = [planned(mix, s).tokens_per_s / solo_planned(mix, s).tokens_per_s for s in range(SEEDS)]
    assert statistics.mean(gains) >= 1.04, gains


@pytest.mark.parametrize("mix,bound", [("code", 0.95), ("code+degraded", 0.97), ("four kinds", 0.95)])
def test_planning_the_pass_keeps_up_with_the_best_fixed_depth(mix, bound):
    """Within a few percent of the best depth all of them play, on like and on mixed sequences.
    With drafts given to the sequences that accepted most (so depths unequal within a pass, each
    distinct depth a microbatch of its own) this was 0.83, 0.93 and 0.93."""
    vs = [planned(mix, s).tokens_per_s / best_fixed(mix, s) for s in range(SEEDS)]
    assert statistics.mean(vs) >= bound, vs
    assert min(vs) >= bound - 0.07, vs


def test_every_sequence_of_a_pass_drafts_one_depth():
    """One microbatch a pass, also beside sequences that accept little: a round's depths differ
    only where a sequence's depth was cut at the end of its output (four seeds: plain decoding
    leads this mix, so one seed drafts in too few passes to say)."""
    drafting = [d for s in range(4) for d in planned("four kinds", s).depths if max(d) > 0]
    uneven = [d for d in drafting if len(set(d)) > 1]
    assert len(drafting) > 50 and len(uneven) < 0.1 * len(drafting), (len(uneven), len(drafting))


def test_a_plan_never_drafts_deeper_than_the_pass_bound():
    """``deepest`` bounds every plan, also once the costs say deeper passes pay (here a row
    costs nothing and every draft is accepted): 1-8 sequences, 16 rows a pass at most."""
    for n in range(1, 9):
        planner = BatchPlanner(max_depth=15)
        deepest = 16 // n - 1
        seen = set()
        for _ in range(60):
            depths = planner.plan(list(range(n)), other_rows=0, context=100, deepest=deepest)
            assert len(depths) == n and len(set(depths)) == 1 and n * (depths[0] + 1) <= 16, (n, depths)
            seen.add(depths[0])
            for i, d in enumerate(depths):
                planner.slot(i).observe(d, d, 0.01)
            planner.observe(dict(enumerate(depths)), 0, 0.01)
        assert max(seen) == deepest, (n, seen)
    assert BatchPlanner(max_depth=15).plan(list(range(17)), 0, 100, deepest=0) == [0] * 17


def test_on_a_gpu_one_sequence_plans_as_its_own_gpu_tuner_does():
    """With graphs replayed (a GPU: runtime/batch.py passes ``graph_replay``), one sequence's
    pass is planned by AutoDepth's GPU rules, round by round."""
    rec = recording()
    prompts = [prompt_order(rec.workloads["code"], 3)]
    planner = BatchPlanner(rec.max_depth, rec.window, graph_replay=True)
    a = replay_batch([planner.slot(0)], CLOCK, prompts, rec.n_predict, rec.noise_quantiles, 1, planner=planner)
    b = replay_batch([AutoDepth(rec.max_depth, window=rec.window, graph_replay=True)], CLOCK, prompts,
                     rec.n_predict, rec.noise_quantiles, 1)
    assert a.depths == b.depths and a.rounds > 200
    assert a.depths != replay_batch([AutoDepth(rec.max_depth, window=rec.window)], CLOCK, prompts, rec.n_predict,
                                    rec.noise_quantiles, 1).depths


def test_a_pass_where_a_sequence_begins_tells_its_gpu_tuner():
    """On a GPU a sequence's first pass after its prompt changes shape anyway, so its depth may
    change there freely (AutoDepth.sequence_begins): the planner passes that on."""
    planner = BatchPlanner(max_depth=8, window=512, graph_replay=True)
    planner.plan([0], other_rows=0, context=200)
    pd = planner.current
    for _ in range(5):
        planner.observe({0: planner.slot(0).choose()}, other_rows=0, seconds=2e-3)
        planner.plan([0], other_rows=0, context=200)
    assert pd._seq_rounds == 5
    planner.plan([0], other_rows=0, context=200, begins=True)
    assert pd._seq_rounds == 0 and pd._seq_lengths[-1] > 0


def test_a_replayed_plain_stretch_leaves_the_passes_depths_as_when_planned_each_pass():
    """The batched replays run the planner's plain stretches as runtime/batch.py does (unplanned,
    unasked, told at their end). On a clock without noise, where the incumbent's watch, the one
    rule that sees a stretch's passes late, sees no move, every pass's depths are those of a
    planner asked every pass, and most of its plain passes ran in stretches."""
    rec = recording()
    for seed in range(3):
        order = [prompt_order(rec.workloads["degraded"], 7 * seed + i) for i in range(4)]
        runs = []
        for stretching in (True, False):
            planner = BatchPlanner(rec.max_depth, rec.window)
            if not stretching:
                planner.plain_stretch = lambda context: 0
            runs.append(replay_batch([planner.slot(i) for i in range(4)], CLOCK, order, rec.n_predict,
                                     None, seed, planner=planner))
        told, asked = runs
        assert told.depths == asked.depths and asked.unasked == 0, seed
        plain = sum(1 for depths in told.depths if not any(depths))
        assert told.unasked >= 0.5 * plain, (seed, told.unasked, plain)
