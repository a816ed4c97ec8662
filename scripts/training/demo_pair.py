#!/usr/bin/env python3
"""Train the bundled demo pair: a small Laguna target and its Laguna DFlash drafter.

No real Laguna weights can be fetched everywhere, so the project ships a pair it trains itself,
on a corpus every machine with CPython has: the standard library's own sources.

    python -m scripts.train_demo_pair                      # writes runtime/data/laguna-tiny/
    python -m scripts.train_demo_pair --reuse-target       # retrain only the drafter

What it does, on CPU with fixed seeds (two threads by default):

1. splits the stdlib's top-level ``*.py`` files into a training set and a fixed held-out list
   (the held-out files give ``runtime/data/prompts/code.txt``, the benchmark prompts);
2. trains a byte-level BPE tokenizer (4096 tokens, Laguna-style specials, MASK at id 12);
3. trains a transformers ``LagunaForCausalLM`` with every feature of the real architecture
   (hybrid sliding/full attention, per-head softplus gate, QK norm, partial rotary on full
   layers, a dense layer then sigmoid-routed MoE with a shared expert), deep and narrow so that
   a verify pass of 5 tokens costs little more than one decode step;
4. converts it to a Q8_0 GGUF with the vendored llama.cpp's ``convert_hf_to_gguf.py``;
5. lets the trained target continue random training windows greedily and captures its
   residual streams (forward hooks: HF id ``t`` = the stream after decoder layer ``t``);
6. trains a Laguna DFlash drafter (SPEC section 2/3) on those captures to predict the target's
   own greedy continuation: context = captured rows ``0..n-1``, block ``[x_n, MASK, ...]`` at
   positions ``n..``, row ``i`` predicts ``x_{n+i}``;
7. estimates greedy acceptance at ``n_max`` 4 on the held-out prompts (torch only) and writes a
   model card and a JSON training log next to the outputs.

The result is deterministic for a given ``--seed`` and step counts on one machine.

To fit a useful amount of training into tens of CPU minutes, the target is trained in two
stages: a shallow model first (cheap steps), then grown to full depth by a function-preserving
step (the trained layers spread out, identity-initialised layers in between) and trained on.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from laguna_dflash.runtime import assets

from tests.helpers import tiny_target as tt
from tests.helpers.stdlib_corpus import HELD_OUT, held_out_files, read, stdlib_dir, training_files

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = assets.TINY_DIR
PROMPTS_FILE = assets.CODE_PROMPTS
TARGET_GGUF = "Laguna-Tiny-target-Q8_0.gguf"
DRAFTER_DIR = "Laguna-Tiny-DFlash"

VOCAB = 4096
N_LAYER = 24
HIDDEN = 128


def _layer_types(n: int) -> list[str]:
    return ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(n)]


def target_config(n_layer: int) -> dict:
    """The target's LagunaConfig fields for a given depth (layer pattern and per-layer heads follow)."""
    lt = _layer_types(n_layer)
    return {**TARGET_CONFIG, "num_hidden_layers": n_layer, "layer_types": lt,
            "num_attention_heads_per_layer": [4 if t == "full_attention" else 8 for t in lt],
            "mlp_layer_types": ["dense"] + ["sparse"] * (n_layer - 1)}


#: the target: deep and narrow (llama.cpp's per-layer cost dominates a decode step on CPU)
TARGET_CONFIG = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    intermediate_size=512,
    num_hidden_layers=N_LAYER,
    num_attention_heads=8,
    num_attention_heads_per_layer=[4 if t == "full_attention" else 8 for t in _layer_types(N_LAYER)],
    num_key_value_heads=2,
    head_dim=32,
    sliding_window=128,
    layer_types=_layer_types(N_LAYER),
    mlp_layer_types=["dense"] + ["sparse"] * (N_LAYER - 1),
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=128,
    shared_expert_intermediate_size=256,
    **tt.LAGUNA_FIXED,
    router_aux_loss_coef=0.01,
)

#: the drafter (keyword arguments of tests/helpers/synthetic.py's drafter_config_dict)
DRAFTER_KW = dict(
    hidden=HIDDEN,
    n_layers=2,
    n_heads=8,
    n_kv_heads=2,
    head_dim=32,
    intermediate=512,
    target_layer_ids=(1, 9, 17, 23),
    num_target_layers=N_LAYER,
    vocab_size=VOCAB,
    sliding_window=512,
    block_size=16,
    mask_token_id=tt.MASK_TOKEN_ID,
    rope_theta=500000.0,
)


# ------------------------------------------------------------------------------------ corpus


def make_prompts(n_lines: int = 22) -> list[str]:
    """One prompt per held-out module: ~n_lines of code starting at a def/class a third into it."""
    prompts = []
    for p in held_out_files():
        lines = read(p).splitlines()
        starts = [i for i, l in enumerate(lines) if l.startswith(("def ", "class ", "    def "))]
        if not starts:
            continue
        third = len(lines) // 3
        start = next((i for i in starts if i >= third), starts[0])
        chunk = lines[start:start + n_lines]
        while chunk and not chunk[-1].strip():
            chunk.pop()
        prompts.append("\n".join(chunk) + "\n")
    return prompts


def write_prompts(path: Path) -> int:
    prompts = make_prompts()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n---\n".join(p.rstrip("\n") for p in prompts) + "\n")
    return len(prompts)


# ------------------------------------------------------------------------------------ helpers


class Log:
    """Console output through rich, plus a JSON record written next to the outputs."""

    def __init__(self, path: Path) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False)
        self.path = path
        self.record: dict = {"events": []}
        self.t0 = time.time()

    def info(self, msg: str) -> None:
        self.console.print(f"[{time.time() - self.t0:7.1f}s] {msg}")

    def plain(self, msg: str) -> None:
        """Progress lines for a log file (a terminal shows the progress bars instead)."""
        if not self.console.is_terminal:
            self.info(msg)

    def event(self, **kw) -> None:
        kw["t"] = round(time.time() - self.t0, 1)
        self.record["events"].append(kw)

    def save(self) -> None:
        self.record["wall_seconds"] = round(time.time() - self.t0, 1)
        self.path.write_text(json.dumps(self.record, indent=2) + "\n")


def progress(log: Log):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=log.console)


def lr_at(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def capture_hooks(model, layer_ids, store: list):
    """Forward hooks storing the residual stream after each listed decoder layer."""
    hooks = []
    for t in layer_ids:
        def hook(_m, _i, out, t=t):
            store.append((t, out[0] if isinstance(out, tuple) else out))
        hooks.append(model.model.layers[t].register_forward_hook(hook))
    return hooks


# ------------------------------------------------------------------------------------ target


def grow_depth(small, n_layer: int, seed: int, config_for=None):
    """A deeper target that computes exactly what ``small`` computes.

    Old layer ``i`` moves to position ``stride * i`` (``stride = n_layer // n_small``, so layer
    types line up with the period-4 pattern); every other layer is freshly initialised with its
    output projections (attention ``o_proj``, experts' and shared expert's ``down_proj``) at zero,
    so it starts as the identity and learns from there (function-preserving growth).
    """
    import torch
    from transformers import LagunaConfig, LagunaForCausalLM

    n_small = small.config.num_hidden_layers
    stride = n_layer // n_small
    if stride * n_small != n_layer:
        raise ValueError(f"cannot grow {n_small} layers to {n_layer}")
    torch.manual_seed(seed)
    big = LagunaForCausalLM(LagunaConfig(**(config_for or target_config)(n_layer))).float()
    src = small.state_dict()
    dst = big.state_dict()
    placed = {stride * i: i for i in range(n_small)}
    assert all(big.config.layer_types[j] == small.config.layer_types[i] for j, i in placed.items())
    with torch.no_grad():
        for name, t in dst.items():
            if not name.startswith("model.layers."):
                t.copy_(src[name])
                continue
            j, rest = name[len("model.layers."):].split(".", 1)
            j = int(j)
            if j in placed:
                t.copy_(src[f"model.layers.{placed[j]}.{rest}"])
            elif rest in ("self_attn.o_proj.weight", "mlp.experts.down_proj", "mlp.shared_experts.down_proj.weight"):
                t.zero_()
    return big


def train_lm(args, log: Log, model, stream: np.ndarray, steps: int, lr: float, batch: int, seq: int,
             seed: int, phase: str, starts: np.ndarray | None = None, trained: np.ndarray | None = None):
    """Next-token training on windows of ``stream``: random ones, or ones beginning at ``starts``;
    with ``trained`` (a bool per stream token), only those tokens are predicted (the loss); with a
    float per token instead, each token's loss counts that much (0: not predicted). The logged loss
    is the plain mean over the predicted tokens either way."""
    import torch
    import torch.nn.functional as F

    weighted = trained is not None and trained.dtype != bool

    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8, fused=True)
    rng = np.random.default_rng(seed)
    warmup = max(10, steps // 20)
    coef = model.config.router_aux_loss_coef
    losses = []
    model.train()
    with progress(log) as prog:
        task = prog.add_task(phase, total=steps, info="")
        for step in range(steps):
            picked = rng.integers(0, len(stream) - seq - 1, batch) if starts is None else rng.choice(starts, batch)
            x = torch.from_numpy(np.stack([stream[s:s + seq] for s in picked]).astype(np.int64))
            labels = x
            if trained is not None and not weighted:
                keep = torch.from_numpy(np.stack([trained[s:s + seq] for s in picked]))
                labels = x.masked_fill(~keep, -100)
            for g in opt.param_groups:
                g["lr"] = lr_at(step, steps, lr, warmup)
            if weighted:
                out = model(input_ids=x, output_router_logits=True)
                w = torch.from_numpy(np.stack([trained[s + 1:s + seq] for s in picked]).astype(np.float32))
                nll = F.cross_entropy(out.logits[:, :-1].flatten(0, 1), x[:, 1:].flatten(), reduction="none").view_as(w)
                loss = (nll * w).sum() / w.sum().clamp(min=1e-6) + coef * out.aux_loss
                loss.backward()
                lm = (nll.detach() * (w > 0)).sum().item() / max(1, int((w > 0).sum()))
            else:
                out = model(input_ids=x, labels=labels, output_router_logits=True)
                out.loss.backward()
                lm = out.loss.item() - coef * out.aux_loss.item()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(lm)
            prog.update(task, advance=1, info=f"loss {lm:.3f} (avg20 {np.mean(losses[-20:]):.3f})")
            if step % 20 == 0 or step == steps - 1:
                log.event(phase=phase, step=step, loss=round(lm, 4))
                log.plain(f"{phase} step {step + 1}/{steps}: loss {lm:.3f} (avg20 {np.mean(losses[-20:]):.3f})")
    model.eval()
    return losses


def train_target(args, log: Log, stream: np.ndarray, heldout_stream: np.ndarray, hf_dir: Path):
    """Train a shallow target, grow it to full depth (function-preserving), train on."""
    import torch
    from transformers import LagunaConfig, LagunaForCausalLM

    torch.manual_seed(args.seed)
    small = LagunaForCausalLM(LagunaConfig(**target_config(args.stage1_layers))).float()
    log.info(f"target stage 1: {args.stage1_layers} layers, {sum(p.numel() for p in small.parameters()) / 1e6:.2f}M parameters")
    l1 = train_lm(args, log, small, stream, args.stage1_steps, args.lr, args.batch, args.seq, args.seed, "target stage 1")
    h1 = eval_loss(small, heldout_stream, args.seq)
    log.info(f"target stage 1: loss (avg of last 20) {np.mean(l1[-20:]):.3f}, held-out {h1:.3f}")
    model = grow_depth(small, N_LAYER, args.seed + 10)
    h_grown = eval_loss(model, heldout_stream, args.seq)
    n_params = sum(p.numel() for p in model.parameters())
    log.info(f"target grown to {N_LAYER} layers ({n_params / 1e6:.2f}M parameters): held-out {h_grown:.3f}")
    l2 = train_lm(args, log, model, stream, args.stage2_steps, args.lr2, args.batch, args.seq, args.seed + 1,
                  "target stage 2")
    heldout = eval_loss(model, heldout_stream, args.seq)
    counts = np.bincount(stream, minlength=VOCAB).astype(np.float64)
    pr = counts[counts > 0] / counts.sum()
    unigram = float(-(pr * np.log(pr)).sum())  # the loss of a model that ignores context
    final = float(np.mean(l2[-20:]))
    log.info(f"target: final train loss (avg of last 20) {final:.3f}, held-out loss {heldout:.3f}, "
             f"unigram entropy {unigram:.3f} nats")
    tokens = (args.stage1_steps + args.stage2_steps) * args.batch * args.seq
    log.record["target"] = {
        "parameters": n_params, "stage1_layers": args.stage1_layers, "stage1_steps": args.stage1_steps,
        "stage2_steps": args.stage2_steps, "steps": args.stage1_steps + args.stage2_steps,
        "batch": args.batch, "seq": args.seq, "tokens": tokens,
        "stage1_final_loss_avg20": round(float(np.mean(l1[-20:])), 4), "stage1_heldout_loss": round(h1, 4),
        "grown_heldout_loss": round(h_grown, 4),
        "final_train_loss_avg20": round(final, 4), "heldout_loss": round(heldout, 4), "unigram_entropy": round(unigram, 4),
    }
    model.save_pretrained(hf_dir, safe_serialization=True)
    return model


def publish_target(log: Log, hf_dir: Path, out: Path, gguf_name: str) -> None:
    """The trained target as shipped: its Q8_0 GGUF and its tokenizer files (those it has)."""
    log.info("converting the target to GGUF (Q8_0)")
    tt.convert_to_gguf(hf_dir, out / gguf_name, "q8_0")
    tdir = out / "tokenizer"
    tdir.mkdir(exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (hf_dir / f).exists():
            shutil.copy2(hf_dir / f, tdir / f)


def eval_loss(model, stream: np.ndarray, T: int, n: int = 8) -> float:
    import torch

    starts = np.linspace(0, len(stream) - T - 1, n).astype(int)
    x = torch.from_numpy(np.stack([stream[s:s + T] for s in starts]).astype(np.int64))
    with torch.no_grad():
        return float(model(input_ids=x, labels=x).loss)


# ------------------------------------------------------------------------------------ captures


def greedy_continue(model, prompts, n_new: int):
    """Greedy continuation of equal-length prompts [B, P] -> [B, P + n_new] (KV cache)."""
    import torch
    from transformers import DynamicCache

    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        out = model(input_ids=prompts, cache=cache, use_cache=True, logits_to_keep=1)
        seq = [prompts, out.logits[:, -1].argmax(-1, keepdim=True)]
        for _ in range(n_new - 1):
            out = model(input_ids=seq[-1], cache=cache, use_cache=True)
            seq.append(out.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat(seq, dim=1)


def capture(model, seqs, layer_ids):
    """Residual streams after the given layers for full sequences: [B, S, n_ids*H] float32."""
    import torch

    store: list = []
    hooks = capture_hooks(model, layer_ids, store)
    try:
        with torch.no_grad():
            model(input_ids=seqs, use_cache=False, logits_to_keep=1)
    finally:
        for h in hooks:
            h.remove()
    by_id = dict(store)
    return torch.cat([by_id[t].float() for t in layer_ids], dim=-1)


def continue_batches(args, log: Log, model, layer_ids, lengths: list[int], batch_prompts, what: str):
    """``args.drafter_seqs // args.gen_batch`` batches of prompts continued greedily by the target
    for ``args.gen`` tokens, with their captured states; batch ``b``'s prompts are
    ``batch_prompts(P)``, ``args.gen_batch`` rows of ``P = lengths[b % len(lengths)]`` tokens
    (rows of one length, so a batch stacks)."""
    import torch

    n_batches = args.drafter_seqs // args.gen_batch
    seqs, feats, plens = [], [], []
    with progress(log) as prog:
        task = prog.add_task(what, total=n_batches, info="")
        for b in range(n_batches):
            P = lengths[b % len(lengths)]
            full = greedy_continue(model, batch_prompts(P), args.gen)
            h = capture(model, full, layer_ids)
            for i in range(full.shape[0]):
                seqs.append(full[i].numpy().astype(np.int32))
                feats.append(h[i].to(torch.bfloat16))
                plens.append(P)
            prog.update(task, advance=1, info=f"prompt {P} + {args.gen}")
            log.plain(f"generated batch {b + 1}/{n_batches} (prompt {P} + {args.gen})")
    return seqs, feats, plens


def build_drafter_data(args, log: Log, model, stream: np.ndarray, layer_ids):
    """Random training windows continued greedily by the target, with their captured states."""
    import torch

    rng = np.random.default_rng(args.seed + 1)

    def windows(P: int):
        starts = rng.integers(0, len(stream) - P - 1, args.gen_batch)
        return torch.from_numpy(np.stack([stream[s:s + P] for s in starts]).astype(np.int64))

    return continue_batches(args, log, model, layer_ids, [64, 128, 192, 256, 320], windows, "target generates")


# ------------------------------------------------------------------------------------ drafter


def drafter_block_logits(drafter, ctx_feats, anchors, blocks, embed, lm_head):
    """Logits for many draft blocks over one shared context per sequence.

    ``ctx_feats`` [S, T, n_ids*H]; ``anchors`` [S, A] (block start positions; the context rows a
    block sees are those before its anchor); ``blocks`` [S, A, L] token ids. Returns
    [S*A, L, vocab]. Same maths as ``LagunaDFlashDrafter.forward``, with each sequence's
    context K/V computed once and shared by its A blocks.
    """
    import torch
    from tests.helpers.torch_drafter import build_window_mask

    S, T, _ = ctx_feats.shape
    A, L = blocks.shape[1], blocks.shape[2]
    ctx = drafter.combine_hidden(ctx_feats)  # [S, T, H]
    ctx_pos = torch.arange(T)[None].expand(S, T)
    blk_pos = (anchors[..., None] + torch.arange(L)).reshape(S * A, L)
    key_pos = torch.cat((torch.arange(T)[None].expand(S * A, T), blk_pos), dim=1)
    valid = torch.cat((torch.arange(T)[None] < anchors.reshape(S * A, 1), torch.ones(S * A, L, dtype=torch.bool)), 1)
    x = embed[blocks.reshape(S * A, L)]
    masks = {}
    for layer in drafter.layers:
        if layer.window not in masks:
            masks[layer.window] = build_window_mask(blk_pos, key_pos, layer.window, valid)
        k_c, v_c = layer.self_attn.context_kv(layer.input_layernorm(ctx), ctx_pos)
        k_c, v_c = k_c.repeat_interleave(A, dim=0), v_c.repeat_interleave(A, dim=0)
        x = x + layer.self_attn(layer.input_layernorm(x), blk_pos, k_c, v_c, masks[layer.window])
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return torch.nn.functional.linear(drafter.norm(x), lm_head)


def train_drafter(args, log: Log, target, seqs, feats, plens, out_dir: Path,
                  name: str = "laguna-dflash/Laguna-Tiny-DFlash"):
    import torch
    from tests.helpers.synthetic import drafter_config_dict
    from tests.helpers.torch_drafter import LagunaDFlashDrafter

    cfg = drafter_config_dict(**DRAFTER_KW, name_or_path=name)
    torch.manual_seed(args.seed + 2)
    drafter = LagunaDFlashDrafter(cfg).float()
    gen = torch.Generator().manual_seed(args.seed + 2)
    drafter.reset_parameters(0.02, generator=gen)
    if args.norm_spread > 0:
        # The norms that read the target's states (aux norms, each layer's input norm, which also
        # norms the context) start at log-normal per-channel scales rather than at one, so the
        # trained weights carry real scale: a runtime that skips them fails visibly instead of
        # passing by luck (SPEC section 3).
        with torch.no_grad():
            for name, prm in drafter.named_parameters():
                if name.startswith("aux_hidden_norms.") or name.endswith("input_layernorm.weight"):
                    prm.copy_(torch.exp(args.norm_spread * torch.randn(prm.shape, generator=gen)))
    n_params = sum(p.numel() for p in drafter.parameters())
    log.info(f"drafter: {n_params / 1e6:.2f}M parameters, {DRAFTER_KW['n_layers']} layers, "
             f"target layers {list(DRAFTER_KW['target_layer_ids'])}")
    embed = target.model.embed_tokens.weight.detach().float()
    lm_head = target.lm_head.weight.detach().float()
    opt = torch.optim.AdamW(drafter.parameters(), lr=args.drafter_lr, betas=(0.9, 0.95), weight_decay=0.01,
                            fused=True)
    rng = np.random.default_rng(args.seed + 3)
    L = args.train_block
    row_w = torch.tensor([0.0] + [args.row_decay ** (i - 1) for i in range(1, L)])
    row_w = row_w / row_w.sum()
    steps, warmup = args.drafter_steps, max(10, args.drafter_steps // 20)
    S, A = args.drafter_seqs_per_step, args.anchors
    n = len(seqs)
    # group sequences by length so a step stacks equal-length sequences
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(seqs):
        by_len.setdefault(len(s), []).append(i)
    groups = sorted(by_len)
    losses, accs = [], []
    with progress(log) as prog:
        task = prog.add_task("drafter", total=steps, info="")
        for step in range(steps):
            grp = by_len[groups[rng.integers(len(groups))]]
            idx = rng.choice(grp, size=min(S, len(grp)), replace=False)
            tok = torch.from_numpy(np.stack([seqs[i] for i in idx]).astype(np.int64))  # [S, len]
            f = torch.stack([feats[i] for i in idx]).float()
            P, total = plens[idx[0]], tok.shape[1]
            # anchors in the generated part: the bonus x_n and labels x_{n+1..n+L-1} are all the target's
            anch = torch.from_numpy(np.stack([rng.integers(P, total - L + 1, A) for _ in idx]))
            anch[:, 0] = P  # the first round after the prompt
            blocks = torch.full((len(idx), A, L), tt.MASK_TOKEN_ID, dtype=torch.long)
            blocks[:, :, 0] = torch.gather(tok, 1, anch)
            lab_idx = anch[..., None] + torch.arange(L)
            labels = torch.gather(tok, 1, lab_idx.reshape(len(idx), -1)).reshape(len(idx) * A, L)
            T = int(anch.max())  # context rows needed: 0..max anchor-1
            logits = drafter_block_logits(drafter, f[:, :T], anch, blocks, embed, lm_head)
            ce = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1),
                                                   reduction="none").reshape(-1, L)
            loss = (ce * row_w).sum(1).mean()
            for g in opt.param_groups:
                g["lr"] = lr_at(step, steps, args.drafter_lr, warmup, floor=0.05)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            with torch.no_grad():
                hit = (logits.argmax(-1) == labels)[:, 1:5].float()
                prefix = hit.cumprod(1).sum(1).mean()
            losses.append(float(loss))
            accs.append(float(prefix))
            prog.update(task, advance=1, info=f"loss {float(loss):.3f} accepted@4 ~{np.mean(accs[-50:]):.2f}")
            if step % 25 == 0 or step == steps - 1:
                log.event(phase="drafter", step=step, loss=round(float(loss), 4), accepted_at4=round(float(prefix), 3))
                log.plain(f"drafter step {step + 1}/{steps}: loss {float(loss):.3f}, "
                          f"accepted@4 (train, avg50) {np.mean(accs[-50:]):.2f}")
    log.record["drafter"] = {
        "parameters": n_params, "steps": steps, "sequences": n, "seqs_per_step": S, "anchors_per_seq": A,
        "train_block": L, "row_decay": args.row_decay, "norm_spread": args.norm_spread,
        "final_loss_avg50": round(float(np.mean(losses[-50:])), 4),
        "train_accepted_at4_avg50": round(float(np.mean(accs[-50:])), 3),
    }
    drafter.eval()
    drafter.save_pretrained(out_dir, dtype="bfloat16")
    return drafter


# ------------------------------------------------------------------------------------ evaluation


def estimate_acceptance(target, drafter, tokenizer, prompts, layer_ids, n_predict: int, n_max: int = 4):
    """Greedy speculative rounds simulated in torch on the target's true states.

    Each round drafts n_max tokens from context rows 0..n-1 and bonus x_n, keeps the longest
    prefix equal to the target's greedy tokens, and adds the target's own next token.
    """
    import torch

    drafted = accepted = rounds = produced = 0
    at = np.zeros(n_max)
    per_prompt = []
    embed = target.model.embed_tokens.weight.detach().float()
    lm_head = target.lm_head.weight.detach().float()
    for text in prompts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        P = len(ids)
        full = greedy_continue(target, torch.tensor([ids]), n_predict + n_max + 1)
        seq = full[0]
        feats = capture(target, full, layer_ids)
        n = P  # position of the bonus; the target has processed 0..n-1
        end = P + n_predict
        p_acc = p_rounds = 0
        while n < end:
            block = torch.full((1, 1, n_max + 1), tt.MASK_TOKEN_ID, dtype=torch.long)
            block[0, 0, 0] = seq[n]
            with torch.no_grad():
                logits = drafter_block_logits(drafter, feats[:, :n], torch.tensor([[n]]), block, embed, lm_head)
            draft = logits[0, 1:].argmax(-1)
            truth = seq[n + 1:n + 1 + n_max]
            k = int((draft == truth).long().cumprod(0).sum())
            at[:k] += 1
            drafted += n_max
            accepted += k
            p_acc += k
            rounds += 1
            p_rounds += 1
            produced += k + 1
            n += k + 1
        per_prompt.append(round(p_acc / p_rounds, 3))
    return {
        "n_max": n_max, "n_predict": n_predict, "prompts": len(prompts), "rounds": rounds,
        "mean_accepted_per_round": round(accepted / rounds, 3),
        "tokens_per_round": round(produced / rounds, 3),
        "acceptance_rate": round(accepted / drafted, 3),
        "accepted_at_depth": [round(float(a) / rounds, 3) for a in at],
        "per_prompt_mean_accepted": per_prompt,
    }


# ------------------------------------------------------------------------------------ card


CARD = """\
# Laguna-Tiny: a trained demo target and its DFlash drafter

A small **Laguna** target and a **Laguna DFlash** drafter trained against it, so that
`laguna-run` and `laguna-run bench` have a real, agreeing pair to run on any machine. They are
*not* Poolside models and know nothing but Python: both were trained from scratch, on CPU, on the
CPython {pyver} standard library's top-level modules (`{stdlib}/*.py`), minus {n_held} held-out modules
that give the benchmark prompts in `runtime/data/prompts/code.txt`.

| file | what | size |
|---|---|---|
| `{gguf}` | target, `LagunaForCausalLM` converted by the vendored llama.cpp's `convert_hf_to_gguf.py`, Q8_0 | {gguf_mb:.1f} MB |
| `{ddir}/config.json`, `model.safetensors` | drafter, `DFlashLagunaForCausalLM` in Poolside's HF layout (fused `qkv_proj`, aux norms), bf16 | {drafter_mb:.1f} MB |
| `tokenizer/` | the target's HF tokenizer (byte-level BPE, {vocab} tokens, Laguna-style specials, MASK = 12) | {tok_mb:.1f} MB |

## Target

{target_table}

It is deliberately deep and narrow: on a CPU, llama.cpp's cost per decode step is dominated by
per-layer work that a 5-token verify pass shares, so verifying a draft costs little more than one
plain step — the regime where speculative decoding pays, as for the real models on CPUs.

Training ({n_train} modules joined with EOS, {train_tokens:,} tokens; batches of {t_batch} x {t_seq}
tokens; AdamW, cosine decay, router load-balancing loss {aux}), in two stages to fit a CPU budget:

1. a {s1_layers}-layer model (same layer pattern), {s1_steps} steps at peak lr {lr}: held-out loss {s1_heldout:.3f};
2. grown to {n_layer} layers without changing its function — trained layer `i` moves to position
   `{stride} i`, the layers in between start as the identity (output projections at zero) — then
   {s2_steps} more steps at peak lr {lr2}.

{t_tokens:,} training tokens in all (about {t_epochs:.1f} passes). Final training loss {t_loss:.3f}
nats/token, held-out loss {t_heldout:.3f}, against a unigram entropy of {unigram:.3f}.

## Drafter

{drafter_table}

Training data: the trained target continued {n_seqs} random training windows (prompts of 64-320
tokens) greedily by {gen} tokens; the residual streams after target layers {ids} were captured with
forward hooks (HF id `t` = the stream after decoder layer `t`). The drafter learns to predict the
target's *own* greedy continuation: with context rows `0..n-1`, block `[x_n, MASK x {lm1}]` at
positions `n..`, row `i` predicts `x_(n+i)` (cross-entropy on rows 1..{lm1}, weights decaying by
{decay} per row since acceptance is a prefix). Embedding and LM head are the target's, frozen.{spread_text}
{d_steps} steps, AdamW, peak lr {dlr}.

## Held-out acceptance (torch estimate)

Greedy rounds simulated in PyTorch on the target's exact states, `n_max` 4, {n_predict} tokens per
prompt, {n_prompts} held-out prompts: **{acc:.2f} drafted tokens accepted per round** ({tpr:.2f}
tokens per round with the target's own token; acceptance rate {rate:.0%}; by depth
{by_depth}). llama.cpp's Q8_0 target and drafter differ slightly from this float32 estimate.

{bench_section}## Reproduce

```bash
{command}
```

Wall time of the run that produced these files: {wall_min:.0f} minutes on {machine}
(torch {torch}, transformers {transformers}, torch threads: {threads}). The run is deterministic for a
given seed and step counts on one machine; the training log is `train_log.json`.
"""


def _table(rows: dict) -> str:
    out = ["| field | value |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in rows.items()]
    return "\n".join(out)


def _spread_text(spread: float) -> str:
    if not spread:
        return ""
    return ("\nThe aux norms and each layer's input norm (which also norms the context) start at log-normal\n"
            f"per-channel weights (sigma {spread:g}) instead of ones, so that their trained weights carry real\n"
            "scale and a runtime that skips them loses its acceptance visibly.")


def _bench_section(bench: dict | None) -> str:
    if not bench:
        return ""
    rows = ["| n_max | tokens/s | speedup | mean accepted per round | same tokens as plain |", "|---|---|---|---|---|"]
    for r in bench["rows"]:
        acc = f"{r['mean_accepted']:.2f}" if "mean_accepted" in r else "-"
        exact = {True: "yes", False: "no"}.get(r.get("exact"), "-")
        rows.append(f"| {r['n_max']} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | {acc} | {exact} |")
    return (
        "## Measured with the llama.cpp runtime\n\n"
        f"`{bench['command']}` right after training, on the training machine ({bench['placement']}; greedy, "
        f"{bench['n_predict']} tokens per prompt, default F16 KV cache):\n\n" + "\n".join(rows) + "\n\n"
        "Greedy speculative output equals plain decoding token for token with an F32 KV cache; with the default\n"
        "F16 cache a near-tie can flip late in a generation, which the last column shows.\n\n"
    )


def run_bench(out: Path, log: Log) -> dict | None:
    """``laguna-run bench`` on the new pair (needs the patched llama-cpp-python wheel)."""
    import subprocess
    import tempfile

    if out.resolve() != DEFAULT_OUT.resolve():
        log.info("bench: skipped (laguna-run's default pair is runtime/data/laguna-tiny; use --out there)")
        return None
    with tempfile.TemporaryDirectory() as tmp:
        js = Path(tmp) / "bench.json"
        code = ("import sys; from laguna_dflash.runtime.cli import main; "
                f"sys.argv = ['laguna-run', 'bench', '--n-max', '1,2,4,8', '--repeats', '2', '--json', {str(js)!r}]; "
                "sys.exit(main())")
        r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
        if r.returncode != 0 or not js.exists():
            log.info(f"bench: laguna-run failed, skipped:\n{(r.stdout + r.stderr)[-1500:]}")
            return None
        res = json.loads(js.read_text())
    res["command"] = "laguna-run bench --n-max 1,2,4,8 --repeats 2"
    for row in res["rows"]:
        extra = f", mean accepted {row['mean_accepted']:.2f}" if "mean_accepted" in row else ""
        log.info(f"bench: n_max {row['n_max']}: {row['tokens_per_s']:.1f} tokens/s, {row['speedup']:.2f}x{extra}")
    return res


def write_card(out: Path, log: Log, args, command: str) -> None:
    import torch
    import transformers

    rec = log.record
    t, d, e = rec["target"], rec["drafter"], rec["acceptance"]
    gguf = out / TARGET_GGUF
    dsz = sum(f.stat().st_size for f in (out / DRAFTER_DIR).glob("*"))
    tsz = sum(f.stat().st_size for f in (out / "tokenizer").glob("*")) if (out / "tokenizer").exists() else 0
    c = TARGET_CONFIG
    target_table = _table({
        "architecture": "`LagunaForCausalLM` (transformers)",
        "layers": f"{c['num_hidden_layers']}: `layer_types` period 4, full attention first ({c['num_hidden_layers'] // 4} full, rest sliding window {c['sliding_window']})",
        "hidden / head_dim": f"{c['hidden_size']} / {c['head_dim']}",
        "query heads": "4 on full-attention layers, 8 on sliding layers; 2 KV heads",
        "attention": "per-head softplus output gate, QK RMSNorm, RoPE: partial (0.5, theta 500000) on full layers, full (theta 10000) on sliding layers",
        "MLP": f"layer 0 dense ({c['intermediate_size']}); layers 1-{c['num_hidden_layers'] - 1} MoE: {c['num_experts']} experts of {c['moe_intermediate_size']}, top-{c['num_experts_per_tok']}, sigmoid router, shared expert {c['shared_expert_intermediate_size']}",
        "vocabulary": f"{c['vocab_size']} (byte-level BPE; EOS 2, `</assistant>` 13, MASK 12)",
        "parameters": f"{t['parameters'] / 1e6:.2f}M",
    })
    drafter_table = _table({
        "architecture": "`DFlashLagunaForCausalLM` (SPEC section 2)",
        "layers": f"{DRAFTER_KW['n_layers']}, all sliding window {DRAFTER_KW['sliding_window']}, causal block, block_size {DRAFTER_KW['block_size']}",
        "hidden / heads / kv heads / head_dim": f"{DRAFTER_KW['hidden']} / {DRAFTER_KW['n_heads']} / {DRAFTER_KW['n_kv_heads']} / {DRAFTER_KW['head_dim']}",
        "intermediate": DRAFTER_KW["intermediate"],
        "target_layer_ids": f"{list(DRAFTER_KW['target_layer_ids'])} of {DRAFTER_KW['num_target_layers']}",
        "mask_token_id": DRAFTER_KW["mask_token_id"],
        "RoPE": f"theta {DRAFTER_KW['rope_theta']:g}, all dims",
        "parameters": f"{d['parameters'] / 1e6:.2f}M (+ the target's embedding and head)",
    })
    text = CARD.format(
        pyver=platform.python_version(), stdlib=stdlib_dir().name, n_held=len(HELD_OUT), gguf=TARGET_GGUF,
        gguf_mb=gguf.stat().st_size / 1e6, ddir=DRAFTER_DIR, drafter_mb=dsz / 1e6, tok_mb=tsz / 1e6, vocab=VOCAB,
        target_table=target_table, t_batch=t["batch"], t_seq=t["seq"], t_tokens=t["tokens"],
        train_tokens=rec["corpus"]["train_tokens"], s1_layers=t["stage1_layers"], s1_steps=t["stage1_steps"],
        s1_heldout=t["stage1_heldout_loss"], n_layer=N_LAYER, stride=N_LAYER // t["stage1_layers"],
        s2_steps=t["stage2_steps"], lr2=args.lr2,
        t_epochs=t["tokens"] / rec["corpus"]["train_tokens"], n_train=rec["corpus"]["train_files"], lr=args.lr,
        aux=TARGET_CONFIG["router_aux_loss_coef"], t_loss=t["final_train_loss_avg20"], t_heldout=t["heldout_loss"],
        unigram=t["unigram_entropy"], drafter_table=drafter_table, n_seqs=d["sequences"], gen=args.gen,
        ids=list(DRAFTER_KW["target_layer_ids"]), lm1=args.train_block - 1, decay=args.row_decay,
        d_steps=d["steps"], dlr=args.drafter_lr, spread_text=_spread_text(getattr(args, "norm_spread", 0.0)), n_predict=e["n_predict"], n_prompts=e["prompts"],
        acc=e["mean_accepted_per_round"], tpr=e["tokens_per_round"], rate=e["acceptance_rate"],
        by_depth=", ".join(f"{a:.2f}" for a in e["accepted_at_depth"]), command=command,
        wall_min=rec.get("wall_seconds_total", 0) / 60, machine=rec["machine"], torch=torch.__version__,
        transformers=transformers.__version__, threads=args.threads, bench_section=_bench_section(rec.get("bench")),
    )
    (out / "README.md").write_text(text)


# ------------------------------------------------------------------------------------ main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default: %(default)s)")
    ap.add_argument("--work", type=Path, default=None,
                    help="scratch directory for the HF target and captures (default: $LAGUNA_DFLASH_CACHE/train-demo-pair, "
                         "else ~/.cache/laguna-dflash/train-demo-pair)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: on a busy 2-core machine two OpenMP threads stall each other)")
    ap.add_argument("--stage1-layers", type=int, default=8, help="depth of the first, cheaper training stage")
    ap.add_argument("--stage1-steps", type=int, default=900)
    ap.add_argument("--stage2-steps", "--steps", dest="stage2_steps", type=int, default=200,
                    help="steps after growing the target to full depth")
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--lr2", type=float, default=1.5e-3)
    ap.add_argument("--drafter-steps", type=int, default=2500)
    ap.add_argument("--drafter-lr", type=float, default=2e-3)
    ap.add_argument("--drafter-seqs", type=int, default=768, help="greedy continuations to train the drafter on")
    ap.add_argument("--gen", type=int, default=128, help="greedy tokens per continuation")
    ap.add_argument("--gen-batch", type=int, default=32)
    ap.add_argument("--drafter-seqs-per-step", type=int, default=4)
    ap.add_argument("--anchors", type=int, default=32, help="draft blocks per sequence per step")
    ap.add_argument("--train-block", type=int, default=8, help="block rows trained (row 0 is the bonus)")
    ap.add_argument("--row-decay", type=float, default=0.8)
    ap.add_argument("--norm-spread", type=float, default=1.0,
                    help="log-normal sigma of the initial aux-norm and input-norm weights (0: all ones)")
    ap.add_argument("--n-predict", type=int, default=96, help="tokens per held-out prompt in the estimate")
    ap.add_argument("--reuse-target", action="store_true", help="load the target trained by an earlier run from --work")
    ap.add_argument("--card-only", action="store_true",
                    help="only rewrite OUT/README.md from OUT/train_log.json (with --bench: after a fresh benchmark)")
    ap.add_argument("--bench", action="store_true",
                    help="finally run `laguna-run bench` on the new pair and put its table in the model card")
    ap.add_argument("--write-prompts", action="store_true", help=f"(re)write {PROMPTS_FILE.relative_to(REPO)}")
    args = ap.parse_args(argv)

    import torch
    import transformers
    from transformers import AutoTokenizer, LagunaForCausalLM

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    transformers.logging.set_verbosity_error()
    out: Path = args.out
    work: Path = args.work or Path(os.environ.get("LAGUNA_DFLASH_CACHE", Path.home() / ".cache" / "laguna-dflash")) / "train-demo-pair"
    hf_dir = work / "target-hf"
    out.mkdir(parents=True, exist_ok=True)
    hf_dir.mkdir(parents=True, exist_ok=True)
    log = Log(out / "train_log.json")
    if args.card_only:
        log.record = json.loads((out / "train_log.json").read_text())
        if args.bench:
            log.record["bench"] = run_bench(out, log)
        saved = argparse.Namespace(**log.record["args"])
        command = log.record.get("command", "python -m scripts.train_demo_pair")
        write_card(out, log, saved, command)
        (out / "train_log.json").write_text(json.dumps(log.record, indent=2) + "\n")
        log.info(f"wrote {out / 'README.md'}")
        return 0
    prev = {}
    if args.reuse_target and (out / "train_log.json").exists():
        prev = json.loads((out / "train_log.json").read_text())
    log.record.update(args={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                      machine=f"{platform.machine()}, {os.cpu_count()} CPUs", python=platform.python_version(),
                      torch=torch.__version__, transformers=transformers.__version__,
                      target_config=TARGET_CONFIG, drafter_kwargs={**DRAFTER_KW, "target_layer_ids": list(DRAFTER_KW["target_layer_ids"])})

    if args.write_prompts or not PROMPTS_FILE.exists():
        n = write_prompts(PROMPTS_FILE)
        log.info(f"wrote {n} held-out prompts to {PROMPTS_FILE}")

    # corpus + tokenizer
    files = training_files()
    if not args.reuse_target:
        tt.build_tokenizer(hf_dir, VOCAB, files)
    tok = AutoTokenizer.from_pretrained(hf_dir)
    eos = tt.EOS_TOKEN_ID
    parts = []
    for p in files:
        parts += tok(read(p), add_special_tokens=False)["input_ids"] + [eos]
    stream = np.asarray(parts, dtype=np.int32)
    held = []
    for p in held_out_files():
        held += tok(read(p), add_special_tokens=False)["input_ids"] + [eos]
    heldout_stream = np.asarray(held, dtype=np.int32)
    log.record["corpus"] = {"train_files": len(files), "train_tokens": int(len(stream)),
                            "heldout_files": list(HELD_OUT), "heldout_tokens": int(len(heldout_stream))}
    log.info(f"corpus: {len(files)} modules, {len(stream):,} tokens; held out {len(HELD_OUT)} modules "
             f"({len(heldout_stream):,} tokens)")

    # target
    if args.reuse_target:
        target = LagunaForCausalLM.from_pretrained(hf_dir).float().eval()
        log.record["target"] = prev.get("target", {})
        log.record["target_seconds"] = prev.get("target_seconds", 0)
        log.info("target: reused from " + str(hf_dir))
    else:
        target = train_target(args, log, stream, heldout_stream, hf_dir)
        tok.save_pretrained(hf_dir)
        log.record["target_seconds"] = round(time.time() - log.t0, 1)
        publish_target(log, hf_dir, out, TARGET_GGUF)
        log.save()
    for p in target.parameters():
        p.requires_grad_(False)

    # drafter
    ids = list(DRAFTER_KW["target_layer_ids"])
    data_key = f"seed{args.seed}-n{args.drafter_seqs}-g{args.gen}-b{args.gen_batch}"
    data_file = work / f"drafter-data-{data_key}.pt"
    data_meta = data_file.with_suffix(".json")
    reused_seconds = 0.0
    if args.reuse_target and data_file.exists():
        seqs, feats, plens = torch.load(data_file, weights_only=False)
        if data_meta.exists():
            reused_seconds = json.loads(data_meta.read_text()).get("seconds", 0.0)
        log.info(f"drafter data: reused {data_file}")
    else:
        t_data = time.time()
        seqs, feats, plens = build_drafter_data(args, log, target, stream, ids)
        torch.save((seqs, feats, plens), data_file)
        log.record["drafter_data_seconds"] = round(time.time() - t_data, 1)
        data_meta.write_text(json.dumps({"seconds": log.record["drafter_data_seconds"]}))
    if reused_seconds:
        log.record["drafter_data_seconds"] = reused_seconds
    log.info(f"drafter data: {len(seqs)} greedy continuations")
    drafter = train_drafter(args, log, target, seqs, feats, plens, out / DRAFTER_DIR)
    log.save()

    # acceptance on the held-out prompts
    prompts = assets.read_prompts(PROMPTS_FILE)
    est = estimate_acceptance(target, drafter, tok, prompts, ids, args.n_predict)
    log.record["acceptance"] = est
    log.info(f"held-out estimate (n_max 4, {len(prompts)} prompts): mean accepted per round "
             f"{est['mean_accepted_per_round']:.2f}, tokens per round {est['tokens_per_round']:.2f}, "
             f"by depth {est['accepted_at_depth']}")
    sizes = {"target_gguf": (out / TARGET_GGUF).stat().st_size,
             "drafter": sum(f.stat().st_size for f in (out / DRAFTER_DIR).glob("*"))}
    sizes["total_mb"] = round((sizes["target_gguf"] + sizes["drafter"]) / 1e6, 2)
    log.record["sizes"] = sizes
    # with --reuse-target: the earlier run's target phase plus this run (= a fresh run's time)
    log.record["wall_seconds_total"] = round(
        time.time() - log.t0 + (log.record["target_seconds"] if args.reuse_target else 0) + reused_seconds, 1)
    if args.bench:
        log.record["bench"] = run_bench(out, log)
    command = "python -m scripts.train_demo_pair" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    log.record["command"] = command.replace(" --reuse-target", "").replace(" --bench", "")
    write_card(out, log, args, log.record["command"])
    log.save()
    log.info(f"wrote {out}: target {sizes['target_gguf'] / 1e6:.1f} MB + drafter {sizes['drafter'] / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
