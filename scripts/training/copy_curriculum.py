"""Copying first: a curriculum stage that teaches the target to repeat text from its context.

Every agent task needs copying: a function name from the request into a tool's arguments, a
file and line from a tool result into the answer, and the agent conversations alone give too
thin a signal for it (what was tried and measured: docs/results/agent-pair/README.md). This stage trains
on requests to repeat a phrase of random word tokens, in the markup of Laguna 2.1's chat, with the
loss on the repetition only. Random phrases cannot be memorised, so only copying lowers the loss;
the alphabet grows from a few hundred word tokens to all of them, so that the first lessons
repeat the same tokens often.
"""

from __future__ import annotations

import re

import numpy as np

#: how copy requests are phrased (the agent tasks' own ``repeat`` family uses the first two)
PHRASINGS = ("Repeat exactly: {}", "Say back: {}", "Copy this: {}", "{}")
#: the markup around a request and its repetition, as the 2.1 template renders a turn without
#: tools (thinking off, then on)
TURNS = ("<user>{}</user>\n<assistant></think>", "<user>{}</user>\n<assistant><think></think>")
END = "</assistant>\n"


def word_tokens(tok, seed: int) -> list[str]:
    """The vocabulary's word-like tokens (letters, digits, underscores; with or without the
    byte-level space marker), in a seeded order: the curriculum's alphabet is a prefix of it."""
    words = sorted(t for t in tok.get_vocab() if re.fullmatch(r"Ġ?[A-Za-z0-9_]+", t))
    return [words[i] for i in np.random.default_rng(seed).permutation(len(words))]


def example(tok, words: list[str], alphabet: int, rng) -> tuple[list[int], list[bool]]:
    """One copy request and its answer; the mask marks the answer (the loss's tokens)."""
    k = int(rng.integers(2, 12))
    phrase = tok.convert_tokens_to_string([words[i] for i in rng.integers(0, alphabet, k)]).strip()
    request = PHRASINGS[int(rng.integers(len(PHRASINGS)))].format(phrase)
    head = tok(TURNS[int(rng.integers(2))].format(request), add_special_tokens=False)["input_ids"]
    answer = tok(phrase + END, add_special_tokens=False)["input_ids"]
    return head + answer, [False] * len(head) + [True] * len(answer)


def batch(tok, words: list[str], alphabet: int, rng, n: int, seq: int):
    """``n`` windows of ``seq`` tokens packed with copy examples: (input ids, labels)."""
    import torch

    xs, keep = [], []
    for _ in range(n):
        ids, mask = [], []
        while len(ids) < seq:
            i, m = example(tok, words, alphabet, rng)
            ids += i
            mask += m
        xs.append(ids[:seq])
        keep.append(mask[:seq])
    x = torch.tensor(xs)
    return x, x.masked_fill(~torch.tensor(keep), -100)


def accuracy(model, x, labels) -> float:
    """Share of the repetition's tokens the model predicts (greedy, teacher-forced)."""
    import torch

    with torch.no_grad():
        pred = model(input_ids=x).logits[:, :-1].argmax(-1)
    target = labels[:, 1:]
    scored = target != -100
    return float(((pred == target) & scored).sum() / scored.sum())


def train(args, log, model, tok, steps: int, seq: int = 128, batch_size: int = 12, start_alphabet: int = 200,
          grow_share: float = 0.6) -> dict:
    """The copy stage: ``steps`` AdamW steps; the alphabet reaches every word token after
    ``grow_share`` of them. Returns the accuracy on held-out phrases (all word tokens) over time."""
    import torch

    from .demo_pair import lr_at, progress

    words = word_tokens(tok, args.seed)
    rng = np.random.default_rng(args.seed + 7)
    eval_x, eval_labels = batch(tok, words, len(words), np.random.default_rng(args.seed + 8), 16, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    history = []
    model.train()
    with progress(log) as prog:
        task = prog.add_task("copy stage", total=steps, info="")
        for step in range(steps):
            alphabet = int(min(len(words), start_alphabet + (len(words) - start_alphabet) * step / (grow_share * steps)))
            x, labels = batch(tok, words, alphabet, rng, batch_size, seq)
            for g in opt.param_groups:
                g["lr"] = lr_at(step, steps, args.lr, max(10, steps // 20))
            out = model(input_ids=x, labels=labels)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step % 100 == 0 or step == steps - 1:
                model.eval()
                acc = accuracy(model, eval_x, eval_labels)
                model.train()
                history.append({"step": step, "alphabet": alphabet, "loss": round(out.loss.item(), 4),
                                "copy_accuracy": round(acc, 4)})
                log.event(phase="copy", **history[-1])
                log.plain(f"copy step {step + 1}/{steps}: loss {out.loss.item():.3f}, alphabet {alphabet}, "
                          f"held-out copy accuracy {acc:.3f}")
            prog.update(task, advance=1, info=f"loss {out.loss.item():.3f}")
    model.eval()
    return {"steps": steps, "history": history, "final_copy_accuracy": history[-1]["copy_accuracy"]}


def repeated_runs(word_ids: np.ndarray, rng, n: int, seq: int, alphabet: int | None = None, longest: int = 23):
    """The textbook copy task: ``n`` windows of ``seq`` tokens packed with random runs of 4 to
    ``longest`` word tokens (from the first ``alphabet`` of ``word_ids``), each followed by itself;
    (input ids, labels) with the labels on the repeat after its first token, which only copying
    predicts."""
    import torch

    xs, keep = [], []
    for _ in range(n):
        ids, k = [], []
        while len(ids) < seq:
            run = list(word_ids[rng.integers(0, alphabet or len(word_ids), int(rng.integers(4, longest + 1)))])
            ids += run + run
            k += [False] * (len(run) + 1) + [True] * (len(run) - 1)
        xs.append(ids[:seq])
        keep.append(k[:seq])
    x = torch.tensor(xs)
    return x, x.masked_fill(~torch.tensor(keep), -100)


def stream(tok, n_examples: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Copy examples back to back over the whole alphabet, for mixing into the agent stage:
    (tokens, the answer mask, each example's start)."""
    words = word_tokens(tok, seed)
    rng = np.random.default_rng(seed + 9)
    ids, mask, starts = [], [], []
    for _ in range(n_examples):
        i, m = example(tok, words, len(words), rng)
        starts.append(len(ids))
        ids += i
        mask += m
    return np.asarray(ids, dtype=np.int32), np.asarray(mask, dtype=bool), np.asarray(starts)
