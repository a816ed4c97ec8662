"""Test-only: write a drafter GGUF in Poolside's own layout (SPEC §5b) from an HF drafter checkpoint.

This follows the published layout as SPEC §5b and Poolside's fork describe it, and shares no
code with ``convert/poolside.py`` (the reader under test): the generic ``dflash`` architecture
of llama.cpp, ``dflash.decoder_arch = "laguna"``, the target layers stored llama.cpp-style
(HF id + 1) in ``dflash.target_layers``, the mask token in ``tokenizer.ggml.mask_token_id``,
the target's tokenizer copied in, the aux norms stacked into one ``enc.aux_norm.weight`` of ne
``[n_embd, n_target_layers]``, q/k/v stored split, 12 tensors per block (``ffn_norm`` is the
pre-FFN norm), norms in F32 and matrices in BF16 (as published) or Q8_0 / F32.

    write_poolside_gguf(hf_dir, target_gguf, out, "bf16")
    write_poolside_gguf(hf_dir, target_gguf, out, tweak=lambda kv, tensors: tensors.pop("blk.1.attn_gate.weight"))
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import quantize

from laguna_dflash.convert.gguf import keys as K
from safetensors.torch import load_file

ARCH = K.POOLSIDE_ARCH
U32, I32, F32, BOOL, STR, ARR = (GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.FLOAT32,
                                 GGUFValueType.BOOL, GGUFValueType.STRING, GGUFValueType.ARRAY)
#: general.file_type (llama.cpp's LLAMA_FTYPE) of each matrix type.
FILE_TYPES = {"bf16": 32, "q8_0": 7, "f32": 0}

#: metadata key -> (value, type, array element type)
Metadata = dict[str, tuple[Any, GGUFValueType, GGUFValueType | None]]
#: tensor name -> (data as gguf-py writes it, GGML type)
Tensors = dict[str, tuple[np.ndarray, GGMLQuantizationType]]


def _hf_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    weights = load_file(str(hf_dir / "model.safetensors"))
    return {k.removeprefix("model."): v for k, v in weights.items()}


def _matrix(x: torch.Tensor, outtype: str) -> tuple[np.ndarray, GGMLQuantizationType]:
    if outtype == "bf16" and x.dtype == torch.bfloat16:
        return x.contiguous().view(torch.int16).numpy().view(np.uint16), GGMLQuantizationType.BF16
    values = x.float().numpy()
    qtype = {"bf16": GGMLQuantizationType.BF16, "q8_0": GGMLQuantizationType.Q8_0,
             "f32": GGMLQuantizationType.F32}[outtype]
    return (values if qtype == GGMLQuantizationType.F32 else quantize(values, qtype)), qtype


def _norm(x: torch.Tensor) -> tuple[np.ndarray, GGMLQuantizationType]:
    return x.float().numpy(), GGMLQuantizationType.F32


def _target_tokenizer(target_gguf: Path) -> Metadata:
    r = GGUFReader(target_gguf)
    out: Metadata = {}
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        if f.types[0] == ARR:
            out[key] = (f.contents(), ARR, f.types[-1])
        else:
            out[key] = (f.contents(), f.types[0], None)
    return out


def poolside_contents(hf_dir: Path, target_gguf: Path, outtype: str = "bf16") -> tuple[Metadata, Tensors]:
    """The metadata and tensors of the Poolside-layout file for the drafter in ``hf_dir``."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    d = cfg["dflash_config"]
    w = _hf_weights(hf_dir)
    n_layer, n_head, n_kv = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    name = str(cfg.get("_name_or_path", hf_dir.name)).split("/")[-1]
    kv: Metadata = {
        "general.type": ("model", STR, None),
        "general.name": (name, STR, None),
        "general.file_type": (FILE_TYPES[outtype], U32, None),
        "general.source.huggingface.repository": (str(cfg.get("_name_or_path", "")), STR, None),
        f"{ARCH}.decoder_arch": ("laguna", STR, None),
        f"{ARCH}.block_count": (n_layer, U32, None),
        f"{ARCH}.context_length": (cfg["max_position_embeddings"], U32, None),
        f"{ARCH}.embedding_length": (cfg["hidden_size"], U32, None),
        f"{ARCH}.feed_forward_length": (cfg["intermediate_size"], U32, None),
        f"{ARCH}.attention.head_count": (n_head, U32, None),
        f"{ARCH}.attention.head_count_kv": (n_kv, U32, None),
        f"{ARCH}.attention.key_length": (head_dim, U32, None),
        f"{ARCH}.attention.value_length": (head_dim, U32, None),
        f"{ARCH}.attention.layer_norm_rms_epsilon": (cfg["rms_norm_eps"], F32, None),
        f"{ARCH}.attention.causal": (bool(d["causal"]), BOOL, None),
        f"{ARCH}.attention.sliding_window": (cfg["sliding_window"], U32, None),
        f"{ARCH}.attention.sliding_window_pattern": (
            [t == "sliding_attention" for t in cfg["layer_types"]], ARR, BOOL),
        f"{ARCH}.rope.freq_base": (cfg["rope_theta"], F32, None),
        f"{ARCH}.rope.dimension_count": (head_dim, U32, None),
        f"{ARCH}.block_size": (d["block_size"], U32, None),
        f"{ARCH}.target_layers": ([t + 1 for t in d["target_layer_ids"]], ARR, I32),
    }
    kv |= _target_tokenizer(target_gguf)
    kv["tokenizer.ggml.mask_token_id"] = (d["mask_token_id"], U32, None)

    n_aux = len(d["target_layer_ids"])
    tensors: Tensors = {
        "fc.weight": _matrix(w["fc.weight"], outtype),
        "enc.output_norm.weight": _norm(w["hidden_norm.weight"]),
        "enc.aux_norm.weight": (np.stack([w[f"aux_hidden_norms.{i}.weight"].float().numpy()
                                          for i in range(n_aux)]), GGMLQuantizationType.F32),
        "output_norm.weight": _norm(w["norm.weight"]),
    }
    q, kvr = n_head * head_dim, n_kv * head_dim
    for n in range(n_layer):
        hf = f"layers.{n}."
        qkv = w[hf + "self_attn.qkv_proj.weight"]
        tensors |= {
            f"blk.{n}.attn_norm.weight": _norm(w[hf + "input_layernorm.weight"]),
            f"blk.{n}.attn_q.weight": _matrix(qkv[:q], outtype),
            f"blk.{n}.attn_k.weight": _matrix(qkv[q:q + kvr], outtype),
            f"blk.{n}.attn_v.weight": _matrix(qkv[q + kvr:], outtype),
            f"blk.{n}.attn_output.weight": _matrix(w[hf + "self_attn.o_proj.weight"], outtype),
            f"blk.{n}.attn_q_norm.weight": _norm(w[hf + "self_attn.q_norm.weight"]),
            f"blk.{n}.attn_k_norm.weight": _norm(w[hf + "self_attn.k_norm.weight"]),
            f"blk.{n}.attn_gate.weight": _matrix(w[hf + "self_attn.g_proj.weight"], outtype),
            f"blk.{n}.ffn_norm.weight": _norm(w[hf + "post_attention_layernorm.weight"]),
            f"blk.{n}.ffn_gate.weight": _matrix(w[hf + "mlp.gate_proj.weight"], outtype),
            f"blk.{n}.ffn_up.weight": _matrix(w[hf + "mlp.up_proj.weight"], outtype),
            f"blk.{n}.ffn_down.weight": _matrix(w[hf + "mlp.down_proj.weight"], outtype),
        }
    return kv, tensors


def write_poolside_gguf(hf_dir: Path, target_gguf: Path, out: Path, outtype: str = "bf16",
                        tweak: Callable[[Metadata, Tensors], Any] | None = None) -> Path:
    """Write the Poolside-layout file; ``tweak`` may edit the metadata and tensors first (bad files)."""
    kv, tensors = poolside_contents(Path(hf_dir), Path(target_gguf), outtype)
    if tweak is not None:
        tweak(kv, tensors)
    w = GGUFWriter(str(out), ARCH)
    for key, (value, vtype, sub) in kv.items():
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, (data, qtype) in tensors.items():
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out)
