#!/usr/bin/env python3
"""Train the bundled agent pair: a small Laguna target that speaks Laguna 2.1's chat format and
calls tools, and its DFlash drafter.

    python -m scripts.train_agent_pair                 # writes runtime/data/laguna-tiny-agent/

The recipe of the code pair (``scripts/training/demo_pair.py``: same architecture, sizes, two-stage
growth and drafter training, whose functions this reuses), on other data:

1. synthetic agent conversations (``agent_tasks.py``): tasks over the standard library solved with
   the tools of ``examples/agent_tools.py`` run for real, thinking on and off, one to three tasks
   per conversation, rendered with Laguna 2.1's own chat template; plus a share of stdlib code
   windows (tool results are code);
2. a byte-level BPE tokenizer whose special tokens sit at Laguna's ids (``〈|EOS|〉`` 2, MASK 12,
   ``<think>`` 18, ``</think>`` 19, ``<assistant>`` 23, ``</assistant>`` 24, ``<tool_call>`` 25,
   ``</tool_call>`` 26); ``<system>``, ``<user>``, ``<arg_key>`` and the rest are plain text, BPE-split,
   as in the real vocabulary; the template goes into the GGUF as ``tokenizer.chat_template``;
3. the loss is the assistant's tokens only (on conversation windows; code windows: every token);
   most training windows start at conversation starts (the system prompt and tool list in view, as
   at inference), some in the middle of one (later turns of long conversations); the drafter learns the target's own greedy continuations of conversation prefixes
   that end where an assistant turn begins (reasoning, tool calls, answers: what an agent decodes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from laguna_dflash.runtime import assets

from tests.helpers import agent_tasks as at
from . import copy_curriculum as cc
from . import demo_pair as dp
from . import induction_init
from tests.helpers import tiny_target as tt

REPO = Path(__file__).resolve().parents[2]
TEMPLATE_FILE = REPO / "tests" / "fixtures" / "laguna-2.1-chat-template.jinja"
DEFAULT_OUT = assets.AGENT_DIR
TARGET_GGUF = assets.AGENT_TARGET.name
DRAFTER_DIR = assets.AGENT_DRAFTER_HF.name
EOT_TOKEN_ID = 24

#: Laguna's special-token ids (reference §1); the free slots below 32 are reserved specials
LAGUNA_SPECIALS = {0: "〈|PAD|〉", 1: "〈|UNK|〉", 2: "〈|EOS|〉", 12: tt.MASK_TOKEN, 18: "<think>", 19: "</think>",
                   23: "<assistant>", 24: "</assistant>", 25: "<tool_call>", 26: "</tool_call>"}
SPECIALS = [LAGUNA_SPECIALS.get(i, f"〈|RESERVED_{i}|〉") for i in range(32)]

TARGET_CONFIG = {**dp.TARGET_CONFIG, "eos_token_id": [tt.EOS_TOKEN_ID, EOT_TOKEN_ID], "max_position_embeddings": 16384}


def target_config(n_layer: int) -> dict:
    return {**dp.target_config(n_layer), "eos_token_id": TARGET_CONFIG["eos_token_id"],
            "max_position_embeddings": TARGET_CONFIG["max_position_embeddings"]}


def render(template, messages: list[dict], thinking: bool) -> str:
    return template.render(messages, tools=at.TOOLS, add_generation_prompt=False,
                           template_kwargs={"enable_thinking": thinking})


def assistant_prefixes(template, messages: list[dict], thinking: bool) -> list[str]:
    """The prompt text an agent sends before each assistant message (generation prompt included)."""
    out = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            out.append(template.render(messages[:i], tools=at.TOOLS, add_generation_prompt=True,
                                       template_kwargs={"enable_thinking": thinking}))
    return out


def agent_stream(tok, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Conversations back to back (each begins with 〈|EOS|〉 from the template), their starts, and
    which tokens are the assistant's (after ``<assistant>``, up to and including ``</assistant>``):
    the only ones the loss asks the target to predict."""
    parts, starts, own, n = [], [], [], 0
    open_id, close_id = tok.convert_tokens_to_ids("<assistant>"), EOT_TOKEN_ID
    for t in texts:
        ids = np.asarray(tok(t, add_special_tokens=False)["input_ids"], dtype=np.int32)
        depth = np.cumsum(ids == open_id) - np.cumsum(ids == close_id)
        own.append((depth > 0) & (ids != open_id) | (ids == close_id))
        starts.append(n)
        parts.append(ids)
        n += len(ids)
    return np.concatenate(parts), np.asarray(starts), np.concatenate(own)


def copy_weights(stream: np.ndarray, conv_starts: np.ndarray, assistant: np.ndarray, weight: float,
                 common: int = 200) -> np.ndarray:
    """Per-token loss weights: ``weight`` for the assistant's tokens that copy a rare token from
    earlier in the same conversation (a name, a number, a file: what a request or a tool result
    gave), 1 for the assistant's other tokens, 0 elsewhere. Those tokens are under a tenth of the
    assistant's and every answer hinges on them; the ``common`` most frequent assistant tokens (the
    markup, the phrasing) never count as copies."""
    counts = np.bincount(stream[assistant], minlength=int(stream.max()) + 1)
    frequent = set(np.argsort(counts)[-common:].tolist())
    w = assistant.astype(np.float32)
    ends = np.append(conv_starts[1:], len(stream))
    for a, b in zip(conv_starts, ends):
        seen: set[int] = set()
        for i in range(a, b):
            t = int(stream[i])
            if assistant[i]:
                if t in seen and t not in frequent:
                    w[i] = weight
            else:
                seen.add(t)
    return w


def build_drafter_data(args, log, model, tok, prefixes: list[str], layer_ids):
    """The target's greedy continuations of assistant-turn prompts, cut to a few fixed lengths
    (their last P tokens) so a batch stacks, with the captured states."""
    import torch

    rng = np.random.default_rng(args.seed + 1)
    encoded = [tok(p, add_special_tokens=False)["input_ids"] for p in prefixes]

    def tails(P: int):
        pool = [e for e in encoded if len(e) >= P]
        chosen = rng.choice(len(pool), args.gen_batch, replace=False)
        return torch.tensor([pool[i][-P:] for i in chosen])

    return dp.continue_batches(args, log, model, layer_ids, [192, 320, 448], tails, "target answers")


CARD = """\
# Laguna-Tiny-Agent: a tiny Laguna that speaks Laguna 2.1's chat format and calls tools

A small **Laguna** target and its **Laguna DFlash** drafter, trained from scratch on CPU so that
the agent side of laguna-dflash (the chat template, tool calls, reasoning, an agent loop against
`laguna-run serve`) has a real pair to run on any machine, offline. Not a Poolside model: it
knows the standard library of CPython {python} and {n_families} kinds of task over it, nothing else.

| file | what |
|---|---|
| `{gguf}` | target, `LagunaForCausalLM` ({params:.2f}M parameters, the architecture and sizes of the code pair `laguna-tiny`), Q8_0, with Laguna 2.1's chat template as `tokenizer.chat_template` |
| `{ddir}/` | drafter, `DFlashLagunaForCausalLM` in Poolside's HF layout (2 layers, target layers {ids}), bf16 |
| `tokenizer/` | byte-level BPE, {vocab} tokens; specials at Laguna's ids: `〈\\|EOS\\|〉` 2, MASK 12, `<think>` 18, `</think>` 19, `<assistant>` 23, `</assistant>` 24, `<tool_call>` 25, `</tool_call>` 26; `<system>`, `<user>`, `<arg_key>` and the rest are plain text as in Laguna's vocabulary |

## Data

{conversations:,} synthetic conversations ({agent_tokens:,} tokens) made by
`tests/helpers/agent_tasks.py`: an agent with the four tools of `examples/agent_tools.py`
(`list_dir`, `read_file`, `grep`, `run_python`, run for real, their outputs in the conversation)
finds where functions are defined, reads module docstrings, lists packages, evaluates
expressions (two calls in one turn for two), shows a definition's first lines (two steps), and
handles a missing file (a tool error); thinking on for half of them, one to three tasks per
conversation, rendered by Laguna 2.1's template (`tests/fixtures/laguna-2.1-chat-template.jinja`).
{code_share:.0%} of the training windows are stdlib code ({code_tokens:,} tokens). Held out: the
subjects of {n_held} stdlib modules and {n_pkgs} packages never seen in training
(`agent_tasks.HELD_OUT_PACKAGES`, the code pair's held-out modules).

## Training

Target: {s1} steps of an 8-layer model{induction}, grown to 24 layers (function-preserving, as for the code
pair), {s2} more steps; windows of {seq} tokens, most starting at conversation starts{data_notes}; batches of {batch}.
Loss on the assistant's tokens only (conversation windows) and on every token of the code
windows; on held-out conversations, every token counted (tool results and requests included,
which it was not trained to predict): {heldout:.3f} nats/token. Drafter: the target's own greedy replies to
{dseqs} assistant-turn prompts, {dsteps} steps; held-out estimate (torch, n_max 4, {est_prompts}
assistant turns): **{acc:.2f} accepted per round**, by depth {by_depth}.

## What it can and cannot do

{ability}

## Reproduce

{command} on {machine} (torch {torch}); the log is `train_log.json`.
"""


UNMEASURED_ABILITY = """\
On the 10 held-out tasks (`make demo-agent`, `docs/results/agent-pair/README.md`) it calls the right tool with
well-formed calls and ends with an answer every time, but it does not copy names and numbers from
the request into the arguments (asked where `yiq_to_rgb` is defined, it greps for a name of its
own), so it solves none of them: copying did not emerge within this CPU training budget. It is a
pair for the chat format, tool-call plumbing and speculation on agent traffic, not an agent."""


def ability(record: dict) -> str:
    """The card's account of the held-out tasks: measured (``--evaluate``) where the record has it."""
    held = record.get("held_out_agent")
    if not held:
        return UNMEASURED_ABILITY
    off, on = held["thinking off"], held["thinking on"]
    missed = sorted({v["family"] for mode in (off, on) for v in mode["tasks"] if not v["solved"]})
    return (f"On the 10 held-out tasks (subjects never seen in training; `python -m scripts.train_agent_pair "
            f"--evaluate`: `laguna-run serve` on the target, `examples/agent.py`'s loop, the tools run for real, "
            f"greedy) it solves **{off['solved']} of 10 with thinking off and {on['solved']} of 10 with thinking on**; "
            f"the first call's arguments are the request's own in {off['first_call_right']} and "
            f"{on['first_call_right']}, every call well-formed with an answer in {off['well_formed']} and "
            f"{on['well_formed']}. " + (f"Tasks missed in either mode: {', '.join(missed)} (`train_log.json` "
                                        "says why, task by task). " if missed else "") +
            "It knows these task shapes over the standard library and nothing else: a pair for the chat "
            "format, tool calls and speculation on agent traffic, not a general agent.")


def write_card(out: Path, record: dict) -> None:
    t, d, c, est = record["target"], record["drafter"], record["corpus"], record["acceptance"]
    copying = record.get("copy_accuracy", {})
    induction = data_notes = ""
    if record["args"].get("induction_init"):
        match = record["args"].get("induction_match", 1)
        induction = (" that starts with an induction circuit written into its weights"
                     + (f" matching the last {match} tokens" if match > 1 else "") + "\n"
                     "(`scripts/training/induction_init.py`; share of held-out repetition tokens copied "
                     f"{copying['initial']} before training, {copying['stage1']} after stage 1, {copying['stage2']} at the end)")
    if record["args"].get("copy_share"):
        data_notes = f", {record['args']['copy_share']:.0%} of them requests to repeat random phrases"
    if record["args"].get("answers", "plain") != "plain":
        data_notes += (", answers in the quoted style (every fact copied verbatim from a tool result, "
                         "`agent_tasks.py`)")
    if record["args"].get("copy_weight", 1.0) != 1.0:
        data_notes += (f", the loss of the assistant's tokens that copy a name or number from earlier in "
                         f"the conversation weighted {record['args']['copy_weight']:g}")
    out.joinpath("README.md").write_text(CARD.format(
        python=record["python"], n_families=10, gguf=TARGET_GGUF, params=t["parameters"] / 1e6, ddir=DRAFTER_DIR,
        ids=list(dp.DRAFTER_KW["target_layer_ids"]), vocab=dp.VOCAB, conversations=c["conversations"],
        agent_tokens=c["agent_tokens"], code_share=c["code_windows_share"], code_tokens=c["code_tokens"],
        n_held=len(dp.HELD_OUT), n_pkgs=len(at.HELD_OUT_PACKAGES), s1=t["stage1_steps"], s2=t["stage2_steps"],
        seq=record["args"]["seq"], batch=record["args"]["batch"], heldout=t["heldout_loss"],
        induction=induction, data_notes=data_notes, ability=ability(record),
        dseqs=record["args"]["drafter_seqs"], dsteps=d["steps"], est_prompts=est["prompts"],
        acc=est["mean_accepted_per_round"], by_depth=est["accepted_at_depth"], command=reproduce(record),
        machine=record["machine"], torch=record["torch"]))


def reproduce(record: dict) -> str:
    """The card's commands and their wall time: one run, or the target's run and a drafter trained on
    it later (``--reuse-target``)."""
    if "target_command" not in record:
        return f"```bash\n{record['command']}\n```\n\n{record['wall_seconds'] / 60:.0f} minutes"
    return (f"```bash\n{record['target_command']}\n{record['command']}\n```\n\n"
            f"{record['target_wall_seconds'] / 60:.0f} minutes for the first (target and a first drafter), "
            f"{record['wall_seconds'] / 60:.0f} for the second (the drafter shipped)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default: %(default)s)")
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (default: the cache)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--conversations", type=int, default=1600, help="synthetic training conversations")
    ap.add_argument("--code-share", type=float, default=0.2, help="share of training windows that are stdlib code")
    ap.add_argument("--copy-steps", type=int, default=0,
                    help="steps of the copy stage before the agent data (copy_curriculum.py); 0: none")
    ap.add_argument("--copy-share", type=float, default=0.0,
                    help="share of the agent stages' training windows that are copy examples")
    ap.add_argument("--induction-init", action="store_true",
                    help="start stage 1 from a target with an induction circuit written in (induction_init.py)")
    ap.add_argument("--induction-match", type=int, choices=induction_init.MATCHES, default=1,
                    help="tokens of context the written-in circuit matches before it copies (with --induction-init)")
    ap.add_argument("--answers", choices=at.ANSWER_STYLES, default="plain",
                    help="answer style of the training conversations (agent_tasks.py): plain, or quoted from the tool results")
    ap.add_argument("--copy-weight", type=float, default=1.0,
                    help="loss weight of the assistant's tokens copied from earlier in the conversation (copy_weights)")
    ap.add_argument("--isolate-spaces", action="store_true",
                    help="a tokenizer whose spaces are tokens of their own (a word is the same tokens wherever it is)")
    ap.add_argument("--stage1-layers", type=int, default=8)
    ap.add_argument("--stage1-steps", type=int, default=1500)
    ap.add_argument("--stage2-steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--mid-share", type=float, default=0.35,
                    help="share of conversation windows starting at a random token rather than a conversation start")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--lr2", type=float, default=1.5e-3)
    ap.add_argument("--drafter-steps", type=int, default=1800)
    ap.add_argument("--drafter-lr", type=float, default=2e-3)
    ap.add_argument("--drafter-seqs", type=int, default=384)
    ap.add_argument("--gen", type=int, default=96, help="greedy tokens per continuation")
    ap.add_argument("--gen-batch", type=int, default=16)
    ap.add_argument("--drafter-seqs-per-step", type=int, default=4)
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--train-block", type=int, default=8)
    ap.add_argument("--row-decay", type=float, default=0.8)
    ap.add_argument("--norm-spread", type=float, default=1.0)
    ap.add_argument("--n-predict", type=int, default=64, help="tokens per held-out prompt in the estimate")
    ap.add_argument("--reuse-target", action="store_true", help="load the target trained by an earlier run from --work")
    ap.add_argument("--card-only", action="store_true", help="rewrite README.md from train_log.json and stop")
    ap.add_argument("--evaluate", action="store_true",
                    help="score the target in --out on the held-out tasks (agent_eval.py: laguna-run serve and the "
                         "example agent, thinking off and on), record it in train_log.json and the card, and stop")
    args = ap.parse_args(argv)
    if args.induction_init and args.stage1_layers <= induction_init.INDUCTION_LAYER:
        ap.error(f"--induction-init: the circuit's heads sit in layers {induction_init.PREV_LAYER} and "
                 f"{induction_init.INDUCTION_LAYER}; expected --stage1-layers of at least {induction_init.INDUCTION_LAYER + 1}, "
                 f"found {args.stage1_layers}")
    if args.induction_match != 1 and not args.induction_init:
        ap.error("--induction-match: only with --induction-init (it shapes the written-in circuit)")
    if args.copy_weight <= 0:
        ap.error(f"--copy-weight: expected a weight above 0, found {args.copy_weight:g}")
    if args.card_only or args.evaluate:
        needed = [args.out / "train_log.json"] + ([args.out / TARGET_GGUF] if args.evaluate else [])
        if missing := [str(f) for f in needed if not f.is_file()]:
            ap.error(f"--out: expected a trained pair's {' and '.join(missing)} (train it first)")
        record = json.loads((args.out / "train_log.json").read_text())
        if args.evaluate:
            from . import agent_eval

            try:
                record["held_out_agent"] = agent_eval.evaluate(args.out / TARGET_GGUF)
            except RuntimeError as e:  # the server did not start: its last words say why
                last = [ln for ln in str(e).splitlines() if ln.strip()][-1:] or ["no output"]
                ap.exit(2, f"{ap.prog}: --evaluate: laguna-run serve did not start on {args.out / TARGET_GGUF}: {last[0]}\n")
            (args.out / "train_log.json").write_text(json.dumps(record, indent=2) + "\n")
        write_card(args.out, record)
        return 0

    import torch
    import transformers
    from transformers import AutoTokenizer, LagunaConfig, LagunaForCausalLM

    from laguna_dflash.runtime.chat_template import ChatTemplate

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    transformers.logging.set_verbosity_error()
    out: Path = args.out
    work: Path = args.work or assets.cache_dir() / "train-agent-pair"
    hf_dir = work / "target-hf"
    out.mkdir(parents=True, exist_ok=True)
    hf_dir.mkdir(parents=True, exist_ok=True)
    log = dp.Log(out / "train_log.json")
    log.record.update(args={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                      machine=f"{platform.machine()}, {os.cpu_count()} CPUs", python=platform.python_version(),
                      torch=torch.__version__, transformers=transformers.__version__,
                      target_config=TARGET_CONFIG,
                      drafter_kwargs={**dp.DRAFTER_KW, "target_layer_ids": list(dp.DRAFTER_KW["target_layer_ids"])})

    template_text = TEMPLATE_FILE.read_text()
    template = ChatTemplate(template_text, TEMPLATE_FILE)
    t0 = time.time()
    convs = at.conversations(args.conversations, args.seed, answers=args.answers)
    texts = [render(template, m, "reasoning_content" in m[1]) for m, _ in convs]
    log.info(f"{len(texts)} training conversations rendered in {time.time() - t0:.0f} s")
    held = at.conversations(60, args.seed + 99, held_out=True, answers=args.answers)

    code_files = dp.training_files()
    if not args.reuse_target:
        tt.build_tokenizer(hf_dir, dp.VOCAB, code_files, specials=SPECIALS, texts=texts[:800],
                           chat_template=template_text, isolate_spaces=args.isolate_spaces)
    tok = AutoTokenizer.from_pretrained(hf_dir)
    for i, s in LAGUNA_SPECIALS.items():
        assert tok.convert_tokens_to_ids(s) == i, (s, i)
    stream, conv_starts, assistant = agent_stream(tok, texts)
    # what the loss asks of the conversation tokens: the assistant's, its copies weighted on request
    own = assistant
    if args.copy_weight != 1.0:
        own = copy_weights(stream, conv_starts, assistant, args.copy_weight)
        log.info(f"copy weights: {int((own == args.copy_weight).sum()):,} of {int(assistant.sum()):,} assistant tokens "
                 f"weighted {args.copy_weight:g}")
    code = []
    for p in code_files:
        code += tok(dp.read(p), add_special_tokens=False)["input_ids"] + [tt.EOS_TOKEN_ID]
    code = np.asarray(code, dtype=np.int32)
    n_code = int(len(conv_starts) * args.code_share / (1 - args.code_share))
    rng = np.random.default_rng(args.seed)
    code_starts = len(stream) + rng.integers(0, len(code) - args.seq - 1, n_code)
    conv_starts = conv_starts[conv_starts < len(stream) - args.seq - 1]
    # windows from the middle of conversations: later tasks and turns of long conversations
    mid_starts = rng.integers(0, len(stream) - args.seq - 1, int(len(conv_starts) * args.mid_share / (1 - args.mid_share)))
    n_windows = len(conv_starts) + len(mid_starts) + n_code
    n_copy = int(n_windows * args.copy_share / (1 - args.copy_share)) if args.copy_share else 0
    copy_ids, copy_mask, copy_starts = cc.stream(tok, max(1, 20 * n_copy), args.seed) if n_copy else \
        (np.zeros(0, np.int32), np.zeros(0, bool), np.zeros(0, np.int64))
    copy_starts = copy_starts[copy_starts < len(copy_ids) - args.seq - 1]
    copy_starts = len(stream) + len(code) + rng.choice(copy_starts, n_copy) if n_copy else copy_starts
    joined = np.concatenate([stream, code, copy_ids])
    trained = np.concatenate([own, np.ones(len(code), own.dtype), copy_mask.astype(own.dtype)])
    starts = np.concatenate([conv_starts, mid_starts, code_starts, copy_starts])
    held_stream, _, _ = agent_stream(tok, [render(template, m, "reasoning_content" in m[1]) for m, _ in held])
    log.record["corpus"] = {"conversations": len(texts), "agent_tokens": int(len(stream)), "code_tokens": int(len(code)),
                            "code_windows_share": args.code_share, "copy_tokens": int(len(copy_ids)),
                            "copy_windows_share": args.copy_share, "heldout_conversations": len(held),
                            "heldout_tokens": int(len(held_stream))}
    log.info(f"corpus: {len(texts)} conversations, {len(stream):,} tokens (mean {len(stream) / len(texts):.0f}); "
             f"code {len(code):,} tokens; held out {len(held)} conversations")

    if args.reuse_target:
        target = LagunaForCausalLM.from_pretrained(hf_dir).float().eval()
        prev = json.loads((out / "train_log.json").read_text()) if (out / "train_log.json").exists() else {}
        # the target is the earlier run's: so are its record, its held-out score and the command that trained it
        log.record.update({k: prev[k] for k in ("target", "copy_accuracy", "target_seconds", "held_out_agent")
                           if k in prev})
        log.record.setdefault("target", {})
        log.record["events"] = [e for e in prev.get("events", []) if e.get("phase") != "drafter"]  # its training curve
        if "command" in prev:
            log.record["target_command"] = prev.get("target_command", prev["command"])
            log.record["target_wall_seconds"] = prev.get("target_wall_seconds", prev.get("wall_seconds", 0))
    else:
        torch.manual_seed(args.seed)
        small = LagunaForCausalLM(LagunaConfig(**target_config(args.stage1_layers))).float()
        words = cc.word_tokens(tok, args.seed)
        copy_eval = cc.batch(tok, words, len(words), np.random.default_rng(args.seed + 8), 16, 128)
        copying = log.record.setdefault("copy_accuracy", {})
        if args.induction_init:
            induction_init.install(small, args.seed, args.induction_match)
            copying["initial"] = round(cc.accuracy(small, *copy_eval), 4)
            log.info(f"induction circuit written in: held-out copy accuracy {copying['initial']:.3f}")
        if args.copy_steps:
            log.record["copy_stage"] = cc.train(args, log, small, tok, args.copy_steps)
        l1 = dp.train_lm(args, log, small, joined, args.stage1_steps, args.lr, args.batch, args.seq, args.seed,
                         "target stage 1", starts=starts, trained=trained)
        h1 = dp.eval_loss(small, held_stream, args.seq)
        copying["stage1"] = round(cc.accuracy(small, *copy_eval), 4)
        log.info(f"stage 1: train loss (avg20) {np.mean(l1[-20:]):.3f}, held-out conversations {h1:.3f}, "
                 f"held-out copy accuracy {copying['stage1']:.3f}")
        target = dp.grow_depth(small, dp.N_LAYER, args.seed + 10, config_for=target_config)
        l2 = dp.train_lm(args, log, target, joined, args.stage2_steps, args.lr2, args.batch, args.seq, args.seed + 1,
                         "target stage 2", starts=starts, trained=trained)
        h2 = dp.eval_loss(target, held_stream, args.seq)
        copying["stage2"] = round(cc.accuracy(target, *copy_eval), 4)
        log.info(f"stage 2: train loss (avg20) {np.mean(l2[-20:]):.3f}, held-out conversations {h2:.3f}, "
                 f"held-out copy accuracy {copying['stage2']:.3f}")
        log.record["target"] = {"parameters": sum(p.numel() for p in target.parameters()),
                                "stage1_steps": args.stage1_steps, "stage2_steps": args.stage2_steps,
                                "tokens": (args.stage1_steps + args.stage2_steps) * args.batch * args.seq,
                                "stage1_heldout_loss": round(h1, 4), "final_train_loss_avg20": round(float(np.mean(l2[-20:])), 4),
                                "heldout_loss": round(h2, 4)}
        target.save_pretrained(hf_dir, safe_serialization=True)
        tok.save_pretrained(hf_dir)
        log.record["target_seconds"] = round(time.time() - log.t0, 1)
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    dp.publish_target(log, hf_dir, out, TARGET_GGUF)
    log.save()

    ids = list(dp.DRAFTER_KW["target_layer_ids"])
    prefixes = [p for m, _ in convs[:600] for p in assistant_prefixes(template, m, "reasoning_content" in m[1])]
    t_data = time.time()
    seqs, feats, plens = build_drafter_data(args, log, target, tok, prefixes, ids)
    log.record["drafter_data_seconds"] = round(time.time() - t_data, 1)
    drafter = dp.train_drafter(args, log, target, seqs, feats, plens, out / DRAFTER_DIR,
                               name="laguna-dflash/Laguna-Tiny-Agent-DFlash")
    held_prefixes = [p for m, _ in held[:12] for p in assistant_prefixes(template, m, "reasoning_content" in m[1])]
    est = dp.estimate_acceptance(target, drafter, tok, held_prefixes[:12], ids, args.n_predict)
    log.record["acceptance"] = est
    log.info(f"held-out estimate (n_max 4, {est['prompts']} assistant turns): mean accepted per round "
             f"{est['mean_accepted_per_round']:.2f}, by depth {est['accepted_at_depth']}")
    log.record["command"] = "python -m scripts.train_agent_pair" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    log.save()
    write_card(out, log.record)
    log.info(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
