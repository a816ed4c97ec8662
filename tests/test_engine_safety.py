"""A safe Engine (issue 18): concurrent calls serialize, closed engines and models refuse further
use, token ids are checked before they reach llama.cpp.

Each of these used to kill the process (a segfault, or std::out_of_range thrown through the C
API), so the checks run in a child process: without the fix the child dies by a signal and the
test fails instead of taking pytest down with it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from laguna_dflash.runtime import assets
from laguna_dflash.runtime.engine import Engine, EngineBusy, EngineConfig, GenerateOptions

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pair() -> tuple[Path, Path]:
    return assets.TINY_TARGET, assets.converted_tiny_drafter()


def run_child(body: str, *args: object, timeout: float = 300) -> dict:
    """Run PRELUDE + ``body`` (which prints one JSON object last) in a fresh interpreter; fail on any death."""
    code = PRELUDE + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"child exited {proc.returncode}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


PRELUDE = """
import json, sys, threading
from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions
from laguna_dflash.runtime.llama import ClosedError, Model
target, drafter = sys.argv[1], sys.argv[2]
out = {}
def refused(fn):
    try:
        fn()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None
"""


def test_threads_calling_generate_concurrently_match_sequential_calls(pair):
    res = run_child("""
    cfg = EngineConfig(n_ctx=512, kv_type="f32", n_threads=1)
    prompts = ["def fib(n):", "import os\\n", "class Stack:", "for i in range(10):",
               "def quicksort(xs):", "with open(path) as f:"]
    opts = lambda i: GenerateOptions(n_predict=24, n_max=(0, 2, 4)[i % 3])
    with Engine.load(target, drafter, cfg) as engine:
        sequential = [engine.generate(p, opts(i)).tokens for i, p in enumerate(prompts)]
        concurrent = [None] * len(prompts)
        streamed = [None] * len(prompts)
        def work(i):
            concurrent[i] = engine.generate(prompts[i], opts(i)).tokens
            streamed[i] = "".join(engine.stream(prompts[i], opts(i)))
        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
        for t in threads: t.start()
        for t in threads: t.join()
        texts = [engine.detokenize(t) for t in sequential]
    print(json.dumps({"sequential": sequential, "concurrent": concurrent, "texts": texts, "streamed": streamed}))
    """, *pair)
    assert all(res["sequential"]) and res["concurrent"] == res["sequential"]
    assert res["streamed"] == res["texts"]


def test_closed_engine_and_closed_model_refuse_further_use(pair):
    res = run_child("""
    engine = Engine.load(target, drafter, EngineConfig(n_ctx=256, n_threads=1))
    tokens = engine.generate("def f(x):", GenerateOptions(n_predict=4)).tokens
    engine.close()
    engine.close()  # twice is harmless
    out["generate"] = refused(lambda: engine.generate("x", GenerateOptions(n_predict=2)))
    out["stream"] = refused(lambda: list(engine.stream("x", GenerateOptions(n_predict=2))))
    out["detokenize"] = refused(lambda: engine.detokenize(tokens))
    out["token_text"] = refused(lambda: engine.target.token_text(tokens[0]))
    out["model_detokenize"] = refused(lambda: engine.target.detokenize(tokens))
    # an engine whose target model its owner closed
    model = Model(target)
    engine = Engine(model, drafter, EngineConfig(n_ctx=256, n_threads=1))
    model.close()
    out["after_model_close"] = refused(lambda: engine.generate("x", GenerateOptions(n_predict=2)))
    out["ctx_after_model_close"] = refused(lambda: engine.ctx.logits_view(0))
    engine.close()
    print(json.dumps(out))
    """, *pair)
    for call, error in res.items():
        assert error is not None and error.startswith("ClosedError") and "closed" in error, (call, error)


def test_token_ids_outside_the_vocabulary_are_refused(pair):
    res = run_child("""
    with Engine.load(target, drafter, EngineConfig(n_ctx=256, n_threads=1)) as engine:
        n = engine.target.n_vocab
        out["n_vocab"] = n
        out["detokenize"] = refused(lambda: engine.detokenize([1, n]))
        out["detokenize_negative"] = refused(lambda: engine.detokenize([-1]))
        out["token_text"] = refused(lambda: engine.target.token_text(n + 7))
        out["token_bytes"] = refused(lambda: engine.target.token_bytes(-5))
        out["is_eog"] = refused(lambda: engine.target.is_eog(2**31))
        out["prompt_ids"] = refused(lambda: engine.generate([1, 2, n], GenerateOptions(n_predict=2)))
        out["prompt_huge"] = refused(lambda: engine.generate([2**63], GenerateOptions(n_predict=2)))
        out["prompt_float"] = refused(lambda: engine.generate([1.5], GenerateOptions(n_predict=2)))
        out["still_works"] = engine.detokenize(engine.generate("def f(x):", GenerateOptions(n_predict=3)).tokens)
    print(json.dumps(out))
    """, *pair)
    n = res.pop("n_vocab")
    assert res.pop("still_works")
    for call, error in res.items():
        assert error is not None and error.startswith("ValueError: token id"), (call, error)
    assert f"{n} is not in 0..{n - 1}" in res["detokenize"] and f"0..{n - 1}" in res["prompt_ids"]
    assert "-1 is not in" in res["detokenize_negative"] and str(n + 7) in res["token_text"]


def test_a_second_sequence_in_the_thread_of_an_open_stream_is_refused_and_others_wait(pair):
    with Engine.load(*pair, EngineConfig(n_ctx=256, n_threads=1)) as engine:
        stream = engine.stream("def f(x):", GenerateOptions(n_predict=8, n_max=2))
        first = next(stream)
        with pytest.raises(EngineBusy, match="already generating in this thread"):
            engine.generate("x", GenerateOptions(n_predict=2))
        assert engine.detokenize([1]) is not None  # helpers still work from the stream's thread
        done = threading.Event()
        other = threading.Thread(target=lambda: (engine.generate("y", GenerateOptions(n_predict=2)), done.set()))
        other.start()
        assert not done.wait(0.5), "another thread's generate must wait for the open stream"
        rest = "".join(stream)  # the stream finishes undisturbed, then the other thread runs
        other.join(timeout=120)
        assert done.is_set() and first + rest
