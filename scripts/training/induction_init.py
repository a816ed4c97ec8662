"""Copying built in: a target that starts with a working induction circuit.

Every agent task copies: a name from the request into a tool's arguments, a file and line from a
tool result into the answer. Transformers learn that through an *induction circuit* (a head that
writes each position's previous token into the residual stream, and a later head that attends
from a token to the position after its earlier occurrence and copies what it finds there), but
on 2 CPU cores it never formed: copy curricula and synthetic repeat tasks stayed flat for
thousands of steps (docs/results/agent-pair/README.md). So the stage-1 target starts with the circuit written into
its weights, and training starts from a model that can already copy.

The circuit matches the last ``match`` tokens of context (1 or 2). One token is ambiguous where
the token recurs (``769129`` is ``76 9 12 9``: after the first ``9`` both ``12`` and the end
follow a ``9``); two tokens tell the occurrences apart. The residual stream (``hidden_size``
128) is laid out at the start as (:func:`layout`)

* ``content``: the token's embedding, random;
* ``previous``: one block per token back (1 up to ``match``), written by the previous-token heads
  of ``PREV_LAYER``;
* ``constant``: the same value for every token: what the previous-token heads' queries and keys
  read, so that their scores depend on position only.

``PREV_LAYER`` (a sliding layer, full rotary): per KV group, query head ``k - 1`` has its query and
key on the constant direction, the query rotated so that RoPE's score peaks ``k`` positions back;
the pairs of rotary frequencies and their weights maximise the worst margin over the window
(:func:`offset_weights`). Group 0 moves the first half of the content dims, group 1 the second.

``INDUCTION_LAYER`` (a full-attention layer, half rotary): one head per KV group whose query is a
random projection of this token's content (and, matching two, of the previous token) into the 16
dims RoPE leaves unrotated, and whose key is the same projection of the token one back (and two
back), so the score is high where an earlier position followed the same tokens, at any distance;
its value is the content there, written back into ``content`` (scaled past the current token's
own). The LM head reads ``content``. Every other layer starts as the identity (output projections
at zero), as new layers do in :func:`demo_pair.grow_depth`, and all of it is trained from there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PREV_LAYER = 1
INDUCTION_LAYER = 4
#: per-layer gain on the normalised queries and keys (score scale = gain**2 * sqrt(head_dim))
PREV_GAIN = 3.0
INDUCTION_GAIN = 3.0
#: how much the copied content outweighs the current token's own in the LM head's input
COPY_WEIGHT = 2.0
LOGIT_SCALE = 0.15
#: matching two tokens, the token before this one weighs this much in the induction query: an
#: earlier position that follows both wins, one that follows only this token still beats one
#: that follows only the token before
EARLIER_WEIGHT = 0.5
MATCHES = (1, 2)


@dataclass(frozen=True)
class Layout:
    """Where the circuit keeps what in the residual stream."""

    content: slice
    previous: tuple[slice, ...]  # previous[k - 1]: the token k back
    constant: int


def layout(match: int) -> Layout:
    """Content and each previous token get equal even-sized blocks; the constant follows.

    One token keeps the first layout (content 0-59, previous 60-119, constant 120), so the targets
    trained from it are reproduced bit for bit."""
    width = 60 if match == 1 else 42
    blocks = [slice(i * width, (i + 1) * width) for i in range(match + 1)]
    return Layout(blocks[0], tuple(blocks[1:]), (match + 1) * width)


def offset_weights(theta: np.ndarray, window: int, offset: int = 1, iters: int = 20000) -> np.ndarray:
    """Weights over RoPE frequency pairs (summing to one) whose score ``sum w cos(theta (d - offset))``
    beats every other distance ``d`` in ``[0, window]`` by the largest worst-case margin
    (multiplicative weights on the max-min problem)."""
    others = np.array([d for d in range(window + 1) if d != offset])
    loss = 1 - np.cos(np.outer(others - offset, theta))
    w = np.zeros(len(theta))
    w[:8] = 1 / 8
    for _ in range(iters):
        w *= np.exp(0.05 * loss[(loss @ w).argmin()])
        w /= w.sum()
    return w


def _zero_outputs(layer) -> None:
    attn, mlp = layer.self_attn, layer.mlp
    attn.o_proj.weight.zero_()
    if hasattr(mlp, "experts"):
        mlp.experts.down_proj.zero_()
        mlp.shared_experts.down_proj.weight.zero_()
    else:
        mlp.down_proj.weight.zero_()


def _blank_heads(cfg, layer, layer_type: str):
    """A layer's attention with its query, key, value and gate projections at zero, the query
    heads per KV group, and its RoPE (base and rotated dims per head)."""
    attn = layer.self_attn
    for t in (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, attn.g_proj.weight):
        t.zero_()
    per_group = cfg.num_attention_heads_per_layer[layer.self_attn.layer_idx] // cfg.num_key_value_heads
    rope = cfg.rope_parameters[layer_type]
    return attn, per_group, rope["rope_theta"], int(cfg.head_dim * rope.get("partial_rotary_factor", 1.0))


def install(model, seed: int = 0, match: int = 1) -> None:
    """Write the circuit, matching the last ``match`` tokens, into a freshly made stage-1 target
    (in place)."""
    import torch

    if match not in MATCHES:
        raise ValueError(f"match: expected one of {MATCHES}, found {match}")
    cfg = model.config
    hd, d = cfg.head_dim, cfg.hidden_size
    n_kv = cfg.num_key_value_heads
    lay = layout(match)
    assert cfg.layer_types[PREV_LAYER] == "sliding_attention" and cfg.layer_types[INDUCTION_LAYER] == "full_attention"
    assert n_kv == 2 and hd == 32 and d >= lay.constant + 1
    n_content = lay.content.stop - lay.content.start
    half = n_content // 2
    g = torch.Generator().manual_seed(seed)
    layers = model.model.layers
    with torch.no_grad():
        emb = torch.zeros(cfg.vocab_size, d)
        emb[:, lay.content] = torch.randn(cfg.vocab_size, n_content, generator=g)
        emb[:, lay.constant] = 1.0
        model.model.embed_tokens.weight.copy_(emb)
        for layer in layers:
            _zero_outputs(layer)
            layer.input_layernorm.weight.fill_(1.0)
            layer.post_attention_layernorm.weight.fill_(1.0)
        model.model.norm.weight.fill_(1.0)
        head = torch.zeros(cfg.vocab_size, d)
        head[:, lay.content] = emb[:, lay.content] * LOGIT_SCALE
        model.lm_head.weight.copy_(head)

        # previous-token heads: query head k - 1 of each group looks k back
        attn, per_group, base, rot = _blank_heads(cfg, layers[PREV_LAYER], "sliding_attention")
        assert per_group >= match
        theta = base ** (-np.arange(0, rot, 2) / rot)
        gate = float(torch.nn.functional.softplus(torch.zeros(())))
        # the heads read the normalised embedding; matching two tokens, what they write is scaled
        # back to the embedding's own size so that the induction query weighs this token and the
        # one before it as EARLIER_WEIGHT says (one token keeps the first layout's weights)
        rescale = 1.0 if match == 1 else float(np.sqrt((n_content + 1) / d))
        # the keys and values are each group's, shared by its query heads: the constant direction
        # at the one-back weights, and the group's half of the content
        one_back = offset_weights(theta, cfg.sliding_window, 1)
        for grp in range(n_kv):
            for f, wf in enumerate(one_back):
                if wf >= 1e-4:
                    attn.k_proj.weight[grp * hd + f, lay.constant] = float(np.sqrt(wf))
            for i in range(half):
                attn.v_proj.weight[grp * hd + i, lay.content.start + grp * half + i] = 1.0
        for back in range(1, match + 1):
            w = one_back if back == 1 else offset_weights(theta, cfg.sliding_window, back)
            for grp in range(n_kv):
                qh = grp * per_group + back - 1
                for f, wf in enumerate(w):
                    if wf < 1e-4:
                        continue
                    a = float(np.sqrt(wf))
                    # RoPE pairs dim f with f + rot/2; a query rotated back by back * theta_f
                    # scores highest against the key that many positions earlier (two back, each
                    # frequency weighs sqrt of both weights: the test checks the installed heads)
                    attn.q_proj.weight[qh * hd + f, lay.constant] = a * np.cos(back * theta[f])
                    attn.q_proj.weight[qh * hd + f + rot // 2, lay.constant] = -a * np.sin(back * theta[f])
                for i in range(half):
                    attn.o_proj.weight[lay.previous[back - 1].start + grp * half + i, qh * hd + i] = rescale / gate
        attn.q_norm.weight.fill_(PREV_GAIN)
        attn.k_norm.weight.fill_(PREV_GAIN)

        # induction heads: this token (and the one before) against the key's one back (and two back)
        attn, per_group, _, rot = _blank_heads(cfg, layers[INDUCTION_LAYER], "full_attention")
        unrotated = range(rot, hd)
        queried = (lay.content,) + lay.previous[:-1]
        for grp in range(n_kv):
            qh = grp * per_group
            for back, (q_block, k_block) in enumerate(zip(queried, lay.previous)):
                proj = torch.randn(len(unrotated), n_content, generator=g) / n_content ** 0.5 * EARLIER_WEIGHT ** back
                for i, dim in enumerate(unrotated):
                    attn.q_proj.weight[qh * hd + dim, q_block] = proj[i]
                    attn.k_proj.weight[grp * hd + dim, k_block] = proj[i]
            dst = range(lay.content.start + grp * half, lay.content.start + (grp + 1) * half)
            for i, c in enumerate(dst):
                attn.v_proj.weight[grp * hd + i, c] = 1.0
                attn.o_proj.weight[c, qh * hd + i] = COPY_WEIGHT / gate
        attn.q_norm.weight.fill_(INDUCTION_GAIN)
        attn.k_norm.weight.fill_(INDUCTION_GAIN)
