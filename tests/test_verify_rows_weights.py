"""Weight matmuls of a few-row verify pass compute each row as a one-row step does (issue 21).

Patches 0011-0014 and 0018 give the vendored ggml CPU backend kernels that take the few rows of a
speculative verify pass (up to 16) against a quantized weight at once, sharing the work on the
weights between the rows: Q4_K in the repacked 8x8 layout (dense ``mul_mat`` and the experts'
``mul_mat_id``), plain Q6_K (dense, where Q6_K is not repacked) and, on x86 with AVX2, Q6_K in
the repacked 8x8 layout and Q8_0 in the repacked 4-column layout. On AVX2 the rows kernels of
repacked Q6_K, Q8_0 and Q4_K take every pass, a prompt's too, in groups of 16 (Q4_K: 0019 up to
32 rows, 0042 every pass).
Each computes, per row, what the one-row kernel computes, so the claim tested here is exact:
every row of an n-row product is bit-identical to that row computed alone (which runs the
one-row kernel). Without the patches the Q4_K rows of 4 or more (4-row gemm tiles, another
summation order) and the Q6_K rows of 8 or more (the tiled K-quant path) differ in the last bits.

The last test runs the engine on the cost-model harness's XS-width Q4_K_M target where it is
built. Widths of the kernel test: XS's input widths (2048 into the attention and shared expert, 8192 into attn_output and
ffn_down, 512 into the experts' down projection) with fewer output rows and experts than XS, to
keep the test fast; the kernels' paths depend on the type, the row count, the routing and the
thread count, all covered here.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers import kernel_weights as kw
from helpers.synthetic import built_xs_q4_K_M

SHAPES = [
    kw.WeightShape("dense-q4_K-2048", "q4_K", 2048, 512),
    kw.WeightShape("dense-q4_K-8192", "q4_K", 8192, 256),
    kw.WeightShape("dense-q6_K-2048", "q6_K", 2048, 256),
    kw.WeightShape("dense-q6_K-8192", "q6_K", 8192, 128),
    kw.WeightShape("experts-q4_K-2048", "q4_K", 2048, 256, 16, 4),
    kw.WeightShape("experts-q4_K-512", "q4_K", 512, 512, 16, 4),
    kw.WeightShape("experts-q6_K-512", "q6_K", 512, 512, 16, 4),
    # the bundled tiny target (Q8_0, repacked on x86 with AVX2); 128 -> 4: the attention's output
    # gate on full layers, fewer columns than the kernel's group of 8
    kw.WeightShape("gate-q8_0-128", "q8_0", 128, 4),
    kw.WeightShape("dense-q8_0-128", "q8_0", 128, 256),
    kw.WeightShape("head-q8_0-128", "q8_0", 128, 4096),
    kw.WeightShape("dense-q8_0-256", "q8_0", 256, 128),
    kw.WeightShape("dense-q8_0-128x24", "q8_0", 128, 24),  # AVX-512: 16 columns, then 8 on the AVX2 path
    kw.WeightShape("experts-q8_0-128", "q8_0", 128, 128, 8, 2),
]
#: 2..5: verify passes at depths 1..4; 8, 9, 16: a full 4-row tile and more, the largest block
ROWS = (2, 3, 4, 5, 8, 9, 16)


@pytest.fixture(scope="module", params=[1, 2], ids=["t1", "t2"])
def backend(request):
    return kw.Backend(n_threads=request.param)


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_every_row_of_a_few_row_product_is_the_row_alone(backend, shape):
    prod = kw.Product(backend, shape)
    # experts: random picks (rows rarely share an expert) and shared picks (every expert gets
    # all the rows: the grouped multi-row path)
    for shared in ((False, True) if shape.n_expert else (False,)):
        for rows in ROWS:
            bad, worst = prod.row_mismatches(rows, seed=rows, shared_routing=shared)
            assert bad == 0, (f"{shape.name}: {bad} of {rows} rows differ from the row alone "
                              f"(max |diff| {worst:.2e}, shared routing {shared})")


def _assert_exact_on_constant_rows(prod, shape, row_counts, per_unit, unit=1.0):
    """Rows whose every activation is -unit * 2 ** k (unit 1: Q8_K quantizes it to -128 times an
    exact scale; unit 127: Q8_0 to -127 times 2 ** k) against weights that make each output
    exactly ``per_unit`` times the row's value: every output must come out exactly that (experts
    routed row by row, r .. r + n_used)."""
    for rows in row_counts:
        x_row = np.array([-unit * 2.0 ** (r % 5) for r in range(rows)], np.float32)
        x = np.repeat(x_row[:, None], shape.n_in, axis=1)
        ids = None
        if shape.n_expert:
            ids = np.stack([np.arange(r, r + shape.n_used) % shape.n_expert for r in range(rows)]).astype(np.int32)
        out, _ = prod.run(x, ids)
        want = per_unit * x_row
        got = out.reshape(rows, -1)
        assert np.array_equal(got, np.repeat(want[:, None], got.shape[1], axis=1)), \
            f"{shape.name}, {rows} rows: {np.unique(got)} instead of {want}"


@pytest.mark.parametrize("shape", [s for s in SHAPES if s.type == "q4_K"], ids=lambda s: s.name)
def test_repacked_q4_K_products_at_the_quants_extremes_are_exact(backend, shape):
    """The repacked Q4_K kernels sum a column's quant products in int16 lanes before widening;
    at the extremes (every quant 15, scales and mins 63, every activation quantized to -128)
    a lane holding more than it can would show here. The values are chosen so that the product
    is exact in float32: each output is n_in * (63 * 15 - 63) * x."""
    # block_q4_K: fp16 d = 1, fp16 dmin = 1, 12 bytes of 6-bit scales and mins all 63, 128 bytes
    # of quants all 15
    block = np.array([1.0, 1.0], np.float16).tobytes() + b"\xff" * 12 + b"\xff" * 128
    raw = block * (shape.n_in // 256 * shape.n_out)
    _assert_exact_on_constant_rows(kw.Product(backend, shape, raw=raw), shape, (1, 2, 5, 16),
                                   shape.n_in * (63 * 15 - 63))


@pytest.mark.parametrize("shape", [s for s in SHAPES if s.type == "q6_K"], ids=lambda s: s.name)
@pytest.mark.parametrize("quant, scale", [(63, 127), (0, -128)], ids=["top", "bottom"])
def test_repacked_q6_K_products_at_the_quants_extremes_are_exact(backend, shape, quant, scale):
    """The repacked Q6_K kernels keep the quants unsigned (0..63) and take the offset of 32 out
    through the activations' block sums, all in int32 lanes. At the extremes (every quant 63 with
    scales 127, or every quant 0 with scales -128; every activation quantized to -128) the
    integer sums are the largest they can be, and the product is exact in float32:
    n_in * scale * (quant - 32) * x."""
    # block_q6_K: 128 bytes of low 4 bits, 64 bytes of high 2 bits, 16 int8 scales, fp16 d = 1
    fill = b"\xff" if quant == 63 else b"\x00"
    block = fill * 128 + fill * 64 + np.full(16, scale, np.int8).tobytes() + np.array([1.0], np.float16).tobytes()
    raw = block * (shape.n_in // 256 * shape.n_out)
    _assert_exact_on_constant_rows(kw.Product(backend, shape, raw=raw), shape, (1, 2, 5, 16, 17),
                                   shape.n_in * scale * (quant - 32))


@pytest.mark.parametrize("shape", [s for s in SHAPES if s.type == "q8_0"], ids=lambda s: s.name)
@pytest.mark.parametrize("quant", [127, -128], ids=["top", "bottom"])
def test_repacked_q8_0_products_at_the_quants_extremes_are_exact(backend, shape, quant):
    """The repacked Q8_0 kernels multiply |weight| by the activation carrying the weight's sign
    and add two such products in int16 lanes (AVX2), or the activation plus 128 by the weight,
    less 128 times the weights' sum, in int32 lanes (AVX-512, 16 columns at a time). At the
    extremes (every weight quant 127, or -128, whose magnitude only an unsigned operand holds;
    every activation -127 times a power of two, quantized to -127 with that power as its scale)
    the lanes are the fullest they get, and the product is exact in float32: n_in * quant * x."""
    # block_q8_0: fp16 d = 1, 32 int8 quants
    block = np.array([1.0], np.float16).tobytes() + np.full(32, quant, np.int8).tobytes()
    raw = block * (shape.n_in // 32 * shape.n_out)
    _assert_exact_on_constant_rows(kw.Product(backend, shape, raw=raw), shape, (1, 2, 5, 16, 17),
                                   shape.n_in * quant, unit=127.0)


@pytest.mark.parametrize("shape", [s for s in SHAPES if s.type in kw.REPACKED_X86], ids=lambda s: s.name)
def test_repacked_products_match_the_plain_layout(backend, shape):
    """The repacked kernels compute what ggml's plain dot products compute, up to the order of
    float sums: the same quantized weights in a plain CPU buffer give the same product."""
    repacked, plain = kw.Product(backend, shape, seed=3), kw.Product(backend, shape, seed=3, repack=False)
    for rows in (1, 3, 16, 40):
        x, ids = repacked.inputs(rows, seed=rows)
        got, _ = repacked.run(x, ids)
        want, _ = plain.run(x, ids)
        scale = float(np.abs(want).max())
        assert np.abs(got - want).max() <= 1e-5 * scale, (shape.name, rows, float(np.abs(got - want).max()), scale)


@pytest.mark.parametrize("shape, row_counts", [
    (kw.WeightShape("dense-q6_K-2048", "q6_K", 2048, 256), (17, 40)),
    (kw.WeightShape("dense-q8_0-256", "q8_0", 256, 132), (17, 40)),
    (kw.WeightShape("dense-q4_K-2048", "q4_K", 2048, 512), (17, 24, 32)),
], ids=lambda v: v.name if isinstance(v, kw.WeightShape) else "rows-" + "-".join(map(str, v)))
def test_a_pass_of_more_than_16_rows_computes_each_row_as_alone(backend, shape, row_counts):
    """Passes of more than 16 rows take the multi-row kernel in groups of 16, so their rows too
    are the rows alone: over repacked Q6_K and Q8_0 every pass, a prompt's too (x86 has no AVX2
    gemm tiles for them; 132 outputs: 16 groups of 8 columns and one of 4); over repacked Q4_K
    passes of 17-32 rows, a batched round of several sequences' verify rows, where the AVX2
    gemm's 4-row tiles took them before patch 0019."""
    prod = kw.Product(backend, shape)
    for rows in row_counts:
        bad, worst = prod.row_mismatches(rows, seed=rows)
        assert bad == 0, f"{bad} of {rows} rows differ from the row alone (max |diff| {worst:.2e})"


def test_q4_K_passes_of_any_size_compute_each_row_as_alone_where_the_runtime_lifts_its_bound(backend, monkeypatch):
    """Where the runtime lets a Q4_K_M target's batched pass hold any number of rows (a backend
    with AVX2, runtime/batch.py's rows bound), every repacked Q4_K pass, a prompt's too, must
    compute each row as alone (patches 0037 and 0042): 40- and 96-row dense passes, past the 32
    rows after which AVX2 builds took the gemm's 4-row tiles before 0042."""
    from gguf import GGMLQuantizationType as Q

    bound = kw.rows_bound(monkeypatch, [(Q.Q4_K, (512, 2048))])
    if bound is not None:
        pytest.skip(f"this CPU backend bounds a Q4_K pass to {bound} rows")
    prod = kw.Product(backend, kw.WeightShape("dense-q4_K-2048", "q4_K", 2048, 512))
    for rows in (40, 96):
        bad, worst = prod.row_mismatches(rows, seed=rows)
        assert bad == 0, f"{bad} of {rows} rows differ from the row alone (max |diff| {worst:.2e})"


#: products of 1-16 rows whose share a thread is at least 512 KiB go in chunks the threads claim
#: (patches 0049-0050): the XS head's input width into 16,384 outputs (27.5 MB of Q6_K, 1 MiB
#: chunks) and dense products of 2.2-2.4 MB (128 KiB chunks); the K and V projections' 0.6 MB keep
#: fixed shares (one row) or ggml's chunks
TWO_THREAD_SHAPES = [
    kw.WeightShape("head-q6_K-2048x16384", "q6_K", 2048, 16384),
    kw.WeightShape("dense-q4_K-2048x2048", "q4_K", 2048, 2048),
    kw.WeightShape("dense-q8_0-2048x1024", "q8_0", 2048, 1024),
    kw.WeightShape("kv-q4_K-2048x512", "q4_K", 2048, 512),
]


@pytest.mark.parametrize("shape", TWO_THREAD_SHAPES, ids=lambda s: s.name)
def test_a_product_of_one_to_sixteen_rows_on_two_threads_gives_one_threads_bits(shape):
    """Two threads claim a product's chunks (counted per share and barrier generation), one thread
    computes it whole: the same bits, graph after graph on one thread pool (whose counts carry
    over from graph to graph, as in the runtime)."""
    one = kw.Product(kw.Backend(n_threads=1), shape, seed=5)
    pooled = kw.Backend(n_threads=2, own_pool=True)
    two = kw.Product(pooled, shape, seed=5)
    try:
        # products after others, each on new inputs: a count not started afresh leaves outputs
        # unwritten (NaN)
        for i, rows in enumerate((1, 1, 2, 1, 5, 16, 1)):
            x, _ = one.inputs(rows, seed=10 + i)
            want, _ = one.run(x, None)
            got, _ = two.run(x, None)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"{rows} rows"
    finally:
        pooled.close()


def test_the_q4_K_q6_K_and_q8_0_weights_are_repacked(backend):
    """The Q4_K, Q6_K and Q8_0 cases above test the repacked kernels only if the weights go to CPU_REPACK."""
    assert backend.repack_buft is not None


@pytest.mark.skipif(built_xs_q4_K_M() is None, reason="no XS-width Q4_K_M target: scripts/bench/bench_cost_model.py --build-only")
def test_greedy_speculative_equals_plain_on_an_xs_width_q4_K_M_target():
    """End to end where these kernels run: Q4_K_M weights at XS widths. The random drafter's
    drafts are all rejected, so every round emits the first row of an (n_max+1)-row verify
    pass, which must be the decode step's token (depths 4 and 8: 5- and 9-row passes).
    Measured with 0010 and without 0011/0012: the outputs part at the 16th generated token
    (n_max 4); with them: equal. Skipped where the target is not built."""
    from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions
    from laguna_dflash.runtime.llama import Model

    target, drafter = built_xs_q4_K_M()
    prompt = "def quicksort(xs):\n    " * 8
    # no prompt cache: each generation starts from an empty KV cache. With it, a generation
    # after another one can leave the first one's tokens even in plain decoding (measured here:
    # plain, depth 4, then depth 8 or plain again part from the first plain output at token 16),
    # a dependence on the cache's history that is not the verify kernels' and not tested here
    cfg = EngineConfig(n_ctx=1024, n_threads=1, prompt_cache=False)
    with Model(target) as m, Engine(m, drafter, cfg) as eng:
        plain = eng.generate(prompt, GenerateOptions(n_predict=48, n_max=0)).tokens
        for n_max in (4, 8):
            spec = eng.generate(prompt, GenerateOptions(n_predict=48, n_max=n_max))
            first = next((j for j, (a, b) in enumerate(zip(plain, spec.tokens)) if a != b), None)
            assert spec.tokens == plain, f"n_max {n_max}: speculative output leaves plain decoding at token {first}"


@pytest.mark.skipif(built_xs_q4_K_M() is None, reason="no XS-width Q4_K_M target: scripts/bench/bench_cost_model.py --build-only")
def test_greedy_speculative_equals_plain_on_an_xs_width_q4_K_M_target_with_the_prompt_cache():
    """The same with the prompt cache on (the engine's default), in the order that once parted
    from plain decoding at token 16 (plain, depth 4, depth 8, plain again: each generation after
    the first reuses the cached prompt and lands its tokens in cells the earlier ones used):
    every output must be the first plain one (what changed since: patch 0006's sliding-window
    cells by position and the prompt cache's no-re-decode rule, docs/results/long-context)."""
    from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions
    from laguna_dflash.runtime.llama import Model

    target, drafter = built_xs_q4_K_M()
    prompt = "def quicksort(xs):\n    " * 8
    cfg = EngineConfig(n_ctx=1024, n_threads=1, prompt_cache=True)
    with Model(target) as m, Engine(m, drafter, cfg) as eng:
        plain = eng.generate(prompt, GenerateOptions(n_predict=48, n_max=0)).tokens
        for n_max in (4, 8, 0):
            out = eng.generate(prompt, GenerateOptions(n_predict=48, n_max=n_max)).tokens
            first = next((j for j, (a, b) in enumerate(zip(plain, out)) if a != b), None)
            assert out == plain, f"n_max {n_max} after the others: output leaves the first plain one at token {first}"
