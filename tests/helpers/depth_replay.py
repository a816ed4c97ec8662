"""Play a depth policy against recorded acceptance and costs instead of a live pair.

A recording (``scripts/bench/record_acceptance.py``) holds, per prompt of a workload, the match length
L_t of the drafter's proposals at every position t of the greedy output (a round at depth k
accepts min(k, L_t)), and the pair's round costs on the machine that recorded it. A replay
walks through the prompts as the engine would (a round at position t with depth k moves on by
min(k, L_t) + 1 tokens; the depth is capped so a round never passes the end) and charges each
round its cost (a plain step's depends on whether it must read its row for the drafter) times
a noise factor drawn from the recorded spread (where the recording measured the clock's drift,
part of that factor is a slow one shared by successive rounds), plus the extra time of a change
of depth and the drafter's catch-up after plain steps; the policy observes exactly what the
engine would report.
Round i of a replay draws the same noise whatever the policy, so two policies replayed with one
seed meet the same clock. A replay is deterministic per seed and fast: a tuner can be judged
over many prompt orders and noise draws in the time one live benchmark takes.

The recorder's own pieces live here too, so that the tests check them: ``Scripted`` (the fixed
schedule of depths it plays) and ``drift`` (its fit of the clock's slow part).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from laguna_dflash.runtime.drafter import capture_horizon
from laguna_dflash.runtime.tuner import DepthPolicy, FixedDepth

#: The recorded rounds of the bundled pair (scripts/bench/record_acceptance.py writes them).
RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recordings"


@dataclass
class Recording:
    """One workload's match lengths (per prompt) and round costs."""

    workloads: dict[str, list[list[int]]]
    round_s: list[float]  # depth 0: a plain step that reads its row for the drafter
    plain_skip_s: float  # a plain step that need not (see DepthPolicy.plain_rounds_ahead)
    depth_change_s: float
    catchup_s: float
    catchup_per_row_s: float
    noise_quantiles: list[float]
    n_predict: int
    drafter_digest: str = ""
    window: int = 512
    # the clock's slow part: round times on a shared machine (and over prompts of different
    # lengths) drift together, so successive rounds are not independent draws. ``drift_phi``:
    # the lag-one correlation of that slow factor; ``drift_share``: its share of the variance
    # of log(round time / median). 0: every round an independent draw.
    drift_phi: float = 0.0
    drift_share: float = 0.0
    # A backend that replays a captured graph of the last batch shape it ran (CUDA graphs; one per
    # context): after any change of the target's batch shape, a new depth or a prompt's prefill,
    # the first rounds run without it and cost ``change_s`` more each (the first: run directly,
    # the second: captured). The engine then keeps capture on through promised plain stretches.
    graph_replay: bool = False
    change_s: tuple[float, ...] = ()  # default: (depth_change_s,) where positive, the first round only
    # A CPU's caches: the plain steps after a drafting round run dearer for a few more rounds
    # than the first (which ``change_s`` prices); ``plain_settle[i]`` multiplies the time of the
    # (i + 2)-th plain step after one. () : none (the recordings so far).
    plain_settle: tuple[float, ...] = ()

    @classmethod
    def load(cls, path: Path, costs_of: str = "code", plain_settle: tuple[float, ...] | None = None) -> "Recording":
        """The recording at ``path``, with the round costs measured on workload ``costs_of``
        (``plain_settle``: the factors of its field, given instead of the recording's)."""
        raw = json.loads(Path(path).read_text())
        c = raw["costs"][costs_of]
        return cls(workloads=raw["workloads"], round_s=c["round_s"], plain_skip_s=c["plain_skip_s"],
                   depth_change_s=c["depth_change_s"], catchup_s=c["catchup_s"],
                   catchup_per_row_s=c["catchup_per_row_s"], noise_quantiles=c["noise_quantiles"],
                   n_predict=raw["n_predict"], drafter_digest=raw.get("drafter_digest", ""), window=c["window"],
                   drift_phi=c.get("drift_phi", 0.0), drift_share=c.get("drift_share", 0.0),
                   graph_replay=graph_replay(raw.get("placement", "")), change_s=tuple(max(0.0, x) for x in c.get("change_s", ())),
                   plain_settle=tuple(c.get("plain_settle", ())) if plain_settle is None else tuple(plain_settle))

    @property
    def max_depth(self) -> int:
        return len(self.round_s) - 1

    @property
    def horizon(self) -> int:
        return capture_horizon(self.window)

    @property
    def change_costs(self) -> tuple[float, ...]:
        """The extra time of each round after a change of batch shape, the first round first."""
        # a negative single figure (the first round at a new depth the cheaper one, a GPU's) is
        # no saving to be had by changing depth
        return self.change_s or (max(0.0, self.depth_change_s),)


def graph_replay(placement: str) -> bool:
    """Whether a recording's placement (Placement.describe()) runs the target on a GPU."""
    return placement.startswith("target on cuda")


@dataclass
class ReplayResult:
    tokens: int = 0
    seconds: float = 0.0
    rounds: int = 0
    depths: list[int] = field(default_factory=list)  # per round
    why: list[str] = field(default_factory=list)  # per round: the policy's reason
    prompt_seconds: list[float] = field(default_factory=list)  # per prompt

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


class EngineDriven:
    """A policy asked and told as runtime/rounds.py does: after a plain step, the rounds its
    ``plain_stretch`` allows (and the drafter leaves unread) are plain without asking, and their
    times are told together at the stretch's end."""

    def __init__(self, policy: DepthPolicy) -> None:
        self.policy = policy
        self.left, self.times = 0, []

    def choose(self, n_past: int | None) -> tuple[int, bool]:
        """This round's depth, and whether it is a stretch's (unasked); ``n_past`` None: the
        caller tells no context."""
        if self.left:
            self.left -= 1
            return 0, True
        if n_past is not None:
            self.policy.context(n_past)
        return self.policy.choose(), False

    def allow_stretch(self, n_past: int, unread: int) -> int:
        """After an asked plain step: the rounds after it to run without asking."""
        self.left = min(self.policy.plain_stretch(n_past), unread)
        return self.left

    def observe(self, in_stretch: bool, depth: int, accepted: int, t: float, catchup: float) -> None:
        if not in_stretch:
            self.policy.observe(depth, accepted, t, catchup)
            return
        self.times.append(t)
        if not self.left:
            self.stretch_ends()

    def stretch_ends(self) -> None:
        """Tell the stretch's rounds so far (a sequence may end within one: it ends there too)."""
        self.left = 0
        if self.times:
            self.policy.observe_plain_stretch(self.times)
            self.times = []


def replay(policy: DepthPolicy, rec: Recording, prompts: list[list[int]], seed: int = 0,
           noise: bool = True, clocks: list[Recording] | None = None,
           prompt_tokens: list[int] | None = None) -> ReplayResult:
    """Generate ``rec.n_predict`` tokens for each prompt's match lengths, in order, with one policy.
    ``clocks``: per prompt, the recording whose costs apply (a stream of mixed content).
    ``prompt_tokens``: per prompt, its length; the policy is then told each round's context, as
    the engine tells it (the costs do not depend on it)."""
    rng = random.Random(seed)
    drift_rng, slow = random.Random(f"drift-{seed}"), None  # the slow factor: log, AR(1)
    res = ReplayResult()
    driven = EngineDriven(policy)
    last_depth = None
    since_change = 1 << 30  # rounds since the target's batch shape changed
    for n_prompt, lengths in enumerate(prompts):
        rec = clocks[n_prompt] if clocks else rec
        q = rec.noise_quantiles
        changes = rec.change_costs
        if rec.drift_share > 0:
            # the recorded spread split into a slow factor and a fast one (about the same
            # interquartile range: tests/test_tuner_replay.py); constant per clock
            slow_sd = rec.drift_share ** 0.5 * log_spread(q)
            slow_keep, fast_power = (1 - rec.drift_phi ** 2) ** 0.5, (1 - rec.drift_share) ** 0.5
        n_out, pending = 1, 0  # the prefill's token; plain-step rows the drafter has not read
        since_drafting = 1 << 30  # the prompt's pass ran no drafter
        skipping = False  # whether the last plain step skipped its row (capture was off)
        if rec.graph_replay:
            since_change = 0  # the prefill ran another batch shape
        policy.sequence_begins()
        seconds_before = res.seconds
        while n_out < rec.n_predict:
            n_past = (prompt_tokens[n_prompt] if prompt_tokens else 0) + n_out - 1
            depth, in_stretch = driven.choose(n_past if prompt_tokens else None)
            depth = min(depth, rec.n_predict - n_out - 1)
            # as in the engine: a plain step promised to be followed by more plain steps than
            # the drafter reads back does not read its row or leave it for a catch-up; where
            # the backend does not replay graphs, it does not capture it either
            ahead = 0 if in_stretch or depth else policy.plain_rounds_ahead()
            skip = depth == 0 and (in_stretch or ahead >= rec.horizon)
            if depth == 0 and not in_stretch and ahead >= rec.horizon:
                driven.allow_stretch(n_past, int(ahead - rec.horizon))
            t = rec.plain_skip_s if skip and not rec.graph_replay else rec.round_s[depth]
            if noise:
                # inverse-CDF draw between the recorded quantiles of round time / median
                u = rng.random() * (len(q) - 1)
                i = int(u)
                factor = q[i] + (q[min(i + 1, len(q) - 1)] - q[i]) * (u - i)
                if rec.drift_share > 0:
                    step = drift_rng.gauss(0.0, slow_sd)
                    slow = step if slow is None else rec.drift_phi * slow + slow_keep * step
                    factor = factor ** fast_power * math.exp(slow)
                t *= factor
            if (last_depth is not None and depth != last_depth) or (skipping and depth == 0 and not skip):
                since_change = 0  # a new batch shape, or capture switched back on: the graphs change
            if since_change < len(changes):
                t += changes[since_change]
            since_change += 1
            since_drafting = 0 if depth else since_drafting + 1
            if 2 <= since_drafting <= len(rec.plain_settle) + 1:
                t *= rec.plain_settle[since_drafting - 2]
            skipping = skip and not rec.graph_replay
            catchup = 0.0
            if depth == 0:
                accepted = 0
                pending = 0 if skip else pending + 1
            else:
                accepted = min(depth, lengths[n_out - 1])
                if pending:
                    catchup = rec.catchup_s + rec.catchup_per_row_s * min(pending, rec.horizon)
                pending = 0
            driven.observe(in_stretch, depth, accepted, t, catchup)
            res.depths.append(depth)
            res.why.append(policy.decision().get("why", ""))
            res.rounds += 1
            res.seconds += t + catchup
            n_out += accepted + 1
            last_depth = depth
        driven.stretch_ends()  # the sequence may end within a plain stretch
        res.tokens += n_out
        res.prompt_seconds.append(res.seconds - seconds_before)
    return res


def log_spread(quantiles: list[float]) -> float:
    """A robust standard deviation of log(round time / median): the interquartile range / 1.349."""
    n = len(quantiles) - 1
    return (math.log(quantiles[3 * n // 4]) - math.log(quantiles[n // 4])) / 1.349


# -- judging a tuner's choices (shared by the replay and the live benchmark)

SETTLE_ROUNDS = 64  # issue 7: the tuner settles within this many rounds
GOOD_FRACTION = 0.95  # a depth within 5% of the best fixed depth's speed is a good choice
#: The policy's reasons for a round at the depth it runs: its best depth, or the depth it keeps
#: where a change to the best would not pay (a refused change is a choice as much as the best is).
EXPLOITING = ("exploit", "stay")


@dataclass
class Judgement:
    """A tuner replayed on one workload, per seed (seed 0: the prompts' own order; the others
    shuffle it, and each seed draws its own noise, the same for the tuner and every fixed depth)."""

    vs_best_fixed: list[float]  # tokens/s against the best fixed depth's on the same stream
    vs_plain: list[float]
    choice_quality: list[float]  # see choice_quality()
    settle_round: list[int | None]  # see settle_round()


def prompt_order(prompts: list[list[int]], seed: int) -> list[list[int]]:
    """Seed 0: the prompt file's order; any other seed: a shuffle of it."""
    order = list(prompts)
    if seed:
        random.Random(seed).shuffle(order)
    return order


def judge(make_policy, rec: Recording, prompts: list[list[int]], seeds: int) -> Judgement:
    """Replay ``make_policy(rec.max_depth, window=rec.window, graph_replay=rec.graph_replay)``
    and every fixed depth on ``seeds`` orders of ``prompts``."""
    out = Judgement([], [], [], [])
    for seed in range(seeds):
        order = prompt_order(prompts, seed)
        fixed = {k: replay(FixedDepth(k), rec, order, seed=seed).tokens_per_s for k in range(rec.max_depth + 1)}
        best = max(fixed.values())
        r = replay(make_policy(rec.max_depth, window=rec.window, graph_replay=rec.graph_replay), rec, order, seed=seed)
        out.vs_best_fixed.append(r.tokens_per_s / best)
        out.vs_plain.append(r.tokens_per_s / fixed[0])
        out.choice_quality.append(choice_quality(r.depths, r.why, fixed))
        out.settle_round.append(settle_round(r.depths, r.why, {k for k, v in fixed.items() if v >= GOOD_FRACTION * best}))
    return out


def judge_stream(make_policy, recs: dict[str, Recording], seeds: int) -> dict[str, list[float]]:
    """One tuner through a stream of workloads in turn (e.g. code, then tables, then prose),
    each prompt timed on its own workload's clock: per workload and seed, the tuner's tokens/s
    over that workload's prompts against the best fixed depth's on them. This is what following
    a change of content costs; ``judge`` replays each workload from a fresh tuner."""
    names = list(recs)
    out: dict[str, list[float]] = {n: [] for n in names}
    first = recs[names[0]]
    for seed in range(seeds):
        stream, clocks, segment = [], [], []
        for n in names:
            order = prompt_order(recs[n].workloads[n], seed)
            stream += order
            clocks += [recs[n]] * len(order)
            segment += [n] * len(order)
        r = replay(make_policy(first.max_depth, window=first.window, graph_replay=first.graph_replay), first, stream,
                   seed=seed, clocks=clocks)
        for n in names:
            prompts = [p for p, s in zip(stream, segment) if s == n]
            secs = sum(t for t, s in zip(r.prompt_seconds, segment) if s == n)
            best = max(replay(FixedDepth(k), recs[n], prompts, seed=seed).tokens_per_s
                       for k in range(first.max_depth + 1))
            out[n].append(len(prompts) * recs[n].n_predict / secs / best)
    return out


def choice_quality(depths: list[int], why: list[str], rate: dict[int, float], start: int = SETTLE_ROUNDS) -> float:
    """Mean, over the exploiting rounds from ``start`` on, of the chosen depth's fixed-depth speed
    relative to the best fixed depth's (1.0: every round at the best depth). Depths without a
    fixed-depth speed take their timed neighbours' interpolation; past the deepest timed depth,
    that depth's speed."""
    best = max(rate.values())
    known = sorted(rate)

    def speed(d: int) -> float:
        if d in rate:
            return rate[d]
        if d > known[-1]:
            return rate[known[-1]]
        lo = max(k for k in known if k < d)
        hi = min(k for k in known if k > d)
        return rate[lo] + (rate[hi] - rate[lo]) * (d - lo) / (hi - lo)

    picked = [speed(d) / best for r, (d, w) in enumerate(zip(depths, why)) if r >= start and w in EXPLOITING]
    return sum(picked) / len(picked) if picked else 0.0


def settle_round(depths: list[int], why: list[str], good: set[int]) -> int | None:
    """Strictly: the first round after which every exploiting round uses a good depth (None:
    never). A stream of prompts whose best depths differ keeps a content-following tuner from
    settling by this definition; ``choice_quality`` is the measure that tolerates it."""
    last_bad = -1
    for r, (d, w) in enumerate(zip(depths, why)):
        if w in EXPLOITING and d not in good:
            last_bad = r
    return None if last_bad == len(depths) - 1 else last_bad + 1


def ratio_over_repeats(tokens: dict[str, list[float]], seconds: dict[str, list[float]], key: str,
                       against: list[str], repeats: list[int] | None = None) -> float:
    """tokens/s of ``key`` over the given repeats (all by default) against the fastest of
    ``against`` over the same repeats; ``tokens[k][r]``, ``seconds[k][r]``: repeat r's totals."""
    idx = range(len(tokens[key])) if repeats is None else repeats

    def rate(k: str) -> float:
        return sum(tokens[k][r] for r in idx) / sum(seconds[k][r] for r in idx)

    return rate(key) / max(rate(k) for k in against)


def repeat_interval(tokens: dict[str, list[float]], seconds: dict[str, list[float]], key: str,
                    against: list[str], level: float = 0.9, resamples: int = 2000,
                    seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval for ``ratio_over_repeats``, resampling whole repeats (a
    repeat is one tuner's stream through every prompt, timed alongside every fixed depth). The
    fastest of ``against`` is chosen again in each resample, so the interval carries the
    uncertainty of which depth is best, not only of how fast it is."""
    n = len(tokens[key])
    rng = random.Random(seed)
    ratios = sorted(ratio_over_repeats(tokens, seconds, key, against, [rng.randrange(n) for _ in range(n)])
                    for _ in range(resamples))
    tail = (1.0 - level) / 2
    return ratios[int(tail * (resamples - 1))], ratios[int(round((1.0 - tail) * (resamples - 1)))]


class Scripted(DepthPolicy):
    """Plays a fixed list of depths (the last one repeats) and keeps what each round reported."""

    def __init__(self, schedule: list[int], ahead: int = 0) -> None:
        self.schedule, self.log, self.ahead = schedule, [], ahead

    def plain_rounds_ahead(self) -> int:
        return self.ahead

    def choose(self) -> int:
        return self.schedule[min(len(self.log), len(self.schedule) - 1)]

    def observe(self, depth: int, accepted: int, t_round: float, t_catchup: float = 0.0) -> None:
        self.log.append((depth, accepted, t_round, t_catchup))


def drift(runs: list[list[float]]) -> dict:
    """The slow part of the clock, from runs of successive rounds (each round's time over its
    depth's median): the autocorrelation of log(ratio) at lag L is taken as share * phi**L (a
    slow AR(1) factor plus independent noise), fitted from lags 1 and 4."""

    def acf(lag: int) -> float:
        num = den = 0.0
        for run in runs:
            x = np.clip(np.log(np.asarray(run)), -0.5, 0.5)  # a stall is not drift
            x = x - x.mean()
            num += float(np.dot(x[:-lag], x[lag:]))
            den += float(np.dot(x, x)) * (len(x) - lag) / len(x)
        return num / den if den > 0 else 0.0
    a1, a4 = acf(1), acf(4)
    if a1 <= 0 or a4 <= 0:
        return {"drift_phi": 0.0, "drift_share": 0.0, "acf": [a1, a4]}
    phi = min(0.99, (a4 / a1) ** (1 / 3))
    return {"drift_phi": phi, "drift_share": min(1.0, a1 / phi), "acf": [a1, a4]}


# -- several sequences in one pass (runtime/batch.py, runtime/tuner/batch.py)

@dataclass
class PassClock:
    """The wall time of one batched round: a target pass over every sequence's rows, a drafter
    pass per drafting sequence, host work per sequence; ``depth_change_s`` when the pass's row
    count differs from the last one (llama.cpp rebuilds its graphs for a new batch shape).
    Sequences of different row counts split the pass: with a KV stream per sequence llama.cpp
    puts the same number of rows of each sequence in a microbatch, so a pass runs one
    microbatch per distinct row count, each paying the fixed part ``pass_s`` (measured on the
    code pair at 4 sequences, ``-t 2``: depths 2, 2, 4, 8 took 22 ms a round, 4, 4, 4, 4 took 14)."""

    pass_s: float  # a target pass's fixed part
    row_s: float  # each row of it
    draft_s: float  # a drafter pass's fixed part
    draft_row_s: float  # each draft of it
    host_s: float  # per sequence and round
    depth_change_s: float = 0.0

    def seconds(self, depths: list[int]) -> float:
        rows = sum(d + 1 for d in depths)
        drafting = [d for d in depths if d > 0]
        return (self.pass_s * len(set(depths)) + self.row_s * rows + len(drafting) * self.draft_s + self.draft_row_s * sum(drafting)
                + self.host_s * len(depths))


@dataclass
class BatchResult:
    tokens: int = 0
    seconds: float = 0.0
    rounds: int = 0
    depths: list[list[int]] = field(default_factory=list)  # per round, per running sequence
    unasked: int = 0  # passes of plain stretches after their planned one

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def replay_batch(policies: list[DepthPolicy], clock: PassClock, streams: list[list[list[int]]], n_predict: int,
                 noise: list[float] | None = None, seed: int = 0, planner=None,
                 prompt_tokens: int = 96) -> BatchResult:
    """Sequences in one pass, each through its stream of prompts' match lengths (n_predict tokens
    each after a prompt of ``prompt_tokens``), every round one pass over all of them, until one
    stream runs out (so every pass is as wide: the steady state of a busy server);
    ``policies[i]`` chooses sequence i's depth. ``planner`` (runtime.tuner.batch.BatchPlanner,
    whose slot policies ``policies`` are) plans each pass before the sequences choose and is told
    its time after, as runtime/batch.py does, plain stretches included: after a planned plain
    pass the passes its ``plain_stretch`` allows run unplanned and unasked, told together at the
    stretch's end, which a sequence's next prompt brings early. Each policy is told its
    sequence's context, and observes the pass's time as its round's (what a sequence's own tuner
    sees)."""
    rng = random.Random(seed)
    res = BatchResult()
    where = [[0, 1] for _ in streams]  # per sequence: prompt index, tokens out of it
    last_rows = None
    running = list(range(len(streams)))
    stretch: list[float] = []  # a plain stretch under way: its passes' times, the planned one first

    def end_stretch() -> None:
        planner.stretch_ends(stretch)
        for i in running:  # each sequence played the planned pass as a round of its own
            policies[i].observe_plain_stretch(stretch[1:])
        stretch.clear()

    while True:
        if any(where[i][0] >= len(s) for i, s in enumerate(streams)):
            if stretch:
                end_stretch()
            return res
        unasked = bool(stretch)
        if unasked:
            depths = [0] * len(running)
        else:
            for i in running:
                policies[i].context(prompt_tokens + where[i][1])
            context = sum(prompt_tokens + where[i][1] for i in running)
            if planner is not None:
                planner.plan(running, 0, context)
            depths = [min(policies[i].choose(), n_predict - where[i][1] - 1) for i in running]
        t = clock.seconds(depths)
        rows = sum(d + 1 for d in depths)
        if last_rows is not None and rows != last_rows:
            t += clock.depth_change_s
        last_rows = rows
        if noise:
            u = rng.random() * (len(noise) - 1)
            j = int(u)
            t *= noise[j] + (noise[min(j + 1, len(noise) - 1)] - noise[j]) * (u - j)
        next_prompt = False
        for i, d in zip(running, depths):
            p, n_out = where[i]
            accepted = min(d, streams[i][p][n_out - 1]) if d else 0
            if not unasked:
                policies[i].observe(d, accepted, t)
            n_out += accepted + 1
            res.tokens += accepted + 1
            next_prompt |= n_out >= n_predict
            where[i] = [p + 1, 1] if n_out >= n_predict else [p, n_out]
        if planner is not None:
            if unasked:
                stretch.append(t)
                res.unasked += 1
                planner.stretch_left -= 1
                if next_prompt or not planner.stretch_left:
                    end_stretch()
            elif not any(depths) and planner.current is not None and not next_prompt and (
                    n := planner.plain_stretch(context)):
                planner.stretch_left, planner.stretch_slots = n, tuple(running)
                stretch.append(t)
            else:
                planner.observe(dict(zip(running, depths)), 0, t)
        res.seconds += t
        res.rounds += 1
        res.depths.append(depths)
