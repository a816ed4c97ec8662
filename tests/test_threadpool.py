"""ggml's thread pool: the CPU wheel runs ggml's own workers, one pool per engine, and a pool is
freed with the last context that uses it."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from laguna_dflash.runtime import llama
from laguna_dflash.runtime.llama import Context, ContextParams

PROMPT = [3, 17, 250, 9, 1021, 44, 7, 300]


def test_the_cpu_wheel_runs_ggmls_own_threads_not_openmp():
    assert "OPENMP" not in llama.cpu_backend_features()


def test_only_the_cuda_wheel_is_built_with_openmp(monkeypatch):
    from laguna_dflash.runtime.setup import wheel

    monkeypatch.setattr(wheel, "cublas_flags", lambda: [])  # no toolkit probing here
    monkeypatch.setattr(wheel, "driver_flags", lambda: [])
    assert "-DGGML_OPENMP=OFF" in wheel.build_flags(False, "native")
    assert not any("OPENMP" in f for f in wheel.build_flags(True, "90"))


def test_a_borrowing_context_shares_the_pool_and_the_last_one_frees_it(models):
    target, _, drafter = models
    params = ContextParams(n_ctx=256, n_threads=2)
    ctx = Context(target, params)
    pool = ctx.pool
    borrower = Context(drafter, ContextParams(n_ctx=256, n_threads=2), other=ctx)
    assert borrower.pool is pool and pool.ptr
    other_count = Context(drafter, ContextParams(n_ctx=256, n_threads=1), other=ctx)
    assert other_count.pool is not pool  # a pool's workers are its thread count
    other_count.close()
    borrower.close()
    assert pool.ptr  # the lender still decodes on it
    ctx.close()
    assert pool.ptr is None
    ctx.close()  # twice is safe


def logits_alone(target, params) -> np.ndarray:
    with Context(target, params) as ctx:
        ctx.decode(PROMPT, range(len(PROMPT)), logits="all")
        return ctx.logits_block(len(PROMPT)).copy()


@pytest.mark.parametrize("n_threads", [1, 2])
def test_two_contexts_on_one_pool_decode_from_two_threads_as_alone(models, n_threads):
    # the pool runs one graph at a time: decodes of its contexts from two threads take turns
    target = models[0]
    params = ContextParams(n_ctx=256, n_threads=n_threads, kv_type="f32")
    want = logits_alone(target, params)
    with Context(target, params) as first, Context(target, params, other=first) as second:
        assert second.pool is first.pool
        got: dict[int, list[np.ndarray]] = {0: [], 1: []}

        def work(k: int, ctx: Context) -> None:
            for _ in range(12):
                ctx.clear()
                ctx.decode(PROMPT, range(len(PROMPT)), logits="all")
                got[k].append(ctx.logits_block(len(PROMPT)).copy())

        threads = [threading.Thread(target=work, args=(k, c)) for k, c in enumerate((first, second))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(got[0]) == len(got[1]) == 12
    for rows in got[0] + got[1]:
        np.testing.assert_array_equal(rows, want)
