"""laguna-run's engine on the tiny f32 pair: greedy exactness, forced accept lengths with
rollback checks, the output distribution of sampling, stops, and refused pairs."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from helpers import synthetic
from helpers.prefill_read import read_at_prefill
from laguna_dflash.convert import converter
from laguna_dflash.convert.drafter_info import pairing_problems, read_drafter_gguf
from laguna_dflash.convert.target import read_target as read_target_info
from laguna_dflash.runtime.cli import main as cli_main
from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions
from laguna_dflash.runtime.llama import Model
from laguna_dflash.runtime.sampling import SamplingParams
from laguna_dflash.runtime.tuner import DepthPolicy

WINDOW = 24


def make_drafter(tmp: Path, name: str, target_gguf: Path, **kw) -> Path:
    args = dict(hidden=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, intermediate=96,
                target_layer_ids=(0, 2, 5), num_target_layers=6, vocab_size=512, sliding_window=WINDOW,
                dtype="f32", seed=11)
    args.update(kw)
    hf = synthetic.write_drafter(tmp / name, **args)
    out = tmp / f"{name}.gguf"
    converter.convert(hf, read_target_info(target_gguf), out, converter.OutType.F32)
    return out


@pytest.fixture(scope="module")
def drafter_gguf(tmp_path_factory, tiny_target):
    return make_drafter(tmp_path_factory.mktemp("engine"), "d", tiny_target["gguf"])


@pytest.fixture(scope="module")
def target(tiny_target):
    with Model(tiny_target["gguf"]) as m:
        yield m


def engine_for(target, drafter, n_ubatch=512):
    return Engine(target, drafter, EngineConfig(n_ctx=1024, n_batch=512, n_ubatch=n_ubatch, kv_type="f32"))


PROMPT = [int(t) for t in np.random.default_rng(5).integers(16, 512, size=3 * WINDOW)]  # longer than the window


@pytest.mark.parametrize("n_ubatch", [7, 512])
def test_greedy_speculative_equals_plain_greedy(target, drafter_gguf, n_ubatch):
    with engine_for(target, drafter_gguf, n_ubatch) as eng:
        plain = eng.generate(PROMPT, GenerateOptions(n_predict=48, n_max=0))
        assert plain.stats.n_generated == 48
        for depth in (1, 2, 4, 8, 15):
            spec = eng.generate(PROMPT, GenerateOptions(n_predict=48, n_max=depth))
            assert spec.tokens == plain.tokens, f"n_max {depth}, n_ubatch {n_ubatch}"
            assert spec.stats.drafted > 0


class Oracle:
    """Proposes the known greedy continuation, wrong at a chosen index, cycling through accept
    lengths 0, 1, 2 and full; records what it forced."""

    def __init__(self, engine: Engine, reference: list[int], n_prompt: int, schedule=(0, 1, 2, None)):
        self.engine, self.ref, self.n_prompt, self.schedule = engine, reference, n_prompt, schedule
        self.forced: list[int] = []
        self.real_draft = engine.drafter.draft

    def __call__(self, bonus: int, depth: int) -> list[int]:
        self.real_draft(bonus, depth)  # exercise the real drafter's cache handling too
        n_past = self.engine.drafter.n_context  # position of the bonus
        start = n_past - self.n_prompt + 1  # index in the generated tokens of the first draft
        want = self.ref[start:start + depth]
        wrong_at = self.schedule[len(self.forced) % len(self.schedule)]
        drafts = list(want) + [0] * (depth - len(want))
        if wrong_at is not None and wrong_at < depth:
            drafts[wrong_at] = (drafts[wrong_at] + 1) % 512
            self.forced.append(wrong_at)
        else:
            self.forced.append(depth)
        return drafts


def test_forced_accept_lengths_keep_output_exact_and_caches_consistent(target, drafter_gguf):
    with engine_for(target, drafter_gguf) as eng:
        ref = eng.generate(PROMPT, GenerateOptions(n_predict=60, n_max=0)).tokens
        oracle = Oracle(eng, ref, len(PROMPT))
        eng.drafter.draft = oracle
        rounds = []

        def check(r):
            # after each round: the target keeps exactly [0, n_past), the drafter the same context
            assert eng.ctx.pos_max() == r["n_past"] - 1
            if r["depth"] > 0:  # plain steps (only at the very end here) inject lazily
                assert eng.drafter.n_context == r["n_past"]
                assert eng.drafter.ctx.pos_max() == r["n_past"] - 1
                rounds.append(r["accepted"])

        out = eng.generate(PROMPT, GenerateOptions(n_predict=60, n_max=4, trace=check))
        assert out.tokens == ref
        assert rounds == oracle.forced[:len(rounds)]
        assert {0, 1, 2, 4} <= set(rounds)


class PlainThenDraft(DepthPolicy):
    """Plain steps for the first ``n_plain`` rounds, then depth 4; says how many plain rounds
    remain (``honest``) or never promises any."""

    def __init__(self, n_plain: int, honest: bool):
        self.n_plain, self.honest, self.r = n_plain, honest, -1

    def choose(self) -> int:
        self.r += 1
        return 0 if self.r < self.n_plain else 4

    def plain_rounds_ahead(self) -> int:
        return max(0, self.n_plain - self.r - 1) if self.honest else 0


def stretch_runs(eng, ref: list[int], runs: dict) -> tuple[dict, dict]:
    """Per key of ``runs`` (a policy and the drafter's keep_capture), one generation in turn:
    its drafts (its tokens must be ``ref``) and the switches of capture during it."""
    d = eng.drafter
    drafts, switches, real_set_capture = {}, {}, d.set_capture

    def spy(on: bool) -> None:
        if on != d.capturing:
            switches[key].append(on)
        real_set_capture(on)

    d.set_capture = spy
    for key, (policy, keep) in runs.items():
        seen, switches[key] = [], []
        d.keep_capture = keep
        out = eng.generate(PROMPT, GenerateOptions(n_predict=4 * WINDOW, n_max=policy,
                                                   trace=lambda r: seen.append(r["drafted"]) if r["depth"] else None))
        assert out.tokens == ref
        drafts[key] = seen
    d.set_capture, d.keep_capture = real_set_capture, False
    return drafts, switches


def test_plain_steps_skip_only_rows_the_drafter_can_no_longer_see(target, drafter_gguf):
    """When the policy promises a long run of plain steps, their rows are neither captured nor
    fed to the drafter; the drafts afterwards must be exactly those of a drafter that got every
    row."""
    with engine_for(target, drafter_gguf) as eng:
        ref = eng.generate(PROMPT, GenerateOptions(n_predict=4 * WINDOW, n_max=0)).tokens
        drafts, switches = stretch_runs(eng, ref, {honest: (PlainThenDraft(3 * WINDOW, honest), False)
                                                   for honest in (True, False)})
    assert drafts[True] and drafts[True] == drafts[False]
    # capture on for the prompt (plain decoding had it off), off for the promised stretch, on
    # again for the window's rows; without a promise it stays on throughout
    assert switches[True] == [True, False, True] and switches[False] == []


def test_where_graphs_replay_capture_stays_on_through_a_promised_stretch(target, drafter_gguf):
    """On a backend that replays graphs (a GPU: Engine.graph_replay) a switch of capture costs
    the next two steps their replayed graph, so the drafter keeps capture on through a promised
    stretch of plain steps; their rows are still skipped, and the drafts afterwards are exactly
    those of a drafter that switched capture off."""
    with engine_for(target, drafter_gguf) as eng:
        assert not eng.graph_replay and not eng.drafter.keep_capture  # this machine's CPU
        ref = eng.generate(PROMPT, GenerateOptions(n_predict=4 * WINDOW, n_max=0)).tokens
        drafts, switches = stretch_runs(eng, ref, {keep: (PlainThenDraft(3 * WINDOW, True), keep)
                                                   for keep in (False, True)})
    assert drafts[True] and drafts[True] == drafts[False]
    assert switches[False] == [True, False, True] and switches[True] == []


class ContextRecorder(PlainThenDraft):
    """PlainThenDraft that keeps every context length the engine tells it."""

    def __init__(self, n_plain: int):
        super().__init__(n_plain, honest=False)
        self.told: list[int] = []

    def context(self, n_past: int) -> None:
        self.told.append(n_past)


def test_the_policy_is_told_each_rounds_context_length(target, drafter_gguf):
    """Before each choice the policy hears the round's n_past: the prompt plus every token kept,
    through plain steps and drafting rounds alike (the tuner's costs belong to a context)."""
    policy, starts = ContextRecorder(5), []
    with engine_for(target, drafter_gguf) as eng:
        eng.generate(PROMPT, GenerateOptions(n_predict=40, n_max=policy, trace=lambda r: starts.append(r["pos"])))
    assert starts[0] == len(PROMPT) and len(starts) >= 8
    assert policy.told == starts


def test_after_a_promised_stretch_the_drafter_reads_only_the_capture_horizon(target, drafter_gguf):
    """Of a long promised stretch of plain steps, only the last ``capture_horizon`` read their
    rows for the drafter (here 8 of a 24-row window); greedy output is unchanged."""
    with engine_for(target, drafter_gguf) as eng:
        assert eng.drafter.capture_horizon == WINDOW  # min(window, CATCHUP_ROWS)
        ref = eng.generate(PROMPT, GenerateOptions(n_predict=3 * WINDOW, n_max=0)).tokens
        eng.drafter.capture_horizon = 8
        read = []
        real_inject = eng.drafter.inject_visible
        eng.drafter.inject_visible = lambda f, *a: (read.append(len(f)), real_inject(f, *a))[1]
        out = eng.generate(PROMPT, GenerateOptions(n_predict=3 * WINDOW, n_max=PlainThenDraft(2 * WINDOW, True)))
        assert out.tokens == ref
        # only the catch-up before the first draft: the prompt's rows were skipped with the stretch
        assert read == [8]


class StretchingPlainThenDraft(DepthPolicy):
    """Plain steps for the first ``n_plain`` rounds, honest about them, in stretches of up to
    ``stretch`` rounds told together (as ``--n-max auto`` allows where plain decoding leads);
    then depth 4. Keeps how it was told of each round."""

    def __init__(self, n_plain: int, stretch: int):
        self.n_plain, self.stretch = n_plain, stretch
        self.told: list[int] = []  # per round: its depth, as told
        self.stretches: list[int] = []  # the rounds of each stretch told together
        self.asked = 0  # choices asked

    def choose(self) -> int:
        self.asked += 1
        return 0 if len(self.told) < self.n_plain else 4

    def plain_rounds_ahead(self) -> int:
        return max(0, self.n_plain - len(self.told) - 1)

    def plain_stretch(self, n_past: int) -> int:
        return self.stretch

    def observe(self, depth: int, accepted: int, t_round: float, t_catchup: float = 0.0) -> None:
        self.told.append(depth)

    def observe_plain_stretch(self, times: list[float]) -> None:
        assert all(t > 0 for t in times)
        self.stretches.append(len(times))
        self.told += [0] * len(times)


def test_plain_stretches_run_without_asking_and_draft_as_round_by_round(target, drafter_gguf):
    """Where the policy allows it, the rounds of a promised plain stretch run without asking
    it and without the drafter's per-step bookkeeping, and are told together. The output is
    plain greedy's, the drafts afterwards are those of a drafter told of every step, capture
    switches as with round-by-round promises, and the policy hears of every round once."""
    with engine_for(target, drafter_gguf) as eng:
        ref = eng.generate(PROMPT, GenerateOptions(n_predict=4 * WINDOW, n_max=0)).tokens
        stretching = StretchingPlainThenDraft(3 * WINDOW, 5)
        drafts, switches = stretch_runs(eng, ref, {"stretches": (stretching, False),
                                                   "every step": (PlainThenDraft(3 * WINDOW, False), False)})
    assert drafts["stretches"] and drafts["stretches"] == drafts["every step"]
    assert switches["stretches"] == [True, False, True]
    # the stretches end where the drafter reads rows again: the last capture_horizon plain steps
    assert stretching.stretches and set(stretching.stretches) == {5}
    assert sum(stretching.stretches) == 3 * WINDOW - WINDOW - len(stretching.stretches)
    rounds = len(stretching.told)
    # (the last round may be cut to a plain step by n_predict)
    assert stretching.told[:3 * WINDOW] == [0] * (3 * WINDOW) and 0 not in stretching.told[3 * WINDOW:-1]
    assert stretching.asked == rounds - sum(stretching.stretches)


def test_a_sequence_that_ends_within_a_plain_stretch_tells_it_and_keeps_the_drafter_in_step(target, drafter_gguf):
    """A sequence that stops inside a stretch tells the policy its rounds and skips their
    rows in the drafter, so the next sequence, reusing the prompt cache, drafts as after a
    round-by-round run and gives plain greedy's tokens."""
    n_predict = 2 * WINDOW + 3  # inside a stretch of 7 after the first round
    runs = {}
    for stretch in (0, 7):
        with engine_for(target, drafter_gguf) as eng:
            first = StretchingPlainThenDraft(1 << 20, stretch)
            out = eng.generate(PROMPT, GenerateOptions(n_predict=n_predict, n_max=first))
            assert len(first.told) == out.stats.rounds
            held = eng.drafter.n_context + eng.drafter.n_pending
            second, seen = PROMPT + out.tokens + PROMPT[:5], []
            again = eng.generate(second, GenerateOptions(n_predict=40, n_max=4,
                                                         trace=lambda r: seen.append(r["drafted"])))
            plain = eng.generate(second, GenerateOptions(n_predict=40, n_max=0)).tokens
            runs[stretch] = (out.tokens, held, again.tokens, seen, first.stretches)
    assert runs[7][4] and runs[7][4][-1] < 7  # it did end within a stretch
    assert runs[7][:4] == runs[0][:4]
    assert runs[7][2] == plain


class FirstContext(PlainThenDraft):
    """PlainThenDraft that notes, before the first round, the rows the drafter has read
    (``n_context``) and those it holds queued."""

    def __init__(self, n_plain: int, drafter):
        super().__init__(n_plain, honest=True)
        self.drafter, self.seen = drafter, None

    def context(self, n_past: int) -> None:
        if self.seen is None:
            self.seen = (n_past, self.drafter.n_context, self.drafter.n_pending)


def uncached_engine(target, drafter, n_batch=512):
    """An engine without a prompt cache: every run prefills the whole prompt."""
    return Engine(target, drafter, EngineConfig(n_ctx=1024, n_batch=n_batch, kv_type="f32", prompt_cache=False))


@pytest.mark.parametrize("n_batch", [16, 512])
def test_a_sequence_that_stays_plain_never_reads_its_prompts_rows(target, drafter_gguf, n_batch):
    """The prompt's rows wait for the first draft, queued (those a draft at the prompt's end can
    see, less than a window however many parts the prompt takes); a sequence whose plain
    stretch passes the capture horizon drops them unread, and the drafter computes nothing."""
    with uncached_engine(target, drafter_gguf, n_batch) as eng:
        ref = eng.generate(PROMPT, GenerateOptions(n_predict=2 * WINDOW, n_max=0)).tokens
        read = []
        real_inject = eng.drafter.inject
        eng.drafter.inject = lambda f, *a: (read.append(len(f)), real_inject(f, *a))[1]
        policy = FirstContext(1 << 20, eng.drafter)
        out = eng.generate(PROMPT, GenerateOptions(n_predict=2 * WINDOW, n_max=policy))
        assert out.tokens == ref
        assert policy.seen == (len(PROMPT), len(PROMPT) - WINDOW + 1, WINDOW - 1)
        assert read == [] and eng.drafter.n_pending == 0


@pytest.mark.parametrize("n_batch", [16, 512])
def test_the_first_draft_sees_the_prompts_rows_as_if_read_at_prefill(target, drafter_gguf, n_batch):
    """Queued until the first catch-up, the prompt's visible rows are read in the batches they
    would have been read in at prefill (one per part of the prompt): every draft is the same, to
    its logits' last bit. (This F32 drafter computes a row alike in a batch of any size, so what
    this checks is the rows' positions and order; the batches are the code's reading.)"""
    with uncached_engine(target, drafter_gguf, n_batch) as eng:
        ref = eng.generate(PROMPT, GenerateOptions(n_predict=2 * WINDOW, n_max=0)).tokens
        drafts, logits = {}, {}
        real_draft = eng.drafter.draft

        def draft(bonus, depth):  # the logits behind each draft, to the last bit
            logits[queued].append(eng.drafter.draft_logits(bonus, depth))
            return real_draft(bonus, depth)
        eng.drafter.draft = draft
        for queued in (True, False):
            if not queued:
                eng.drafter.queue_visible = read_at_prefill(eng.drafter)
            seen, logits[queued] = [], []
            out = eng.generate(PROMPT, GenerateOptions(n_predict=2 * WINDOW, n_max=4,
                                                       trace=lambda r: seen.append(r["drafted"])))
            assert out.tokens == ref
            drafts[queued] = seen
    assert len(drafts[True]) > 4 and drafts[True] == drafts[False]
    assert all(np.array_equal(a, b) for a, b in zip(logits[True], logits[False], strict=True))


def test_sampling_distribution_matches_plain_decoding(target, drafter_gguf):
    """With temperature 1 (top-k 2, so that the greedy drafts are often accepted), token
    frequencies at n_max 4 must match plain sampling: a two-sample chi-square test per position
    at p = 0.001 (critical value for the degrees of freedom of the categories seen)."""
    n_runs, n_tok = 300, 4
    params = dict(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0)
    prompt = PROMPT[:12]
    counts = {0: [Counter() for _ in range(n_tok)], 4: [Counter() for _ in range(n_tok)]}
    with engine_for(target, drafter_gguf) as eng:
        greedy = eng.generate(prompt, GenerateOptions(n_predict=8, n_max=0)).tokens

        def propose(bonus, depth):
            # the greedy continuation after the bonus's position, wherever sampling went
            start = eng.drafter.n_context - len(prompt) + 1
            return (greedy[start:] + [0] * 16)[:depth]
        eng.drafter.draft = propose
        accepted = 0
        for depth in (0, 4):
            for seed in range(n_runs):
                res = eng.generate(prompt, GenerateOptions(n_predict=n_tok, n_max=depth,
                                                           sampling=SamplingParams(seed=seed, **params)))
                for i, tok in enumerate(res.tokens):
                    counts[depth][i][tok] += 1
                accepted += res.stats.accepted
    # at least one accepted draft per four runs, or the speculative path would barely be tested
    assert accepted > n_runs // 4, "the drafts were hardly ever accepted: the test would be vacuous"
    for i in range(n_tok):
        a, b = counts[0][i], counts[4][i]
        cats = sorted(set(a) | set(b))
        stat = 0.0
        for c in cats:
            ea = (a[c] + b[c]) / 2
            stat += (a[c] - ea) ** 2 / ea + (b[c] - ea) ** 2 / ea
        df = max(1, len(cats) - 1)
        # Wilson-Hilferty approximation of the chi-square quantile at p = 0.001 (z = 3.09)
        crit = df * (1 - 2 / (9 * df) + 3.09 * math.sqrt(2 / (9 * df))) ** 3
        assert stat < crit, f"position {i}: chi2 {stat:.1f} >= {crit:.1f} ({a} vs {b})"


def test_stops_on_stop_string_and_token_limit(target, drafter_gguf):
    with engine_for(target, drafter_gguf) as eng:
        full = eng.generate(PROMPT, GenerateOptions(n_predict=40, n_max=4))
        assert full.stop_reason == "length" and len(full.tokens) == 40
        piece = full.text[10:14]
        stopped = eng.generate(PROMPT, GenerateOptions(n_predict=40, n_max=4, stop=(piece,)))
        assert stopped.stop_reason == "stop"
        assert stopped.text == full.text[:full.text.find(piece)]
        assert stopped.tokens == full.tokens[:len(stopped.tokens)]


def test_stream_yields_the_same_text(target, drafter_gguf):
    with engine_for(target, drafter_gguf) as eng:
        whole = eng.generate(PROMPT, GenerateOptions(n_predict=30, n_max=4)).text
        assert "".join(eng.stream(PROMPT, GenerateOptions(n_predict=30, n_max=4))) == whole


@pytest.mark.parametrize("kind", ["hidden", "layers", "vocab"])
def test_mismatched_pair_is_refused_with_exit_code_2(tmp_path, tiny_target, kind, capsys):
    fake = {"hidden": dict(n_layer=6, hidden=96, vocab_size=512),
            "layers": dict(n_layer=12, hidden=64, vocab_size=512),
            "vocab": dict(n_layer=6, hidden=64, vocab_size=320)}[kind]
    drafter_kw = {"hidden": dict(hidden=96),
                  "layers": dict(target_layer_ids=(0, 5, 11), num_target_layers=12),
                  "vocab": dict(vocab_size=320)}[kind]
    other = synthetic.write_target_gguf(tmp_path / "other.gguf", **fake)
    bad = make_drafter(tmp_path, f"bad-{kind}", other, **drafter_kw)
    code = cli_main(["-m", str(tiny_target["gguf"]), "-md", str(bad), "-p", "x", "-n", "4"])
    captured = capsys.readouterr()
    assert code == 2
    lines = [ln for ln in captured.err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and str(bad) in lines[0]
    # the drafter records the target's layer count, so that rule answers before the layer ids
    assert {"hidden": "embedding_length", "layers": "target_n_layer", "vocab": "tokenizer.ggml.tokens"}[kind] in lines[0]
    # one rule set: the runtime's refusal is the first of the problems inspect lists
    problems = pairing_problems(read_drafter_gguf(bad), read_target_info(tiny_target["gguf"]))
    assert problems and lines[0] == f"error: {problems[0]}"
