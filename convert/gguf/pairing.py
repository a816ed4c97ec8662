"""Whether a drafter GGUF can run with a target: the one set of pair rules.

``laguna-gguf inspect --target`` lists every problem; the runtime (``Engine``, ``Drafter``)
raises the first before llama.cpp sees either file. Both read the drafter's header (range-checked
by :mod:`convert.gguf.rules` first) and the target's :class:`~convert.gguf.specs.TargetSpec`. The checkpoint-side
rules, on ``config.json`` before a conversion, are :func:`convert.checkpoint.check_pair`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gguf import GGUFValueType

from . import keys as K
from .errors import ContractError
from .header import Header



def header_tokens(header: Header) -> Sequence[bytes]:
    """The token list of a GGUF header (empty when it has none)."""
    f = header.fields.get(K.TOKENS)
    if f is None or not f.is_array or f.sub_type != GGUFValueType.STRING:
        return []
    return f.value


def _int(header: Header, key: str) -> int | None:
    v = header.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def pairing_problems(path: Path, drafter: Header, target: "TargetSpec") -> list[ContractError]:  # noqa: F821
    """Why the drafter in ``path`` (its header ``drafter``) cannot run with ``target`` ([] when it can)."""
    who = f"target {target.name}"
    out: list[ContractError] = []
    ids = drafter.get(K.TARGET_LAYER_IDS)
    ids = list(ids) if isinstance(ids, list) else []
    recorded = _int(drafter, K.TARGET_N_LAYER)
    if recorded is not None and recorded != target.n_layer:
        out.append(ContractError(path, K.TARGET_N_LAYER, f"{target.n_layer} (layers of {who})", recorded))
    if ids and max(ids) >= target.n_layer:
        out.append(ContractError(path, K.TARGET_LAYER_IDS, f"ids below {target.n_layer} (layers of {who})", ids))
    hidden = _int(drafter, K.EMBEDDING_LENGTH)
    if hidden != target.n_embd:
        out.append(ContractError(path, K.EMBEDDING_LENGTH, f"{target.n_embd} (hidden size of {who})", hidden))
    n_feat = _int(drafter, K.N_TARGET_FEATURES)
    if ids and n_feat != len(ids) * target.n_embd:
        out.append(ContractError(path, K.N_TARGET_FEATURES,
                                 f"{len(ids) * target.n_embd} ({len(ids)} x hidden size of {who})", n_feat))
    tokens = header_tokens(drafter)
    if len(tokens) != len(target.tokens):
        out.append(ContractError(path, K.TOKENS, f"{len(target.tokens)} tokens (vocabulary of {who})",
                                 f"{len(tokens)} tokens"))
    elif list(tokens) != list(target.tokens):  # compared in C; the loop only finds where they part
        i = next(i for i, (x, y) in enumerate(zip(tokens, target.tokens)) if x != y)
        out.append(ContractError(path, f"{K.TOKENS}[{i}]", f"{target.tokens[i]!r} (as in {who})", repr(tokens[i])))
    mask = _int(drafter, K.MASK_TOKEN_ID)
    if mask is not None and not 0 <= mask < len(target.tokens):
        out.append(ContractError(path, K.MASK_TOKEN_ID, f"a token id below {len(target.tokens)} ({who})", mask))
    return out
