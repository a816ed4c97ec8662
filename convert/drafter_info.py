"""Read a converted drafter GGUF back: its contract at a glance, its layout, and whether it pairs with a target.

    info = read_drafter_gguf(Path("drafter-q8_0.gguf"))
    problems = layout_problems(info)            # [] when the values are in range and the SPEC §5a layout is complete
    problems = pairing_problems(info, target)   # [] when the pair works

The header is read with :mod:`convert.gguf.header` (a truncated or corrupt file is one error
line) and its values are checked with the rules the runtime loads with (:mod:`convert.gguf.rules`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gguf import GGMLQuantizationType, GGUFValueType

from .gguf import keys as K
from .gguf import pairing as pair_rules
from .checkpoint import DrafterConfig
from .converter import ARCH
from .errors import ContractError
from .gguf.header import Header, Value, read_header
from .gguf.rules import header_problems
from .mapping import Kind, gguf_layout
from .target import TargetInfo


@dataclass
class DrafterInfo:
    """What a drafter GGUF declares (``None`` where a key is absent)."""

    path: Path
    architecture: str | None
    values: dict[str, object]  # the dflash-draft.* and general.* keys, decoded
    tensors: dict[str, tuple[tuple[int, ...], GGMLQuantizationType, int]]  # name -> (numpy shape, type, bytes)
    tokens: list[bytes] = field(default_factory=list)
    header: Header | None = None

    def get(self, key: str) -> object:
        return self.values.get(key)

    def int(self, key: str) -> int | None:
        v = self.values.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    @property
    def target_layer_ids(self) -> list[int]:
        v = self.values.get(K.TARGET_LAYER_IDS)
        return list(v) if isinstance(v, list) else []

    @property
    def n_params(self) -> int:
        total = 0
        for shape, _, _ in self.tensors.values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total

    def runtimes(self) -> list[str]:
        """The runtimes that load this file: what its config allows, less ik_llama.cpp when the
        pre-FFN norm has the old name (ik requires post_attention_norm)."""
        cfg = self.config()
        if cfg is None:
            return []
        legacy = any(K.current_tensor_name(name) != name for name in self.tensors)
        return [r for r in cfg.runtimes() if not (legacy and r == "ik_llama.cpp")]

    def config(self) -> DrafterConfig | None:
        """The drafter config the keys describe (enough to rebuild the expected layout)."""
        need = {k: self.int(k) for k in (
            K.EMBEDDING_LENGTH, K.FEED_FORWARD_LENGTH, K.BLOCK_COUNT, K.HEAD_COUNT, K.HEAD_COUNT_KV,
            K.KEY_LENGTH, K.VOCAB_SIZE, K.BLOCK_SIZE, K.MASK_TOKEN_ID)}
        ids = self.target_layer_ids
        if any(v is None for v in need.values()) or not ids:
            return None
        n = lambda k: int(need[k])  # noqa: E731
        gating = self.values.get(K.GATING, K.GATING_DEFAULT)
        rope_dims = self.int(K.ROPE_DIMENSION_COUNT)
        return DrafterConfig(
            source=self.path, hidden_size=n(K.EMBEDDING_LENGTH), intermediate_size=n(K.FEED_FORWARD_LENGTH),
            num_hidden_layers=n(K.BLOCK_COUNT), num_attention_heads=n(K.HEAD_COUNT),
            num_key_value_heads=n(K.HEAD_COUNT_KV), head_dim=n(K.KEY_LENGTH),
            rms_norm_eps=float(self.values.get(K.RMS_EPS) or 0.0),
            vocab_size=n(K.VOCAB_SIZE), rope_theta=float(self.values.get(K.ROPE_FREQ_BASE) or 0.0),
            max_position_embeddings=int(self.int(K.CONTEXT_LENGTH) or 0),
            sliding_window=self.int(K.SLIDING_WINDOW), block_size=n(K.BLOCK_SIZE),
            mask_token_id=n(K.MASK_TOKEN_ID),
            num_target_layers=self.int(K.TARGET_N_LAYER) or max(ids) + 1, target_layer_ids=tuple(ids),
            gating=gating if gating in K.GATING_MODES else K.GATING_DEFAULT,
            rotary_dims=rope_dims if rope_dims not in (None, n(K.KEY_LENGTH)) else None)


def _decode(v: Value) -> object:
    if v.type == GGUFValueType.STRING:
        return v.value.decode("utf-8", errors="replace")
    if v.is_array and v.sub_type == GGUFValueType.STRING:
        return [s.decode("utf-8", errors="replace") for s in v.value]
    return v.value


def read_drafter_gguf(path: Path) -> DrafterInfo:
    header = read_header(path)
    values = {k: _decode(v) for k, v in header.fields.items() if not k.startswith("tokenizer.")}
    tensors = {t.name: (t.shape, t.qtype, t.nbytes) for t in header.tensors}
    tok = header.fields.get(K.TOKENS)
    tokens = list(tok.value) if tok is not None and tok.sub_type == GGUFValueType.STRING else []
    return DrafterInfo(Path(path), header.arch, values, tensors, tokens, header)


def layout_problems(info: DrafterInfo) -> list[ContractError]:
    """Where the file departs from the SPEC §5a layout (architecture, key values, tensor names/shapes/types)."""
    p = info.path
    if info.architecture != ARCH:
        return [ContractError(p, K.GENERAL_ARCHITECTURE, f'"{ARCH}" (a Laguna DFlash drafter)', info.architecture)]
    if info.header is not None:
        # out-of-range values first, and alone: the layout is derived from them
        out = header_problems(info.header)
        if out:
            return out
    out = []
    cfg = info.config()
    if cfg is None:
        out.append(ContractError(p, f"{ARCH}.*", "every size key of the dflash-draft layout", "some missing"))
        return out
    n_feat = info.int(K.N_TARGET_FEATURES)
    if n_feat != cfg.n_target_features:
        out.append(ContractError(p, K.N_TARGET_FEATURES,
                                 f"{cfg.n_target_features} (len(target_layer_ids) * embedding_length)", n_feat))
    gating = info.get(K.GATING)
    if gating is not None and gating not in K.GATING_MODES:
        out.append(ContractError(p, K.GATING, " or ".join(K.GATING_MODES), gating))
    sliding = cfg.sliding_window is not None
    pattern = info.get(K.SLIDING_WINDOW_PATTERN)
    if pattern is not None and pattern != [sliding] * cfg.num_hidden_layers:
        out.append(ContractError(p, K.SLIDING_WINDOW_PATTERN,
                                 f"{cfg.num_hidden_layers} x {str(sliding).lower()} "
                                 f"({'with' if sliding else 'without'} {K.SLIDING_WINDOW})", pattern))
    expected = {e.name: e for e in gguf_layout(cfg)}
    # files converted before the pre-FFN norm took ik's name still load (both names are read)
    current = {name: K.current_tensor_name(name) for name in info.tensors}
    for name in expected:
        if name not in current.values():
            out.append(ContractError(p, name, f"a tensor of shape {list(expected[name].shape)}", "nothing"))
    for name, (shape, qtype, _) in info.tensors.items():
        if current[name] != name and current[name] in info.tensors:
            out.append(ContractError(p, name, f"one pre-FFN norm per block ({current[name]})", "both names"))
            continue
        e = expected.get(current[name])
        if e is None:
            out.append(ContractError(p, name, "no such tensor in the dflash-draft layout", f"shape {list(shape)}"))
        elif shape != e.shape:
            out.append(ContractError(p, name, f"shape {list(e.shape)}", f"shape {list(shape)}"))
        elif e.kind is Kind.NORM and qtype != GGMLQuantizationType.F32:
            out.append(ContractError(p, name, "F32 (norms stay F32)", qtype.name))
    return out


def pairing_problems(info: DrafterInfo, target: TargetInfo) -> list[ContractError]:
    """Why the drafter cannot run with ``target`` ([] when it can): the rules of :mod:`convert.pairing`."""
    assert info.header is not None
    return pair_rules.pairing_problems(info.path, info.header, target.spec())
