"""Copying built in: a target that starts with a working induction circuit.

Every agent task copies: a name from the request into a tool's arguments, a file and line from a
tool result into the answer. Transformers learn that through an *induction circuit* (a head that
writes each position's previous token into the residual stream, and a later head that attends
from a token to the position after its earlier occurrence and copies what it finds there), but
on 2 CPU cores it never formed: copy curricula and synthetic repeat tasks stayed flat for
thousands of steps (docs/agent.md). So the stage-1 target starts with the circuit written into
its weights, and training starts from a model that can already copy.

The residual stream (``hidden_size`` 128) is laid out at the start as

* ``CONTENT`` (dims 0-59): the token's embedding, random;
* ``PREVIOUS`` (dims 60-119): written by the previous-token heads of ``PREV_LAYER``;
* ``CONSTANT`` (dim 120): the same value for every token: what the previous-token heads' queries
  and keys read, so that their scores depend on position only.

``PREV_LAYER`` (a sliding layer, full rotary): one head per KV group whose query and key are the
constant direction rotated so that RoPE's score peaks one position back; the pairs of rotary
frequencies and their weights maximise the worst margin over the window (:func:`offset_weights`).
Group 0 copies content dims 0-29, group 1 dims 30-59, into ``PREVIOUS``.

``INDUCTION_LAYER`` (a full-attention layer, half rotary): one head per KV group whose query is a
random projection of the token's content into the 16 dims RoPE leaves unrotated and whose key is
the same projection of the previous token's content, so the score is high where the earlier
occurrence's previous token is this token, at any distance; its value is the content there,
written back into ``CONTENT`` (scaled past the current token's own). The LM head reads
``CONTENT``. Every other layer starts as the identity (output projections at zero), as new layers
do in :func:`demo_pair.grow_depth`, and all of it is trained from there.
"""

from __future__ import annotations

import numpy as np

CONTENT = slice(0, 60)
PREVIOUS = slice(60, 120)
CONSTANT = 120
PREV_LAYER = 1
INDUCTION_LAYER = 4
#: per-layer gain on the normalised queries and keys (score scale = gain**2 * sqrt(head_dim))
PREV_GAIN = 3.0
INDUCTION_GAIN = 3.0
#: how much the copied content outweighs the current token's own in the LM head's input
COPY_WEIGHT = 2.0
LOGIT_SCALE = 0.15


def offset_weights(theta: np.ndarray, window: int, iters: int = 20000) -> np.ndarray:
    """Weights over RoPE frequency pairs (summing to one) whose score ``sum w cos(theta (d - 1))``
    beats every other offset ``d`` in ``[0, window]`` by the largest worst-case margin
    (multiplicative weights on the max-min problem)."""
    offsets = np.array([d for d in range(window + 1) if d != 1])
    loss = 1 - np.cos(np.outer(offsets - 1, theta))
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


def install(model, seed: int = 0) -> None:
    """Write the circuit into a freshly made stage-1 target (in place)."""
    import torch

    cfg = model.config
    hd, d = cfg.head_dim, cfg.hidden_size
    n_kv = cfg.num_key_value_heads
    assert cfg.layer_types[PREV_LAYER] == "sliding_attention" and cfg.layer_types[INDUCTION_LAYER] == "full_attention"
    assert n_kv == 2 and hd == 32 and d >= CONSTANT + 1
    n_content = CONTENT.stop - CONTENT.start
    half = n_content // 2
    g = torch.Generator().manual_seed(seed)
    layers = model.model.layers
    with torch.no_grad():
        emb = torch.zeros(cfg.vocab_size, d)
        emb[:, CONTENT] = torch.randn(cfg.vocab_size, n_content, generator=g)
        emb[:, CONSTANT] = 1.0
        model.model.embed_tokens.weight.copy_(emb)
        for layer in layers:
            _zero_outputs(layer)
            layer.input_layernorm.weight.fill_(1.0)
            layer.post_attention_layernorm.weight.fill_(1.0)
        model.model.norm.weight.fill_(1.0)
        head = torch.zeros(cfg.vocab_size, d)
        head[:, CONTENT] = emb[:, CONTENT] * LOGIT_SCALE
        model.lm_head.weight.copy_(head)

        # previous-token heads
        attn, per_group, base, rot = _blank_heads(cfg, layers[PREV_LAYER], "sliding_attention")
        theta = base ** (-np.arange(0, rot, 2) / rot)
        w = offset_weights(theta, cfg.sliding_window)
        gate = float(torch.nn.functional.softplus(torch.zeros(())))
        for grp in range(n_kv):
            qh = grp * per_group
            for f, wf in enumerate(w):
                if wf < 1e-4:
                    continue
                a = float(np.sqrt(wf))
                # RoPE pairs dim f with f + rot/2; a query rotated back by theta_f scores highest
                # against the key one position earlier
                attn.q_proj.weight[qh * hd + f, CONSTANT] = a * np.cos(theta[f])
                attn.q_proj.weight[qh * hd + f + rot // 2, CONSTANT] = -a * np.sin(theta[f])
                attn.k_proj.weight[grp * hd + f, CONSTANT] = a
            src = range(CONTENT.start + grp * half, CONTENT.start + (grp + 1) * half)
            for i, c in enumerate(src):
                attn.v_proj.weight[grp * hd + i, c] = 1.0
                attn.o_proj.weight[PREVIOUS.start + grp * half + i, qh * hd + i] = 1.0 / gate
        attn.q_norm.weight.fill_(PREV_GAIN)
        attn.k_norm.weight.fill_(PREV_GAIN)

        # induction heads
        attn, per_group, _, rot = _blank_heads(cfg, layers[INDUCTION_LAYER], "full_attention")
        unrotated = range(rot, hd)
        for grp in range(n_kv):
            qh = grp * per_group
            proj = torch.randn(len(unrotated), n_content, generator=g) / n_content ** 0.5
            for i, dim in enumerate(unrotated):
                attn.q_proj.weight[qh * hd + dim, CONTENT] = proj[i]
                attn.k_proj.weight[grp * hd + dim, PREVIOUS] = proj[i]
            dst = range(CONTENT.start + grp * half, CONTENT.start + (grp + 1) * half)
            for i, c in enumerate(dst):
                attn.v_proj.weight[grp * hd + i, c] = 1.0
                attn.o_proj.weight[c, qh * hd + i] = COPY_WEIGHT / gate
        attn.q_norm.weight.fill_(INDUCTION_GAIN)
        attn.k_norm.weight.fill_(INDUCTION_GAIN)
