#!/usr/bin/env python3
"""Does a small Laguna learn to copy (form an induction circuit) within a CPU budget?

The textbook task: windows packed with random runs of word tokens (4-23 of them), each run
followed by itself; the loss is on the repeat after its first token, which only copying can
predict. Prints the loss and the share of held-out repeat tokens predicted every 100 steps.

    python -m scripts.investigate.induction_plateau --layers 2 --steps 2000            # all word tokens: stays at chance
    python -m scripts.investigate.induction_plateau --layers 2 --steps 1000 --alphabet 64
    python -m scripts.investigate.induction_plateau --layers 8 --induction --steps 0   # the circuit written in, untrained
    python -m scripts.investigate.induction_plateau --layers 8 --induction --match 2 --steps 0 --alphabet 64
    python -m scripts.investigate.induction_plateau --arch llama --layers 2 --steps 600 --alphabet 64

The model is the agent pair's stage-1 target config at ``--layers`` depth (``--arch llama``: a
Llama of the same width, to see whether Laguna's features are the obstacle); the tokenizer is
the bundled agent pair's. Results: docs/results/agent-pair/README.md ("Copying written in, not learnt").
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from scripts.training import copy_curriculum, demo_pair, induction_init

from laguna_dflash.runtime import assets  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--arch", choices=("laguna", "llama"), default="laguna")
    ap.add_argument("--induction", action="store_true", help="write the induction circuit in first (induction_init.py)")
    ap.add_argument("--match", type=int, choices=induction_init.MATCHES, default=1,
                    help="tokens of context the written-in circuit matches (with --induction)")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--alphabet", type=int, default=0, help="word tokens drawn from (0: all of them)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    for flag, value, least in (("--layers", args.layers, 1), ("--steps", args.steps, 0), ("--batch", args.batch, 1),
                               ("--seq", args.seq, 2), ("--alphabet", args.alphabet, 0), ("--threads", args.threads, 1)):
        if value < least:
            ap.error(f"{flag}: expected at least {least}, found {value}")
    if args.induction and (args.arch != "laguna" or args.layers < induction_init.INDUCTION_LAYER + 1):
        ap.error(f"--induction: needs --arch laguna and --layers >= {induction_init.INDUCTION_LAYER + 1}")

    import torch
    from transformers import AutoTokenizer, LagunaConfig, LagunaForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(assets.AGENT_DIR / "tokenizer")
    word_ids = np.asarray(tok.convert_tokens_to_ids(copy_curriculum.word_tokens(tok, 0)))
    if args.alphabet > len(word_ids):
        ap.error(f"--alphabet: the tokenizer has {len(word_ids)} word tokens, found {args.alphabet}")
    alphabet = args.alphabet or len(word_ids)
    if args.arch == "llama":
        cfg = demo_pair.target_config(args.layers)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                                             intermediate_size=cfg["intermediate_size"], num_hidden_layers=args.layers,
                                             num_attention_heads=4, num_key_value_heads=2, head_dim=cfg["head_dim"]))
    else:
        model = LagunaForCausalLM(LagunaConfig(**demo_pair.target_config(args.layers)))
    model = model.float()
    if args.induction:
        induction_init.install(model, seed=0, match=args.match)
    held_out = copy_curriculum.repeated_runs(word_ids, np.random.default_rng(99), 32, args.seq, alphabet)
    model.eval()
    print(f"before training: repeat accuracy {copy_curriculum.accuracy(model, *held_out):.3f}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    rng = np.random.default_rng(1)
    t0 = time.time()
    model.train()
    for step in range(args.steps):
        x, labels = copy_curriculum.repeated_runs(word_ids, rng, args.batch, args.seq, alphabet)
        for g in opt.param_groups:
            g["lr"] = demo_pair.lr_at(step, args.steps, args.lr, 50)
        loss = model(input_ids=x, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == args.steps - 1:
            model.eval()
            acc = copy_curriculum.accuracy(model, *held_out)
            model.train()
            print(f"step {step}: loss {loss.item():.3f}, repeat accuracy {acc:.3f} ({time.time() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
