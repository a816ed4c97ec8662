"""GGUF header values are range-checked in Python before llama.cpp reads them (issue 18).

A NaN or negative RMS epsilon used to pass ``laguna-gguf inspect --target`` and then kill the
process in a GGML_ASSERT at the first decode; the same rule now refuses it in inspect and at load,
with one line naming the file, the key, the expected and the found value. Loads run in a child
process, so a check that is missing shows up as a failed test (the child dies), not a dead pytest.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from gguf import GGUFValueType as T

from laguna_dflash.convert.gguf import keys as K
from laguna_dflash.convert.errors import UserError
from laguna_dflash.convert.gguf.header import read_header
from laguna_dflash.convert.gguf.rules import ARCH_RULES, MODEL_RULES, header_problems
from convert_fixtures import run_cli
from gguf_mutate import Source
from laguna_dflash.runtime import assets

REPO = Path(__file__).resolve().parent.parent
EPS = "attention.layer_norm_rms_epsilon"


@pytest.fixture(scope="module")
def sources() -> dict[str, Source]:
    return {"drafter": Source.of(assets.converted_tiny_drafter()), "target": Source.of(assets.TINY_TARGET)}


def _arch(role: str) -> str:
    return K.ARCH if role == "drafter" else "laguna"


def mutated(sources, tmp_path, role: str, key: str, vtype: T, value, sub_type=None) -> dict[str, Path]:
    """The pair with one value of one file replaced."""
    out = tmp_path / f"{role}-{key}.gguf"
    sources[role].write_value(out, key, vtype, value, sub_type)
    return {"drafter": sources["drafter"].path, "target": sources["target"].path, role: out}


LOAD = """
import json, sys
from laguna_dflash.convert.errors import UserError
from laguna_dflash.runtime.cli import main
from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions
target, drafter = sys.argv[1], sys.argv[2]
try:
    with Engine.load(target, drafter, EngineConfig(n_ctx=256, n_threads=1)) as e:
        e.generate("def f(x):", GenerateOptions(n_predict=4, n_max=2))
    load = None
except UserError as e:
    load = f"{type(e).__name__}: {e}"
cli = main(["-m", target, "-md", drafter, "-p", "def f(x):", "-n", "4", "--n-max", "2", "-c", "256", "-t", "1"])
print(json.dumps({"load": load, "cli": cli}))
"""


def load_in_child(pair: dict[str, Path]) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(LOAD), str(pair["target"]), str(pair["drafter"])],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"the load died (exit {proc.returncode}):\n{proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.parametrize("role", ["drafter", "target"])
@pytest.mark.parametrize("value,shown", [(math.nan, "nan"), (-1.0, "-1.0"), (0.0, "0.0")])
def test_bad_rms_epsilon_is_refused_by_inspect_and_at_load(sources, tmp_path, role, value, shown):
    key = f"{_arch(role)}.{EPS}"
    pair = mutated(sources, tmp_path, role, key, T.FLOAT32, value)
    line = f"{pair[role]}: {key}: expected a finite number > 0 (FLOAT32), found {shown} (FLOAT32)"
    res = run_cli("inspect", pair["drafter"], "--target", pair["target"])
    assert res.code == 2 and line in res.stderr, res.stderr
    outcome, stderr = load_in_child(pair)
    assert outcome == {"load": f"ContractError: {line}", "cli": 2}
    assert f"error: {line}" in stderr


@pytest.mark.parametrize("role,key,vtype,value,fragment", [
    # head counts: positive, the KV heads dividing the heads (a zero divides by zero in llama.cpp)
    ("drafter", "attention.head_count_kv", T.UINT32, 0, "expected an integer in 1..2^31-1 (UINT32), found 0"),
    ("drafter", "attention.head_count_kv", T.UINT32, 3, "expected a divisor of attention.head_count (8), found 3"),
    ("target", "attention.head_count_kv", T.UINT32, 3, "expected a divisor of attention.head_count (4), found 3"),
    ("target", "attention.head_count", T.ARRAY, ([8] * 23, T.INT32), "expected 24 values (block_count), found 23"),
    # a type llama.cpp does not read it as
    ("drafter", "attention.head_count", T.FLOAT32, math.inf, "(UINT32), found inf (FLOAT32)"),
    ("target", "block_count", T.INT64, -1, "expected an integer in 1..512 (UINT32), found -1 (INT64)"),
    ("target", "block_count", T.UINT32, 513, "in 1..512 (UINT32), found 513"),
    # rope: base finite and positive, dimensions even and within the head
    ("target", "rope.freq_base", T.FLOAT32, -math.inf, "expected a finite number > 0 (FLOAT32), found -inf"),
    ("drafter", "rope.freq_base", T.FLOAT32, 0.0, "expected a finite number > 0"),
    ("target", "rope.dimension_count", T.UINT32, 64, "expected at most the head size (attention.key_length = 32)"),
    ("target", "rope.dimension_count_swa", T.UINT32, 15, "expected an even integer in 2..2^31-1"),
    ("drafter", "rope.dimension_count", T.UINT32, 64, "expected at most the head size (attention.key_length = 32)"),
    ("drafter", "rope.dimension_count", T.UINT32, 15, "expected an even integer in 2..2^31-1"),
    ("target", "attention.key_length", T.UINT32, 0, "expected an integer in 1..2^31-1 (UINT32), found 0"),
    # experts and the MoE router
    ("target", "expert_used_count", T.UINT32, 9, "expected 1..8 (expert_count) in every layer, found 9"),
    ("target", "expert_count", T.UINT32, 2**31, "expected an integer in 0..1024"),
    ("target", "expert_gating_func", T.UINT32, 7, "expected 1..4"),
    ("target", "leading_dense_block_count", T.UINT32, 25, "expected at most block_count (24), found 25"),
    # the drafter's own contract
    ("drafter", K.suffix(K.BLOCK_SIZE), T.UINT32, 1, "expected an integer in 2..512"),
    ("drafter", "attention.sliding_window", T.UINT32, 2**21, "expected an integer in 2..2^20"),
    ("drafter", K.suffix(K.TARGET_LAYER_IDS), T.ARRAY, ([1, 9, 9, 23], T.INT32), "expected non-empty, strictly increasing"),
    ("drafter", K.suffix(K.TARGET_LAYER_IDS), T.ARRAY, ([-1, 9, 17, 23], T.INT32), "layer ids in 0..511 in every"),
    ("drafter", K.suffix(K.N_TARGET_FEATURES), T.UINT32, 384, "expected 512 (len(target_layer_ids) x embedding_length)"),
    ("drafter", K.suffix(K.MASK_TOKEN_ID), T.UINT32, 4096, "expected 0..4095 (a token id), found 4096"),
    ("drafter", "context_length", T.UINT32, 0, "expected an integer in 1..2^31-1"),
])
def test_rule(sources, tmp_path, role, key, vtype, value, fragment):
    full = f"{_arch(role)}.{key}"
    value, sub = value if vtype == T.ARRAY else (value, None)
    pair = mutated(sources, tmp_path, role, full, vtype, value, sub)
    problems = [str(p) for p in header_problems(read_header(pair[role]))]
    assert any(p.startswith(f"{pair[role]}: {full}: ") and fragment in p for p in problems), problems


def test_the_bundled_pair_and_every_rule_key_pass(sources):
    for src in sources.values():
        assert header_problems(read_header(src.path)) == []
    # every rule names a key llama.cpp's loaders read (a typo would check nothing)
    assert K.suffix(K.RMS_EPS) in MODEL_RULES and K.suffix(K.BLOCK_SIZE) in ARCH_RULES[K.ARCH]


def test_a_missing_required_key_is_named(sources, tmp_path):
    out = tmp_path / "no-eps.gguf"
    sources["target"].write_without(out, f"laguna.{EPS}")
    problems = [str(p) for p in header_problems(read_header(out))]
    assert problems == [f"{out}: laguna.{EPS}: expected a finite number > 0 (FLOAT32), found nothing (the key is missing)"]
    assert header_problems(read_header(out), require=False) == []


@pytest.mark.parametrize("where", ["magic", "counts", "first key", "token list", "tensor infos", "mid data",
                                   "last byte"])
def test_a_truncated_file_is_one_line(sources, tmp_path, where):
    src = sources["drafter"]
    out = tmp_path / "cut.gguf"
    src.write_truncated(out, src.truncation_offsets()[where])
    with pytest.raises(UserError, match=rf"^{out}: not a readable GGUF file \(") as e:
        read_header(out)
    assert "\n" not in str(e.value)
    res = run_cli("inspect", out)
    assert res.code == 2 and f"error: {out}: not a readable GGUF file" in res.stderr
