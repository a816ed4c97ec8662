"""Deterministic random Laguna DFlash drafter checkpoints, for tests and benchmarks.

    from helpers.synthetic import XS_2_1, write_drafter
    write_drafter(Path("xs"), **XS_2_1)                        # the real XS 2.1 shapes, 0.9 GB bf16
    write_drafter(Path("tiny"), fused_qkv=False, prefix=True)  # a few hundred KB, split q/k/v, ``model.``

The checkpoint is what Poolside ships: ``config.json`` with the field names of the real
config (SPEC §2) and ``model.safetensors`` (or shards plus ``model.safetensors.index.json``).
Each tensor's values depend only on ``seed`` and the tensor's canonical name, so the fused and
the split form of one seed hold the same weights (``q_proj`` is the first rows of
``qkv_proj``). Tensors are generated and written one at a time.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from laguna_dflash.convert.checkpoint import (ARCHITECTURE, DEFAULT_CONTEXT_LENGTH, MODEL_TYPE, SLIDING, DrafterConfig,
                                              expected_tensors, parse_config)
from laguna_dflash.convert.gguf import keys as K
from laguna_dflash.convert.quantize import to_bf16_bits
from laguna_dflash.convert.safetensors_io import PlannedTensor, write_streaming

DType = Literal["bf16", "f16", "f32"]
_ST_DTYPE = {"bf16": "BF16", "f16": "F16", "f32": "F32"}


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


#: Use as a value in ``config_overrides`` to delete a field from the written config.
ABSENT: Any = _Absent()

#: Keyword arguments of :func:`write_drafter` for the published drafter shapes.
XS_2_1: dict[str, Any] = dict(
    hidden=2048, n_layers=5, n_heads=64, n_kv_heads=8, head_dim=128, intermediate=8192,
    target_layer_ids=(1, 13, 25, 33, 39), num_target_layers=40, vocab_size=100352,
)
S_2_1: dict[str, Any] = dict(
    hidden=3072, n_layers=6, n_heads=72, n_kv_heads=8, head_dim=128, intermediate=12288,
    target_layer_ids=(1, 10, 19, 29, 38, 47), num_target_layers=48, vocab_size=100352,
)
#: Tiny stand-ins with the same structure (Q8_0-friendly: every row length a multiple of 32).
TINY_XS: dict[str, Any] = dict(
    hidden=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, intermediate=96,
    target_layer_ids=(1, 3), num_target_layers=4, vocab_size=256,
)
TINY_S: dict[str, Any] = dict(
    hidden=96, n_layers=3, n_heads=6, n_kv_heads=2, head_dim=16, intermediate=128,
    target_layer_ids=(0, 2, 5), num_target_layers=6, vocab_size=320,
)


def drafter_config_dict(
    *,
    hidden: int = 64,
    n_layers: int = 2,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    head_dim: int = 16,
    intermediate: int = 96,
    target_layer_ids: Sequence[int] = (1, 3),
    num_target_layers: int = 4,
    vocab_size: int = 256,
    sliding_window: int = 512,
    block_size: int = 16,
    mask_token_id: int = 12,
    rms_norm_eps: float = 1e-6,
    rope_theta: float = 500000.0,
    max_position_embeddings: int = DEFAULT_CONTEXT_LENGTH,
    name_or_path: str | None = None,
    gating: Any = "per-head",
    layer_type: str = SLIDING,
) -> dict[str, Any]:
    """A drafter ``config.json`` with the field names and layout of Poolside's real one.

    ``gating`` and ``layer_type`` choose the variant (vLLM's values: ``True``/``"per-head"``,
    ``"per-element"``, ``False``/``"disabled"``; ``"sliding_attention"`` or ``"full_attention"``
    for every layer); the rest of the config is the same for every variant.
    """
    ids = [int(i) for i in target_layer_ids]
    cfg: dict[str, Any] = {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "dflash_config": {
            "block_size": block_size,
            "causal": True,
            "mask_token_id": mask_token_id,
            "num_target_layers": num_target_layers,
            "target_layer_ids": ids,
        },
        "draft_vocab_size": vocab_size,
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in ids],
        "gating": gating,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "layer_types": [layer_type] * n_layers,
        "max_position_embeddings": max_position_embeddings,
        "num_attention_heads": n_heads,
        "num_experts": 0,
        "num_hidden_layers": n_layers,
        "num_key_value_heads": n_kv_heads,
        "rms_norm_eps": rms_norm_eps,
        "rope_theta": rope_theta,
        "sliding_window": sliding_window,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": vocab_size,
    }
    if name_or_path is not None:
        cfg = {"_name_or_path": name_or_path, **cfg}
    return cfg


def apply_overrides(cfg: dict[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """``cfg`` with ``overrides`` applied; nested dicts (``dflash_config``) merge, ``ABSENT`` deletes."""
    out = dict(cfg)
    for key, value in (overrides or {}).items():
        if value is ABSENT:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = apply_overrides(dict(out[key]), value)
        else:
            out[key] = value
    return out


def tensor_values(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """The float32 values of canonical tensor ``name`` for ``seed`` (norms near 1, matrices ~ 1/sqrt(cols))."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    x = rng.standard_normal(shape, dtype=np.float32)
    if len(shape) == 1:
        x *= np.float32(0.1)
        x += np.float32(1.0)
    else:
        x *= np.float32(1.0 / math.sqrt(shape[-1]))
    return x


def random_weights(cfg: DrafterConfig, seed: int = 0) -> Iterator[tuple[str, np.ndarray]]:
    """Canonical (fused, unprefixed) tensor names and float32 values, one at a time."""
    for name, shape in expected_tensors(cfg).items():
        yield name, tensor_values(name, shape, seed)


def _encode_source(x: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype == "bf16":
        return to_bf16_bits(x)
    if dtype == "f16":
        return x.astype(np.float16)
    return x


def write_drafter(
    out_dir: Path | str,
    *,
    fused_qkv: bool = True,
    prefix: bool = False,
    dtype: DType = "bf16",
    seed: int = 0,
    layers_after_target: bool = False,
    shards: int = 1,
    config_overrides: Mapping[str, Any] | None = None,
    drop_tensors: Iterable[str] = (),
    extra_tensors: Mapping[str, np.ndarray] | None = None,
    **config: Any,
) -> Path:
    """Write a random drafter checkpoint into ``out_dir`` (created) and return ``out_dir``.

    ``config``: the keyword arguments of :func:`drafter_config_dict` (shapes, ``gating``,
    ``layer_type``, ``name_or_path``, ...); its defaults make a tiny drafter.

    Variants: ``gating`` and ``layer_type`` (see :func:`drafter_config_dict`) change the key set
    (no ``g_proj`` when gating is disabled, ``n_heads * head_dim`` rows of it per element); RoPE
    variants (``rope_parameters``, ``swa_rope_parameters``, ``partial_rotary_factor``) change no
    tensor and go in ``config_overrides``.

    Layout options: ``fused_qkv`` (one ``qkv_proj`` or split ``q/k/v_proj``), ``prefix``
    (keys under ``model.``), ``layers_after_target`` (layers numbered from
    ``num_target_layers``, as some checkpoints do), ``shards`` (> 1 writes a sharded index).

    For tests that break the contract: ``config_overrides`` is applied to the written
    ``config.json`` only (the weights follow the arguments); ``drop_tensors`` removes and
    ``extra_tensors`` adds tensors, by their key as written (float32 arrays, stored as ``dtype``).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = drafter_config_dict(**config)
    cfg = parse_config(raw, out_dir / "config.json")
    written = apply_overrides(raw, config_overrides)
    (out_dir / "config.json").write_text(json.dumps(written, indent=2) + "\n", encoding="utf-8")

    # (key as written, canonical name, row range of the canonical tensor)
    entries: list[tuple[str, str, tuple[int, int], tuple[int, ...]]] = []
    q, kv = cfg.q_rows, cfg.kv_rows
    for name, shape in expected_tensors(cfg).items():
        key = name
        if layers_after_target and name.startswith("layers."):
            n, rest = name[len("layers."):].split(".", 1)
            key = f"layers.{int(n) + cfg.num_target_layers}.{rest}"
        if prefix:
            key = "model." + key
        if not fused_qkv and name.endswith("self_attn.qkv_proj.weight"):
            base = key[: -len("qkv_proj.weight")]
            for part, rows in (("q_proj", (0, q)), ("k_proj", (q, q + kv)), ("v_proj", (q + kv, q + 2 * kv))):
                entries.append((f"{base}{part}.weight", name, rows, (rows[1] - rows[0], *shape[1:])))
        else:
            entries.append((key, name, (0, shape[0]), shape))
    dropped = set(drop_tensors)
    entries = [e for e in entries if e[0] not in dropped]
    extras = dict(extra_tensors or {})

    st = _ST_DTYPE[dtype]
    plan = [PlannedTensor(key, st, shape) for key, _, _, shape in entries]
    plan += [PlannedTensor(key, st, tuple(a.shape)) for key, a in extras.items()]
    shapes = expected_tensors(cfg)

    def data_for(items: list[PlannedTensor]) -> Iterator[np.ndarray]:
        by_key = {e[0]: e for e in entries}
        cache: tuple[str, np.ndarray] | None = None
        for t in items:
            if t.name in extras:
                yield _encode_source(np.asarray(extras[t.name], dtype=np.float32), dtype)
                continue
            _, canonical, (lo, hi), _ = by_key[t.name]
            if cache is None or cache[0] != canonical:  # q/k/v parts share one generated tensor
                cache = (canonical, tensor_values(canonical, shapes[canonical], seed))
            yield _encode_source(cache[1][lo:hi], dtype)

    for f in list(out_dir.glob("model*.safetensors")) + [out_dir / "model.safetensors.index.json"]:
        f.unlink(missing_ok=True)
    meta = {"format": "pt"}
    if shards <= 1:
        write_streaming(out_dir / "model.safetensors", plan, data_for(plan), metadata=meta)
        return out_dir
    groups = [plan[i::shards] for i in range(shards)]
    weight_map: dict[str, str] = {}
    for i, group in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write_streaming(out_dir / fname, group, data_for(group), metadata=meta)
        weight_map.update({t.name: fname for t in group})
    index = {"metadata": {"total_size": sum(t.nbytes for t in plan)}, "weight_map": dict(sorted(weight_map.items()))}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return out_dir


# --------------------------------------------------------------------------- a stand-in target


#: Laguna's special tokens at their real ids (MASK is 12, EOS 2, </assistant> 13).
SPECIAL_TOKENS = (
    "〈|PAD|〉", "〈|UNK|〉", "〈|EOS|〉", "〈|SYSTEM|〉", "〈|USER|〉", "〈|ASSISTANT|〉",
    "<system>", "</system>", "<user>", "</user>", "<assistant>", "〈|TOOL|〉",
    "〈|MASK|〉", "</assistant>", "<think>", "</think>",
)


def write_target_gguf(
    path: Path | str,
    *,
    n_layer: int = 4,
    hidden: int = 64,
    vocab_size: int = 256,
    arch: str = "laguna",
    name: str | None = "Tiny Laguna Target",
) -> Path:
    """A metadata-only target GGUF: architecture sizes and a GPT-2-style tokenizer, no tensors.

    Enough for the converter (layer count, hidden size, vocabulary, tokenizer keys); it is not a
    model llama.cpp can run.
    """
    from gguf import GGUFValueType, GGUFWriter, Keys, TokenType

    path = Path(path)
    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"vocab_size must be at least {len(SPECIAL_TOKENS) + 1}")
    w = GGUFWriter(path, arch)
    if name:
        w.add_name(name)
    w.add_uint32(K.for_arch(arch, K.BLOCK_COUNT), n_layer)
    w.add_uint32(K.for_arch(arch, K.EMBEDDING_LENGTH), hidden)
    w.add_uint32(K.for_arch(arch, K.VOCAB_SIZE), vocab_size)
    tokens = list(SPECIAL_TOKENS) + [f"t{i:x}" for i in range(len(SPECIAL_TOKENS), vocab_size)]
    n_special = len(SPECIAL_TOKENS)
    types = [int(TokenType.CONTROL)] * n_special + [int(TokenType.NORMAL)] * (vocab_size - n_special)
    merges = [f"t {i:x}" for i in range(len(SPECIAL_TOKENS), vocab_size)]
    w.add_key_value(Keys.Tokenizer.MODEL, "gpt2", GGUFValueType.STRING)
    w.add_key_value(Keys.Tokenizer.PRE, "laguna", GGUFValueType.STRING)
    w.add_key_value(K.TOKENS, tokens, GGUFValueType.ARRAY, GGUFValueType.STRING)
    w.add_key_value(K.TOKEN_TYPES, types, GGUFValueType.ARRAY, GGUFValueType.INT32)
    w.add_key_value(K.MERGES, merges, GGUFValueType.ARRAY, GGUFValueType.STRING)
    w.add_key_value(Keys.Tokenizer.BOS_ID, 2, GGUFValueType.UINT32)
    w.add_key_value(Keys.Tokenizer.EOS_ID, 2, GGUFValueType.UINT32)
    w.add_key_value(Keys.Tokenizer.EOT_ID, 13, GGUFValueType.UINT32)
    w.add_key_value(Keys.Tokenizer.PAD_ID, 0, GGUFValueType.UINT32)
    w.add_key_value(Keys.Tokenizer.ADD_BOS, False, GGUFValueType.BOOL)
    w.add_key_value(K.CHAT_TEMPLATE, "{% for m in messages %}{{ m.content }}{% endfor %}",
                    GGUFValueType.STRING)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return path


def built_xs_q4_K_M(layers: int = 5) -> tuple[Path, Path] | None:
    """The cost-model harness's synthetic XS-width Q4_K_M target of ``layers`` layers (5 or 2,
    random routing) and its random drafter, where they are built
    (``python -m scripts.bench.bench_cost_model --build-only``, a few GB); None otherwise."""
    import os

    root = Path(os.environ.get("LAGUNA_DFLASH_CACHE", Path.home() / ".cache" / "laguna-dflash")) / "costmodel"
    for d in sorted(root.glob("*")):
        target, drafter = d / f"laguna-xs-shapes-L{layers}-Q4_K_M.gguf", d / "laguna-xs-dflash-random-Q8_0.gguf"
        if target.exists() and drafter.exists():
            return target, drafter
    return None
