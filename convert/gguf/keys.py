"""Every name of the drafter GGUF layout, spelled once (in the spirit of gguf-py's ``constants.py``).

The layout is the one ik_llama.cpp loads for arch ``dflash-draft`` with ``dflash.laguna``
(SPEC §5a). Where ik has a key or a tensor name, it is ik's, as its loader reads it:

* keys: ``src/llama-arch.cpp`` (``LLM_KV_DFLASH_*``, the generic ``LLM_KV_*``) and the
  ``LLM_ARCH_DFLASH_DRAFT`` case of ``src/llama-hparams.cpp``;
* tensors: the ``LLM_ARCH_DFLASH_DRAFT`` table of ``src/llama-model.cpp`` and
  ``create_dflash_tensors`` in ``src/llama-load-tensors.cpp`` (the pre-FFN norm is
  ``post_attention_norm``, which ik requires).

What ik has no key for is ours, under ``dflash-draft.dflash.*``: the gating mode, and the
target's name and layer count (provenance, checked by ``inspect`` and the runtime).
"""

from __future__ import annotations

from gguf import Keys

ARCH = "dflash-draft"
#: The generic DFlash arch of mainline llama.cpp that Poolside's own drafter GGUFs use (SPEC §5b).
POOLSIDE_ARCH = "dflash"
#: Every arch a drafter file may declare.
DRAFTER_ARCHS = (ARCH, POOLSIDE_ARCH)


def _arch(suffix: str) -> str:
    return f"{ARCH}.{suffix}"


def suffix(key: str) -> str:
    """The arch-relative part of a drafter key (``dflash-draft.block_count`` -> ``block_count``)."""
    return key.removeprefix(ARCH + ".")


def for_arch(arch: str, key: str) -> str:
    """A drafter key as another architecture spells it (``for_arch("laguna", BLOCK_COUNT)``)."""
    return f"{arch}.{suffix(key)}"


# --------------------------------------------------------------------------- general.*

# gguf-py's where it has them
GENERAL_ARCHITECTURE = Keys.General.ARCHITECTURE
GENERAL_ALIGNMENT = Keys.General.ALIGNMENT
TOKENS = Keys.Tokenizer.LIST
TOKEN_SCORES = Keys.Tokenizer.SCORES
TOKEN_TYPES = Keys.Tokenizer.TOKEN_TYPE
MERGES = Keys.Tokenizer.MERGES
CHAT_TEMPLATE = Keys.Tokenizer.CHAT_TEMPLATE
TOKENIZER_MODEL = Keys.Tokenizer.MODEL
GENERAL_TYPE = "general.type"
GENERAL_NAME = "general.name"
GENERAL_BASENAME = "general.basename"
GENERAL_FILE_TYPE = "general.file_type"
GENERAL_QUANTIZATION_VERSION = "general.quantization_version"
GENERAL_SOURCE_REPO = "general.source.huggingface.repository"

# --------------------------------------------------------------------------- the model's sizes (ik: LLM_KV_*)

VOCAB_SIZE = _arch("vocab_size")
CONTEXT_LENGTH = _arch("context_length")
EMBEDDING_LENGTH = _arch("embedding_length")
FEED_FORWARD_LENGTH = _arch("feed_forward_length")
BLOCK_COUNT = _arch("block_count")
HEAD_COUNT = _arch("attention.head_count")
HEAD_COUNT_KV = _arch("attention.head_count_kv")
KEY_LENGTH = _arch("attention.key_length")
VALUE_LENGTH = _arch("attention.value_length")
RMS_EPS = _arch("attention.layer_norm_rms_epsilon")
CAUSAL = _arch("attention.causal")
#: Present only for sliding-window drafters; absent means full attention (as ik reads it).
SLIDING_WINDOW = _arch("attention.sliding_window")
#: One bool per layer: all true (sliding) or all false (full attention), never mixed.
SLIDING_WINDOW_PATTERN = _arch("attention.sliding_window_pattern")
ROPE_FREQ_BASE = _arch("rope.freq_base")
#: Dims of each head that RoPE rotates (NeoX pairing within them): ``partial_rotary_factor * head_dim``.
ROPE_DIMENSION_COUNT = _arch("rope.dimension_count")

# --------------------------------------------------------------------------- DFlash (ik: LLM_KV_DFLASH_*)

DFLASH_LAGUNA = _arch("dflash.laguna")
BLOCK_SIZE = _arch("dflash.block_size")
MASK_TOKEN_ID = _arch("dflash.mask_token_id")
#: HF numbering (the stream after layer t), not llama.cpp's t + 1.
TARGET_LAYER_IDS = _arch("dflash.target_layer_ids")
N_TARGET_FEATURES = _arch("dflash.n_target_features")

# --------------------------------------------------------------------------- ours (ik has none)

#: One of :data:`GATING_MODES`; absent in files written before it existed, which are all per-head.
GATING = _arch("dflash.gating")
TARGET_NAME = _arch("dflash.target_name")
TARGET_N_LAYER = _arch("dflash.target_n_layer")

GATING_PER_HEAD = "per-head"
GATING_PER_ELEMENT = "per-element"
GATING_DISABLED = "disabled"
GATING_MODES = (GATING_PER_HEAD, GATING_PER_ELEMENT, GATING_DISABLED)
GATING_DEFAULT = GATING_PER_HEAD

# --------------------------------------------------------------------------- tensors (ik: LLM_TENSOR_*)

FC = "dflash_fc.weight"
HIDDEN_NORM = "dflash_hidden_norm.weight"
AUX_HIDDEN_NORM = "dflash_aux_hidden_norm.{i}.weight"  # i: index into target_layer_ids
OUTPUT_NORM = "output_norm.weight"

BLOCK_PREFIX = "blk.{n}."
ATTN_NORM = "attn_norm.weight"
ATTN_Q = "attn_q.weight"
ATTN_K = "attn_k.weight"
ATTN_V = "attn_v.weight"
ATTN_Q_NORM = "attn_q_norm.weight"
ATTN_K_NORM = "attn_k_norm.weight"
ATTN_GATE = "attn_gate.weight"
ATTN_OUTPUT = "attn_output.weight"
#: The pre-FFN norm (HF ``post_attention_layernorm``), as ik names and requires it.
POST_ATTENTION_NORM = "post_attention_norm.weight"
#: What files converted before ik compatibility call the pre-FFN norm; read, never written.
LEGACY_FFN_NORM = "ffn_norm.weight"
FFN_GATE = "ffn_gate.weight"
FFN_UP = "ffn_up.weight"
FFN_DOWN = "ffn_down.weight"

#: Per-block names as older files spell them -> as this layout spells them.
LEGACY_BLOCK_NAMES = {LEGACY_FFN_NORM: POST_ATTENTION_NORM}


def block_tensor(n: int, suffix: str) -> str:
    """``blk.{n}.{suffix}``."""
    return BLOCK_PREFIX.format(n=n) + suffix


def current_tensor_name(name: str) -> str:
    """A tensor name as this layout spells it (a legacy per-block name is translated)."""
    if name.startswith("blk."):
        head, _, suffix = name.partition(".")[2].partition(".")
        if suffix in LEGACY_BLOCK_NAMES and head.isdigit():
            return block_tensor(int(head), LEGACY_BLOCK_NAMES[suffix])
    return name
