"""laguna-gguf convert --outtype q6_k|q5_k_m|q4_k_m|q4_0: llama.cpp's own quantiser, fed a lossless
intermediate file in our layout.

The bundled tiny drafter is converted once per type; the files must pair with the tiny target in
``inspect``, load in laguna-run and keep greedy output exact, keep every norm F32 and give each
matrix the requested type wherever its row length allows a K-quant (llama.cpp's fallback
otherwise). The failure paths (an unknown type, values the 4-bit scales cannot hold, a
quantiser that fails or crashes) are one line, exit 2, and leave no file behind.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from convert_fixtures import PRESETS, GGUFContents, read_gguf, run_cli, target_for
from gguf import GGMLQuantizationType as Q

import laguna_dflash.convert.quantize as quantize
from laguna_dflash.convert.quantize import LOWBIT_MAX_ABS, OutType
from laguna_dflash.convert.safetensors_io import read_header
from helpers.synthetic import write_drafter
from laguna_dflash.runtime import assets
from laguna_dflash.runtime.cli import main as laguna_run

TARGET = assets.TINY_TARGET
DRAFTER = assets.TINY_DRAFTER_HF
LOWBIT = [OutType.Q6_K, OutType.Q5_K_M, OutType.Q4_K_M, OutType.Q4_0]
#: llama.cpp's replacement for a K-quant on a row that is not a multiple of 256 (tensor_type_fallback)
K_FALLBACK = {Q.Q6_K: Q.Q8_0, Q.Q5_K: Q.Q5_1, Q.Q4_K: Q.Q5_0}
#: What a matrix of each file may hold: the base type, or the Q6_K that the _M mixes give some tensors
ALLOWED = {OutType.Q6_K: {Q.Q6_K}, OutType.Q5_K_M: {Q.Q5_K, Q.Q6_K}, OutType.Q4_K_M: {Q.Q4_K, Q.Q6_K},
           OutType.Q4_0: {Q.Q4_0}}
PROMPT = "def parse_args(argv):\n    parser = argparse.ArgumentParser("


def one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[OutType, Path]:
    """The tiny drafter as Q8_0 (the reference) and as each 4-6-bit type, through the CLI."""
    d = tmp_path_factory.mktemp("lowbit")
    out = {}
    for t in [OutType.Q8_0, *LOWBIT]:
        path = d / f"tiny-{t.value}.gguf"
        res = run_cli("convert", DRAFTER, "--target", TARGET, "-o", path, "--outtype", t.value.upper(), "-q")
        assert res.code == 0, res.stdout + res.stderr
        out[t] = path
    # the intermediate files and llama.cpp's partial output are gone
    assert sorted(p.name for p in d.iterdir()) == sorted(p.name for p in out.values())
    return out


@pytest.fixture(scope="module")
def contents(converted) -> dict[OutType, GGUFContents]:
    return {t: read_gguf(path) for t, path in converted.items()}


@pytest.mark.parametrize("outtype", LOWBIT, ids=lambda t: t.value)
def test_norms_stay_f32_and_matrices_get_the_requested_type(contents, outtype: OutType) -> None:
    got, ref = contents[outtype], contents[OutType.Q8_0]
    assert set(got.tensors) == set(ref.tensors)
    base_count = 0
    for name, (ne, qtype, data) in got.tensors.items():
        if len(ne) == 1:
            assert qtype == Q.F32, name
            assert np.array_equal(data, ref.tensors[name][2]), name  # copied, not requantised
            continue
        allowed = ALLOWED[outtype]
        if ne[0] % 256 and outtype != OutType.Q4_0:
            allowed = {K_FALLBACK[t] for t in allowed}
        assert qtype in allowed, f"{name} {ne}: {qtype.name}, expected one of {sorted(t.name for t in allowed)}"
        base_count += qtype == outtype.base_type
        # the quantiser read the right values: close to the Q8_0 file's (whose error is ~0.3%)
        shape = tuple(reversed(ne))
        x = gguf.quants.dequantize(data, qtype).reshape(shape)
        want = gguf.quants.dequantize(ref.tensors[name][2], Q.Q8_0).reshape(shape)
        rel = float(np.sqrt(np.mean((x - want) ** 2) / np.mean(want ** 2)))
        assert rel < 0.2, f"{name}: relative RMS error {rel:.3f} against Q8_0"
    assert base_count >= 1, f"no matrix got {outtype.base_type.name}"


@pytest.mark.parametrize("outtype", LOWBIT, ids=lambda t: t.value)
def test_metadata_is_ours_with_the_new_file_type(contents, outtype: OutType) -> None:
    got, ref = contents[outtype], contents[OutType.Q8_0]
    assert got.kv_types == ref.kv_types
    differ = sorted(k for k in ref.kv if not np.array_equal(np.asarray(got.kv[k], dtype=object),
                                                             np.asarray(ref.kv[k], dtype=object)))
    assert differ == ["general.file_type"]
    assert got.kv["general.file_type"] == outtype.file_type


@pytest.mark.parametrize("outtype", LOWBIT, ids=lambda t: t.value)
def test_inspect_pairs_it_with_the_target(converted, outtype: OutType) -> None:
    res = run_cli("inspect", converted[outtype], "--target", TARGET)
    assert res.code == 0, res.stdout + res.stderr
    assert f"{outtype.file_type} (MOSTLY_{outtype.name})" in res.stdout
    assert "pairs with target" in res.stdout


def _run(capsys, *args: str) -> dict:
    # one thread: on a busy machine two stall at every op's barrier (minutes instead of seconds)
    code = laguna_run(["-m", str(TARGET), "-p", PROMPT, "-n", "40", "--cache-type", "f32", "-t", "1", "--json",
                       *args])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def test_laguna_run_greedy_output_equals_plain_greedy(converted, capsys) -> None:
    plain = _run(capsys, "--n-max", "0")["tokens"]
    assert len(plain) == 40
    for outtype in LOWBIT:
        res = _run(capsys, "-md", str(converted[outtype]), "--n-max", "4")
        assert res["tokens"] == plain, outtype.value
        assert res["stats"]["accepted"] > 0, outtype.value  # it drafts, and some drafts are right


def test_unknown_outtype_is_one_line_exit_2(tmp_path: Path) -> None:
    # the type is checked first: a target that does not exist is not even looked at
    res = run_cli("convert", DRAFTER, "--target", tmp_path / "missing.gguf", "-o", tmp_path / "o.gguf",
                  "--outtype", "q3_k")
    assert res.code == 2
    line = one_error_line(res.stderr)
    assert line == ("error: --outtype: expected one of q8_0, bf16, f16, f32, q6_k, q5_k_m, q4_k_m, q4_0, "
                    "found 'q3_k'")
    assert list(tmp_path.iterdir()) == []


XS = PRESETS["xs"]
MATRIX = "layers.0.mlp.down_proj.weight"


def _poke(drafter: Path, tensor: str, index: int, value: float) -> None:
    path = drafter / "model.safetensors"
    ref = read_header(path)[tensor]
    assert ref.dtype == "F32"
    with open(path, "r+b") as f:
        f.seek(ref.offset + 4 * index)
        f.write(np.array([value], np.float32).tobytes())


@pytest.mark.parametrize("outtype,value,expected", [
    ("q4_0", 1e6, f"values: expected |x| <= {LOWBIT_MAX_ABS:g} for q4_0 (its block scales are float16; "
                  "use --outtype bf16), found 1e+06"),
    ("q4_k_m", float("nan"), "values: expected finite numbers (no NaN or Inf), found nan at [0, 5]"),
], ids=["too-big-for-q4_0", "nan"])
def test_values_a_lowbit_type_cannot_hold_are_refused(tmp_path: Path, outtype: str, value: float,
                                                      expected: str) -> None:
    drafter = write_drafter(tmp_path / "d", **XS, dtype="f32")
    _poke(drafter, MATRIX, 5, value)
    target = target_for(XS, tmp_path / "t.gguf")
    res = run_cli("convert", drafter, "--target", target, "-o", tmp_path / "o.gguf", "--outtype", outtype, "-q")
    assert res.code == 2, res.stdout + res.stderr
    line = one_error_line(res.stderr)
    assert f"model.safetensors: {MATRIX}: {expected}" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "t.gguf"]


def test_rows_that_are_not_whole_blocks_are_refused(tmp_path: Path) -> None:
    drafter = write_drafter(tmp_path / "d", **{**XS, "intermediate": 48})  # ffn_down rows of 48 values
    target = target_for(XS, tmp_path / "t.gguf")
    res = run_cli("convert", drafter, "--target", target, "-o", tmp_path / "o.gguf", "--outtype", "q5_k_m", "-q")
    assert res.code == 2, res.stdout + res.stderr
    line = one_error_line(res.stderr)
    assert ("layers.0.mlp.down_proj.weight: expected a row length that is a multiple of 32 for q5_k_m "
            "(use --outtype bf16, f16 or f32), found 48") in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "t.gguf"]


# A stand-in for the quantiser's child process: it starts its output file, then fails or crashes.
_FAIL = ("import os, sys; open(sys.argv[1], 'wb').write(b'GGUF');"
         "print('llama_model_quantize: failed to quantize: basic_ios::clear: iostream error', flush=True);"
         "sys.exit(1)")
_CRASH = ("import os, sys; open(sys.argv[1], 'wb').write(b'GGUF');"
          "print('GGML_ASSERT(n_dims >= 2) failed', flush=True); os.abort()")


@pytest.mark.parametrize("script,reason", [
    (_FAIL, "failed: basic_ios::clear: iostream error; no output written"),
    (_CRASH, "failed: killed by SIGABRT (GGML_ASSERT(n_dims >= 2) failed); no output written"),
], ids=["fails", "aborts"])
def test_a_failing_quantiser_is_one_line_and_leaves_nothing(tmp_path: Path, monkeypatch, script: str,
                                                            reason: str) -> None:
    monkeypatch.setattr(quantize, "quantize_command",
                        lambda src, dst, ftype, n: [sys.executable, "-c", script, str(dst)])
    drafter = write_drafter(tmp_path / "d", **XS)
    target = target_for(XS, tmp_path / "t.gguf")
    out = tmp_path / "o.gguf"
    res = run_cli("convert", drafter, "--target", target, "-o", out, "--outtype", "q4_k_m", "-q")
    assert res.code == 2, res.stdout + res.stderr
    line = one_error_line(res.stderr)
    assert line == f"error: -o {out}: llama.cpp's quantiser (q4_k_m) {reason}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "t.gguf"]  # no output, partial or intermediate


def test_a_poolside_layout_file_quantises_to_the_same_file_as_the_hf_checkpoint(contents, tmp_path: Path) -> None:
    fixture = pytest.importorskip("poolside_fixture")
    pool = fixture.write_poolside_gguf(DRAFTER, TARGET, tmp_path / "poolside-bf16.gguf")
    res = run_cli("convert", pool, "--target", TARGET, "-o", tmp_path / "poolside.gguf", "--outtype", "q4_k_m", "-q")
    assert res.code == 0, res.stdout + res.stderr
    hf, ps = contents[OutType.Q4_K_M], read_gguf(tmp_path / "poolside.gguf")
    assert ps.kv_types == hf.kv_types and ps.kv["general.file_type"] == OutType.Q4_K_M.file_type
    assert set(ps.tensors) == set(hf.tensors)
    for name, (ne, qtype, data) in hf.tensors.items():
        assert ps.tensors[name][:2] == (ne, qtype), name
        assert np.array_equal(ps.tensors[name][2], data), name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["poolside-bf16.gguf", "poolside.gguf"]
