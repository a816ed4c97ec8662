"""convert/quantize.py: our NumPy encoders equal gguf-py's reference ones byte for byte."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from laguna_dflash.convert.errors import ContractError
from laguna_dflash.convert.quantize import OutType, decode, encode, encoded_nbytes, quantize_q8_0, to_bf16_bits


def edge_cases() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1234)
    ties = np.tile((np.arange(-64, 64) + 0.5).astype(np.float32), (4, 1))
    ties[:, 0] = 127.0  # d = 1 exactly, so x * (1/d) lands on .5 exactly
    scaled_ties = (np.arange(-127 * 2, 127 * 2 + 2, dtype=np.float32) / 2)[:256].reshape(8, 32)
    scaled_ties[:, 0] = 127.0
    one_big = np.zeros((2, 64), np.float32)
    one_big[:, 5] = -3.0
    return {
        "normal": rng.standard_normal((64, 256)).astype(np.float32),
        "ties": ties,
        "scaled-ties": scaled_ties,
        "zeros": np.zeros((3, 64), np.float32),
        "one-nonzero": one_big,
        "tiny": (rng.standard_normal((4, 64)) * 1e-30).astype(np.float32),  # scale underflows float16
        "large": (rng.standard_normal((4, 64)) * 1e6).astype(np.float32),
        "bf16-grid": (np.frombuffer(rng.integers(0, 2**16, 4096, dtype=np.uint16).tobytes(), np.uint16)
                      .astype(np.uint32) << 16).view(np.float32).reshape(32, 128).copy(),
    }


@pytest.mark.parametrize("case", list(edge_cases()))
def test_q8_0_bytes_equal_gguf_py(case: str) -> None:
    x = edge_cases()[case]
    if case == "bf16-grid":  # random bit patterns: keep what Q8_0 can represent
        x = np.where(np.isfinite(x) & (np.abs(x) < 1e6), x, 0).astype(np.float32)
    ours = quantize_q8_0(x)
    ref = gguf.quants.quantize(x, Q.Q8_0)
    assert ours.dtype == np.uint8 and ours.shape == ref.shape
    assert np.array_equal(ours, ref)


def test_q8_0_in_chunks_equals_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    import laguna_dflash.convert.quantize as qz

    x = np.random.default_rng(0).standard_normal((40, 96)).astype(np.float32)
    whole = quantize_q8_0(x)
    monkeypatch.setattr(qz, "_CHUNK_VALUES", 64)  # 2 blocks per step, many steps
    assert np.array_equal(quantize_q8_0(x), whole)
    assert np.array_equal(whole, gguf.quants.quantize(x, Q.Q8_0))


@pytest.mark.parametrize("case", list(edge_cases()))
def test_bf16_bits_equal_gguf_py(case: str) -> None:
    x = edge_cases()[case]
    ours = to_bf16_bits(x)
    ref = gguf.quants.quantize(x, Q.BF16)
    assert np.array_equal(ours.view(np.uint8).reshape(ref.shape), ref)


def test_bf16_specials_and_rounding() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 3.3895314e38],
                 dtype=np.float32)
    ref = gguf.quants.quantize(x, Q.BF16).view(np.uint16)
    assert np.array_equal(to_bf16_bits(x), ref)
    assert to_bf16_bits(np.array([1.0 + 2**-8], np.float32))[0] == 0x3F80  # half-way rounds to even (down)
    assert to_bf16_bits(np.array([1.0 + 3 * 2**-8], np.float32))[0] == 0x3F82  # half-way rounds to even (up)


def test_q8_0_refuses_values_whose_scale_overflows() -> None:
    x = np.zeros((1, 32), np.float32)
    x[0, 3] = 1e7
    with pytest.raises(ContractError, match=r"w\.safetensors: t: values: expected \|x\| <= 8\.3\d*e\+06 for Q8_0"):
        encode(x, Q.Q8_0, "w.safetensors: t")
    x[0, 3] = np.nan
    with pytest.raises(ContractError):
        encode(x, Q.Q8_0, "t")


def test_f16_refuses_values_it_cannot_hold() -> None:
    with pytest.raises(ContractError, match=r"w\.safetensors: t: values: expected \|x\| <= 65504"):
        encode(np.array([1.0, 70000.0], np.float32), Q.F16, "w.safetensors: t")
    assert encode(np.array([1.5], np.float32), Q.F16).dtype == np.float16


@pytest.mark.parametrize("outtype,qtype,ftype,nbytes", [
    (OutType.Q8_0, Q.Q8_0, 7, 34 * 4), (OutType.BF16, Q.BF16, 32, 256),
    (OutType.F16, Q.F16, 1, 256), (OutType.F32, Q.F32, 0, 512),
])
def test_types_sizes_and_round_trip(outtype: OutType, qtype: Q, ftype: int, nbytes: int) -> None:
    assert outtype.ggml_type == qtype and outtype.file_type == ftype
    x = np.random.default_rng(2).standard_normal((2, 64)).astype(np.float32)
    enc = encode(x, qtype)
    assert enc.nbytes == encoded_nbytes((2, 64), qtype) == nbytes
    back = decode(enc, qtype, (2, 64))
    tol = {Q.Q8_0: 2e-2, Q.BF16: 1e-2, Q.F16: 1e-3, Q.F32: 0}[qtype]
    np.testing.assert_allclose(back, x, atol=tol * np.abs(x).max())
