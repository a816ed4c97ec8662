#!/usr/bin/env python3
"""A tiny, deterministic Laguna target for tests: HF checkpoint, GGUF and reference outputs.

It has every feature of the real architecture that the speculative path touches — hybrid
sliding/full ``layer_types`` (period 4, full first), per-layer head counts, partial rotary on
full-attention layers, one leading dense layer then sigmoid-routed MoE with a shared expert,
the per-head softplus gate and QK norm — at a size of a few MB in F32.

    python tests/helpers/tiny_target.py OUT_DIR    # writes OUT_DIR/hf, OUT_DIR/tiny-laguna-f32.gguf,
                                                   # OUT_DIR/reference.npz

The GGUF is written by the sdist's own ``convert_hf_to_gguf.py`` (found through
``scripts/build_wheel.py --source-dir``), told that our byte-level BPE pre-tokenizes like GPT-2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
BUILD_WHEEL = REPO / "scripts" / "build_wheel.py"

#: Laguna-style special tokens; their ids are fixed so MASK sits at 12 as in Poolside's vocab.
SPECIAL_TOKENS = [
    "〈|PAD|〉", "〈|UNK|〉", "〈|EOS|〉", "〈|SYSTEM|〉", "〈|USER|〉", "〈|ASSISTANT|〉",
    "<system>", "</system>", "<user>", "</user>", "<assistant>", "〈|TOOL|〉",
    "〈|MASK|〉", "</assistant>", "<think>", "</think>",
]
MASK_TOKEN = "〈|MASK|〉"
MASK_TOKEN_ID = 12
EOS_TOKEN_ID = 2
EOT_TOKEN_ID = 13

#: what every Laguna target config made here shares whatever its sizes (the demo pair's too):
#: Laguna's two RoPE families, per-head gating, and this tokenizer's special tokens
LAGUNA_FIXED = dict(
    moe_routed_scaling_factor=1.0,
    rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
    },
    gating="per-head",
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    bos_token_id=EOS_TOKEN_ID,
    eos_token_id=[EOS_TOKEN_ID, EOT_TOKEN_ID],
    pad_token_id=0,
    tie_word_embeddings=False,
)

TINY_CONFIG = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=6,
    num_attention_heads_per_layer=[4, 6, 6, 6, 4, 6],
    num_key_value_heads=2,
    head_dim=16,
    sliding_window=32,
    layer_types=["full_attention", "sliding_attention", "sliding_attention", "sliding_attention",
                 "full_attention", "sliding_attention"],
    mlp_layer_types=["dense"] + ["sparse"] * 5,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
    **LAGUNA_FIXED,
)


def corpus_files(limit: int = 40) -> list[Path]:
    """Python standard-library sources: a corpus every machine with CPython has."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.stat().st_size > 4000)
    return files[:limit]


def build_tokenizer(out_dir: Path, vocab_size: int, files: list[Path] | None = None,
                    specials: list[str] = SPECIAL_TOKENS, texts: list[str] | None = None,
                    chat_template: str | None = None, isolate_spaces: bool = False) -> None:
    """Byte-level BPE (GPT-2 pre-tokenizer) with the Laguna-style specials at fixed ids (a
    special's id is its index in ``specials``); trained on ``files`` plus ``texts``.

    ``isolate_spaces``: a space is always a token of its own, never merged into the word after
    it, so a word is the same tokens after a space as after a backtick or a parenthesis (what
    copying a name from a request into a call needs). No merge then contains a space, so
    llama.cpp's GPT-2 pre-tokenizer splits text into the same tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if isolate_spaces:
        # after the GPT-2 split (whose chunk boundaries llama.cpp reproduces), not before it
        tok.pre_tokenizer = pre_tokenizers.Sequence([tok.pre_tokenizer, pre_tokenizers.Split("Ġ", behavior="isolated")])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [p.read_text(encoding="utf-8", errors="replace") for p in (files or corpus_files())] + (texts or [])
    tok.train_from_iterator(corpus, trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    assert tok.token_to_id(MASK_TOKEN) == MASK_TOKEN_ID
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=specials[EOS_TOKEN_ID],
        eos_token=specials[EOS_TOKEN_ID],
        pad_token=specials[0],
        unk_token=specials[1],
        mask_token=MASK_TOKEN,
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(out_dir)


def randomize_(model, seed: int) -> None:
    """Weights with enough spread that greedy argmaxes are not near-ties (HF's 0.02 init is)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if p.ndim == 1:
                if "e_score_correction_bias" in name:
                    p.copy_(0.05 * torch.randn(p.shape, generator=g))
                else:  # norm weights: near one, but not one, so a skipped norm shows
                    p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)
        # the router's e_score_correction_bias is a buffer-like parameter without grad
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.copy_(0.05 * torch.randn(b.shape, generator=g))


def build_hf_target(out_dir: Path, seed: int = 0, config_overrides: dict | None = None):
    import torch
    from transformers import LagunaConfig, LagunaForCausalLM

    torch.manual_seed(seed)
    cfg = LagunaConfig(**{**TINY_CONFIG, **(config_overrides or {})})
    model = LagunaForCausalLM(cfg).float().eval()
    randomize_(model, seed)
    model.save_pretrained(out_dir, safe_serialization=True)
    return model


def llama_cpp_dir() -> Path:
    env = os.environ.get("LAGUNA_LLAMA_CPP_DIR")
    if env:
        return Path(env)
    out = subprocess.run([sys.executable, str(BUILD_WHEEL), "--source-dir"],
                         check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return Path(out) / "vendor" / "llama.cpp"


_CONVERT_SHIM = r"""
import runpy, sys
from conversion.base import TextModel
# our byte-level BPE is not one of the hashes convert_hf_to_gguf knows; it splits like GPT-2
TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv = [sys.argv[1] + "/convert_hf_to_gguf.py"] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def convert_to_gguf(hf_dir: Path, out: Path, outtype: str = "f32", llama_dir: Path | None = None,
                    vocab_only: bool = False) -> Path:
    llama_dir = llama_dir or llama_cpp_dir()
    cmd = [sys.executable, "-c", _CONVERT_SHIM, str(llama_dir), str(hf_dir),
           "--outfile", str(out), "--outtype", outtype] + (["--vocab-only"] if vocab_only else [])
    # the vendored converter and its own gguf-py, ahead of the installed gguf
    path = os.pathsep.join([str(llama_dir), str(llama_dir / "gguf-py"), os.environ.get("PYTHONPATH", "")])
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path.rstrip(os.pathsep)})
    if r.returncode != 0 or not out.exists():
        raise RuntimeError(f"convert_hf_to_gguf failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return out


def reference_outputs(model, token_ids: list[int]) -> dict[str, np.ndarray]:
    """Logits and the residual stream after every decoder layer (forward hooks)."""
    import torch

    residuals: list[np.ndarray] = []
    hooks = [layer.register_forward_hook(lambda _m, _i, out: residuals.append(
        (out[0] if isinstance(out, tuple) else out)[0].detach().float().numpy().copy()))
        for layer in model.model.layers]
    try:
        with torch.no_grad():
            out = model(torch.tensor([token_ids]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return {
        "tokens": np.asarray(token_ids, dtype=np.int32),
        "logits": out.logits[0].float().numpy(),
        # residual[t] = stream after HF layer t = llama.cpp capture slot t + 1
        "residuals": np.stack(residuals),
    }


def reference_prompt(tokenizer_dir: Path, n_tokens: int = 96) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    text = BUILD_WHEEL.read_text()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return ids[:n_tokens]


def generator_fingerprint() -> str:
    """Changes whenever this generator (or the patch set it converts with) changes."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    for p in sorted((REPO / "patches").glob("*")):
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def build_all(out_dir: Path, seed: int = 0) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    hf = out_dir / "hf"
    hf.mkdir(exist_ok=True)
    build_tokenizer(hf, TINY_CONFIG["vocab_size"])
    model = build_hf_target(hf, seed)
    gguf_path = convert_to_gguf(hf, out_dir / "tiny-laguna-f32.gguf")
    ref = reference_outputs(model, reference_prompt(hf))
    np.savez(out_dir / "reference.npz", **ref)
    (out_dir / "fingerprint").write_text(generator_fingerprint())
    return {"hf": hf, "gguf": gguf_path, "reference": out_dir / "reference.npz"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    paths = build_all(args.out_dir, args.seed)
    print(json.dumps({k: str(v) for k, v in paths.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
