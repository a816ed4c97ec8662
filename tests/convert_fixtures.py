"""Helpers and fixtures for the laguna-gguf converter tests (imported by tests/test_convert_*.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from typer.testing import CliRunner

from laguna_dflash.convert.gguf import keys as K
from laguna_dflash.convert.cli import app
from helpers.synthetic import TINY_S, TINY_XS, write_target_gguf

U32, I32, F32, BOOL, STR, ARR = (GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.FLOAT32,
                                 GGUFValueType.BOOL, GGUFValueType.STRING, GGUFValueType.ARRAY)

#: Every non-tokenizer metadata key of a converted (sliding-window) drafter, with its GGUF type
#: (SPEC §5a + general.*), written out here independently of convert/gguf/keys.py.
#: ``general.source.huggingface.repository`` is present only when a source repository is known;
#: ``attention.sliding_window`` only when the layers are sliding.
LAYOUT_KEYS: dict[str, tuple[GGUFValueType, ...]] = {
    "general.architecture": (STR,),
    "general.type": (STR,),
    "general.name": (STR,),
    "general.basename": (STR,),
    "general.file_type": (U32,),
    "general.quantization_version": (U32,),
    K.VOCAB_SIZE: (U32,),
    K.CONTEXT_LENGTH: (U32,),
    K.EMBEDDING_LENGTH: (U32,),
    K.FEED_FORWARD_LENGTH: (U32,),
    K.BLOCK_COUNT: (U32,),
    K.HEAD_COUNT: (U32,),
    K.HEAD_COUNT_KV: (U32,),
    K.KEY_LENGTH: (U32,),
    K.VALUE_LENGTH: (U32,),
    K.RMS_EPS: (F32,),
    K.CAUSAL: (BOOL,),
    K.SLIDING_WINDOW: (U32,),
    K.SLIDING_WINDOW_PATTERN: (ARR, BOOL),
    K.ROPE_FREQ_BASE: (F32,),
    K.ROPE_DIMENSION_COUNT: (U32,),
    K.DFLASH_LAGUNA: (BOOL,),
    K.BLOCK_SIZE: (U32,),
    K.MASK_TOKEN_ID: (U32,),
    K.TARGET_LAYER_IDS: (ARR, I32),
    K.N_TARGET_FEATURES: (U32,),
    K.GATING: (STR,),
    K.TARGET_NAME: (STR,),
    K.TARGET_N_LAYER: (U32,),
}
SOURCE_REPO_KEY = "general.source.huggingface.repository"

#: GGUF tensor name -> (HF canonical name, row part) for the globals and for block ``{n}``.
GLOBAL_TENSORS = [("dflash_fc.weight", "fc.weight"), ("dflash_hidden_norm.weight", "hidden_norm.weight")]
AUX_TENSOR = ("dflash_aux_hidden_norm.{i}.weight", "aux_hidden_norms.{i}.weight")
OUTPUT_NORM = ("output_norm.weight", "norm.weight")
BLOCK_TENSORS = [
    ("blk.{n}.attn_norm.weight", "layers.{n}.input_layernorm.weight", None),
    ("blk.{n}.attn_q.weight", "layers.{n}.self_attn.qkv_proj.weight", "q"),
    ("blk.{n}.attn_k.weight", "layers.{n}.self_attn.qkv_proj.weight", "k"),
    ("blk.{n}.attn_v.weight", "layers.{n}.self_attn.qkv_proj.weight", "v"),
    ("blk.{n}.attn_q_norm.weight", "layers.{n}.self_attn.q_norm.weight", None),
    ("blk.{n}.attn_k_norm.weight", "layers.{n}.self_attn.k_norm.weight", None),
    ("blk.{n}.attn_gate.weight", "layers.{n}.self_attn.g_proj.weight", None),
    ("blk.{n}.attn_output.weight", "layers.{n}.self_attn.o_proj.weight", None),
    # ik_llama.cpp's name for the pre-FFN norm, which its loader requires (not ffn_norm)
    ("blk.{n}.post_attention_norm.weight", "layers.{n}.post_attention_layernorm.weight", None),
    ("blk.{n}.ffn_gate.weight", "layers.{n}.mlp.gate_proj.weight", None),
    ("blk.{n}.ffn_up.weight", "layers.{n}.mlp.up_proj.weight", None),
    ("blk.{n}.ffn_down.weight", "layers.{n}.mlp.down_proj.weight", None),
]


def expected_tensor_table(p: dict[str, Any]) -> dict[str, tuple[str, tuple[int, int] | None, tuple[int, ...]]]:
    """GGUF name -> (HF name, row range or None, GGUF ne) for a drafter built from preset ``p``.

    Written out independently of convert/mapping.py, from SPEC §2 / §5a, so the two can disagree.
    """
    h, nh, nkv, hd, ff = p["hidden"], p["n_heads"], p["n_kv_heads"], p["head_dim"], p["intermediate"]
    n_aux = len(p["target_layer_ids"])
    q, kv = nh * hd, nkv * hd
    rows = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}
    ne = {
        "fc.weight": (n_aux * h, h), "hidden_norm.weight": (h,), "norm.weight": (h,),
        "input_layernorm.weight": (h,), "q": (h, q), "k": (h, kv), "v": (h, kv),
        "q_norm.weight": (hd,), "k_norm.weight": (hd,), "g_proj.weight": (h, nh), "o_proj.weight": (q, h),
        "post_attention_layernorm.weight": (h,), "gate_proj.weight": (h, ff), "up_proj.weight": (h, ff),
        "down_proj.weight": (ff, h), "aux": (h,),
    }
    out: dict[str, tuple[str, tuple[int, int] | None, tuple[int, ...]]] = {}
    for g, hf in GLOBAL_TENSORS:
        out[g] = (hf, None, ne[hf])
    for i in range(n_aux):
        out[AUX_TENSOR[0].format(i=i)] = (AUX_TENSOR[1].format(i=i), None, ne["aux"])
    out[OUTPUT_NORM[0]] = (OUTPUT_NORM[1], None, ne["norm.weight"])
    for n in range(p["n_layers"]):
        for g, hf, part in BLOCK_TENSORS:
            key = part or ".".join(hf.split(".")[-2:])
            out[g.format(n=n)] = (hf.format(n=n), rows[part] if part else None, ne[key])
    return out


@dataclass
class GGUFContents:
    """A GGUF read back: metadata (types + decoded values) and tensors (ne, type, raw data)."""

    kv_types: dict[str, tuple[GGUFValueType, ...]]
    kv: dict[str, Any]
    tensors: dict[str, tuple[tuple[int, ...], GGMLQuantizationType, np.ndarray]]
    tensor_order: list[str]


def read_gguf(path: Path) -> GGUFContents:
    r = GGUFReader(path)
    types, values = {}, {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        types[k] = tuple(f.types)
        values[k] = f.contents()
    tensors = {t.name: (tuple(int(d) for d in t.shape), GGMLQuantizationType(t.tensor_type), np.array(t.data))
               for t in r.tensors}
    return GGUFContents(types, values, tensors, [t.name for t in r.tensors])


runner = CliRunner()


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str


def run_cli(*args: str | Path) -> CliResult:
    res = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
    return CliResult(res.exit_code, res.stdout, res.stderr)


def target_for(preset: dict[str, Any], path: Path, **over: Any) -> Path:
    """A metadata-only target GGUF that pairs with a drafter of ``preset`` (unless ``over`` says otherwise)."""
    kw = dict(n_layer=preset["num_target_layers"], hidden=preset["hidden"], vocab_size=preset["vocab_size"])
    kw.update(over)
    return write_target_gguf(path, **kw)


@pytest.fixture(scope="session")
def cv_targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Target GGUFs pairing with the TINY_XS and TINY_S presets."""
    d = tmp_path_factory.mktemp("cv-targets")
    return {"xs": target_for(TINY_XS, d / "xs-target.gguf"), "s": target_for(TINY_S, d / "s-target.gguf")}


PRESETS = {"xs": TINY_XS, "s": TINY_S}


def leftovers(directory: Path) -> list[str]:
    """Output or partial files left in ``directory``."""
    return sorted(p.name for p in directory.iterdir() if p.suffix == ".gguf" or ".partial" in p.name)
