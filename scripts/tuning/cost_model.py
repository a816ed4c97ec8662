#!/usr/bin/env python3
"""Cost model of DFlash speculation for a Laguna XS 2.1 pair on this CPU, at real widths.

    .venv/bin/python -m scripts.bench.bench_cost_model                 # build (once, cached), measure, predict
    .venv/bin/python -m scripts.bench.bench_cost_model --threads 1 --repeats 12 --png docs/results/cost-model/cost-model.png
    .venv/bin/python -m scripts.bench.bench_cost_model --from-json RUN.json --png out.png   # re-analyse only

What it builds (under ``$LAGUNA_DFLASH_CACHE/costmodel``, default ``~/.cache/laguna-dflash/costmodel``,
6.8 GB, plus 7.7 GB for a moment while the F16 file exists; skipped when present; the first build
takes about 7.5 minutes on 2 cores and is deterministic for a given ``--seed``):

* a random-weight Laguna target GGUF with XS 2.1's real widths (hidden 2048, vocabulary 100352,
  head_dim 128, 8 KV heads, 48 query heads on full-attention layers and 64 on sliding ones,
  window 512, a dense first layer of 8192, then 256 experts of 512 with top-8 sigmoid routing and
  a shared expert of 512, per-head softplus gate, partial RoPE on full layers) but 5 layers
  (full+dense, sliding, sliding, sliding, full+MoE) instead of 40. It is written in F16 with
  gguf-py, quantised to Q4_K_M with llama.cpp's own quantiser, and cut to a 2-layer variant by
  copying the quantised tensors of its first two layers. Both come twice: with the random router
  (``random`` routing: the rows of a pass pick experts independently, the most expert weights a
  multi-row pass can read) and with a selection bias that sends every token to the same 8 experts
  per layer (``shared`` routing: a verify pass reads no more expert weights than a decode step).
  A real model's routing lies between the two;
* a random drafter with the exact XS 2.1 DFlash shapes (``tests.helpers.synthetic.XS_2_1``), converted
  to Q8_0 against the 5-layer target by this project's converter. Its ``target_layer_ids`` are
  ``[0..4]`` (the real ones, ``[1, 13, 25, 33, 39]``, need 40 layers); no shape depends on them.

What it measures (one process, ``--threads`` (default: all cores), a KV cache holding ``--context``
tokens, ``--repeats`` interleaved repeats after ``--warmup`` untimed ones; see ``Bench``):

* ``T_L(n)``: one target pass of ``n`` rows (1 = a plain decode step, ``k+1`` = verifying ``k``
  drafts, logits on every row) for the 2- and 5-layer targets, both routings;
* ``t_draft(k)``: one drafter block pass over ``[bonus, MASK*k]`` (logits on the ``k`` proposals);
* ``t_inject(a)``: one drafter context injection of ``a+1`` rows (the bonus plus ``a`` accepted);
* the engine's rounds at each depth (``laguna_dflash.runtime.engine.Engine`` on the 5-layer pair): host
  overhead = a round's wall time minus the time spent inside ``llama_decode`` in it.

The 40-layer cost is extrapolated per row count as ``T40 = c + 39 m`` with ``m = (T5 − T2) / 3``
(one MoE layer: the three that the 5-layer target adds are two sliding and one full-attention
layer; the real model has 30 and 9) and ``c = T2 − m`` (embedding, head, output norm and the dense
first layer). Combined with a per-position acceptance model fitted to published numbers (SPEC §7),
it predicts the speed-up per depth:
``E[k] · (T40(1) + host0) / (t_draft(k) + T40(k+1) + E t_inject(a) + host(k))``.

With ``--ik-bench`` (ik_llama.cpp's ``llama-bench``) it also times ik's plain step on the same
target files in the same run: in every repeat, for each routing, before or after our passes (at
random), ``llama-bench -gp CONTEXT,1`` on the 2- and 5-layer targets (one generated token after a
``--context``-token prompt, so its KV cache holds what ours holds; ``--ik-args``, default
``-rtr 1``), extrapolated to 40 layers the same way. The prediction against it is ours in tokens
per second over ik's plain step: ``E[k] / round cost`` against ``1 / T40_ik(1)``.

Writes a JSON of everything (``--json``) and a chart (``--png``); prints the tables.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import platform
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402

from scripts.recorded import command_line, write_json

console = Console(width=None if sys.stdout.isatty() else 150)

# ----------------------------------------------------------------------------- the XS 2.1 shapes

HIDDEN = 2048
VOCAB = 100352
HEAD_DIM = 128
N_KV = 8
HEADS_FULL, HEADS_SWA = 48, 64
WINDOW = 512
FF_DENSE = 8192
N_EXPERT, N_USED, FF_EXP, FF_SHEXP = 256, 8, 512, 512
REAL_LAYERS = 40
#: 40 layers, period 4 with full attention first, layer 0 dense: 1 full+dense, 9 full+MoE, 30 sliding+MoE
REAL_MIX = {"c": 1, "s": 30, "f": 9}
REAL_MOE_LAYERS = REAL_MIX["s"] + REAL_MIX["f"]
N_LAYERS_BUILT = 5  # full+dense, swa, swa, swa, full+MoE
VARIANTS = (2, N_LAYERS_BUILT)  # the targets measured (1 and 4 MoE layers)
#: "random": the router and its selection bias are random, so a pass of n rows touches about
#: 256 (1 - (1 - 8/256)^n) distinct experts per layer (the upper bound of a real model's expert
#: traffic); "shared": the same target with a +8 selection bias on 8 experts per layer, so every
#: row picks those 8 (the lower bound: a verify pass reads no more expert weights than a decode step).
ROUTINGS = ("random", "shared")
DRAFTER_HOST = ("random", N_LAYERS_BUILT)  # the target the drafter and the engine run with
#: Q4_K_M puts ffn_down and attn_v of "use_more_bits" layers at Q6_K: in the real 40-layer file that is
#: layer 0 and 19 of the 39 MoE layers (15 of 30 sliding, 4 of 9 full). llama.cpp would pick by its
#: own formula for 5 layers, so we pin it: layer 0 is Q6_K like the real one, and of the three MoE
#: layers that T5 − T2 measures (2, 3 and 4) one is Q6_K (layer 2) and two are Q4_K (33% against 49%).
Q6_LAYERS = (0, 2)
BUILD_VERSION = "costmodel-v1"

DEPTHS = (1, 2, 4, 8, 15)  # the depths asked about (ik_llama.cpp's sweep; its 16 is our 15)
#: measured too: k + 1 = 4 and 8 rows, where llama.cpp's repacked CPU matmul runs whole 4-row GEMM
#: tiles (it takes rows in groups of 4 and the remainder one at a time)
MEASURED_DEPTHS = (1, 2, 3, 4, 7, 8, 15)
ROWS = (1, *(k + 1 for k in MEASURED_DEPTHS))  # target pass sizes: 1 = decode, k + 1 = verify k
INJECT_ACCEPTED = (0, 1, 2, 4, 8, 15)

#: ik_llama.cpp's measured CPU-target depth sweep (doubly-linked-list code, Q4_K_M target, Q8_0 draft)
IK_CPU = {1: 1.14, 2: 1.31, 4: 1.50, 8: 1.37, 16: 0.91}


def cache_root() -> Path:
    base = os.environ.get("LAGUNA_DFLASH_CACHE") or str(Path.home() / ".cache" / "laguna-dflash")
    return Path(base) / "costmodel"


def is_full(il: int) -> bool:
    return il % 4 == 0


def heads(il: int) -> int:
    return HEADS_FULL if is_full(il) else HEADS_SWA


# ----------------------------------------------------------------------------- tokenizer

def byte_level_alphabet() -> list[str]:
    """The 256 printable stand-ins GPT-2's byte-level BPE uses for bytes."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    extra = 0
    out = {}
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def synthetic_vocab(n_vocab: int) -> tuple[list[str], list[int], list[str]]:
    """Laguna-style specials at their fixed ids (MASK = 12), the 256 byte tokens, then merged pairs
    and triples of byte tokens with the merges that make them, up to exactly ``n_vocab`` tokens."""
    from tests.helpers.synthetic import SPECIAL_TOKENS
    from gguf import TokenType

    chars = byte_level_alphabet()
    tokens = list(SPECIAL_TOKENS) + chars
    types = [int(TokenType.CONTROL)] * len(SPECIAL_TOKENS) + [int(TokenType.NORMAL)] * 256
    merges: list[str] = []
    need = n_vocab - len(tokens)
    pairs = [(a, b) for a in chars for b in chars]
    for a, b in pairs[:need]:
        tokens.append(a + b)
        merges.append(f"{a} {b}")
    i = 0
    while len(tokens) < n_vocab:
        a, b = pairs[i // 256]
        c = chars[i % 256]
        tokens.append(a + b + c)
        merges.append(f"{a + b} {c}")
        i += 1
    types += [int(TokenType.NORMAL)] * (len(tokens) - len(types))
    assert len(tokens) == n_vocab == len(types) and len(set(tokens)) == n_vocab
    return tokens, types, merges


# ----------------------------------------------------------------------------- target GGUF (F16)

@dataclass(frozen=True)
class Planned:
    name: str
    shape: tuple[int, ...]  # numpy order (GGUF ne reversed)
    kind: str  # "norm", "bias", "router", "matrix"

    @property
    def dtype(self):
        return np.float16 if self.kind == "matrix" else np.float32

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize


def target_plan(n_layer: int) -> list[Planned]:
    p = [Planned("token_embd.weight", (VOCAB, HIDDEN), "matrix"),
         Planned("output.weight", (VOCAB, HIDDEN), "matrix")]
    for il in range(n_layer):
        b, nq = f"blk.{il}.", heads(il) * HEAD_DIM
        p += [Planned(b + "attn_norm.weight", (HIDDEN,), "norm"),
              Planned(b + "attn_q.weight", (nq, HIDDEN), "matrix"),
              Planned(b + "attn_k.weight", (N_KV * HEAD_DIM, HIDDEN), "matrix"),
              Planned(b + "attn_v.weight", (N_KV * HEAD_DIM, HIDDEN), "matrix"),
              Planned(b + "attn_output.weight", (HIDDEN, nq), "matrix"),
              Planned(b + "attn_q_norm.weight", (HEAD_DIM,), "norm"),
              Planned(b + "attn_k_norm.weight", (HEAD_DIM,), "norm"),
              Planned(b + "attn_gate.weight", (heads(il), HIDDEN), "matrix"),
              Planned(b + "ffn_norm.weight", (HIDDEN,), "norm")]
        if il == 0:
            p += [Planned(b + "ffn_gate.weight", (FF_DENSE, HIDDEN), "matrix"),
                  Planned(b + "ffn_up.weight", (FF_DENSE, HIDDEN), "matrix"),
                  Planned(b + "ffn_down.weight", (HIDDEN, FF_DENSE), "matrix")]
        else:
            p += [Planned(b + "ffn_gate_inp.weight", (N_EXPERT, HIDDEN), "router"),
                  Planned(b + "exp_probs_b.bias", (N_EXPERT,), "bias"),
                  Planned(b + "ffn_gate_exps.weight", (N_EXPERT, FF_EXP, HIDDEN), "matrix"),
                  Planned(b + "ffn_up_exps.weight", (N_EXPERT, FF_EXP, HIDDEN), "matrix"),
                  Planned(b + "ffn_down_exps.weight", (N_EXPERT, HIDDEN, FF_EXP), "matrix"),
                  Planned(b + "ffn_gate_shexp.weight", (FF_SHEXP, HIDDEN), "matrix"),
                  Planned(b + "ffn_up_shexp.weight", (FF_SHEXP, HIDDEN), "matrix"),
                  Planned(b + "ffn_down_shexp.weight", (HIDDEN, FF_SHEXP), "matrix")]
    p.append(Planned("output_norm.weight", (HIDDEN,), "norm"))
    return p


class Pools:
    """Random matrices at N(0, 1/fan_in), cut as random windows of one pre-drawn F16 pool per fan-in.

    Drawing ~4 billion fresh normals takes minutes on two busy cores; windows of a 24M-value pool
    are as good for timing (the kernels' cost does not depend on the values) and nothing overflows.
    Router weights and biases are drawn fresh, so expert selection is a genuine random routing.
    """

    POOL = 24 << 20

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        base = self.rng.standard_normal(self.POOL, dtype=np.float32)
        self.base = base
        self.pools: dict[int, np.ndarray] = {}

    def pool(self, fan_in: int) -> np.ndarray:
        if fan_in not in self.pools:
            self.pools[fan_in] = (self.base / np.float32(fan_in ** 0.5)).astype(np.float16)
        return self.pools[fan_in]

    def make(self, t: Planned) -> np.ndarray:
        if t.kind == "norm":
            return np.ones(t.shape, dtype=np.float32)
        if t.kind == "bias":
            return (0.05 * self.rng.standard_normal(t.shape, dtype=np.float32)).astype(np.float32)
        if t.kind == "router":
            return (self.rng.standard_normal(t.shape, dtype=np.float32) / np.float32(t.shape[-1] ** 0.5))
        pool = self.pool(t.shape[-1])
        out = np.empty(int(np.prod(t.shape)), dtype=np.float16)
        step = self.POOL // 2
        for i0 in range(0, out.size, step):
            n = min(step, out.size - i0)
            off = int(self.rng.integers(0, self.POOL - n))
            out[i0:i0 + n] = pool[off:off + n]
        return out.reshape(t.shape)


def write_target_f16(path: Path, n_layer: int, seed: int, on_tensor=None) -> None:
    from gguf import GGUFValueType as T, GGUFWriter

    tokens, types, merges = synthetic_vocab(VOCAB)
    a = "laguna"
    w = GGUFWriter(path, a)
    kv = [
        ("general.type", "model", T.STRING),
        ("general.name", f"Laguna XS 2.1 shapes, random, {n_layer} layers", T.STRING),
        (f"{a}.block_count", n_layer, T.UINT32),
        (f"{a}.context_length", 131072, T.UINT32),
        (f"{a}.embedding_length", HIDDEN, T.UINT32),
        (f"{a}.feed_forward_length", FF_DENSE, T.UINT32),
        (f"{a}.attention.head_count", [heads(i) for i in range(n_layer)], T.ARRAY, T.INT32),
        (f"{a}.attention.head_count_kv", N_KV, T.UINT32),
        (f"{a}.rope.freq_base", 500000.0, T.FLOAT32),
        (f"{a}.rope.freq_base_swa", 10000.0, T.FLOAT32),
        (f"{a}.attention.layer_norm_rms_epsilon", 1e-6, T.FLOAT32),
        (f"{a}.expert_count", N_EXPERT, T.UINT32),
        (f"{a}.expert_used_count", N_USED, T.UINT32),
        (f"{a}.attention.key_length", HEAD_DIM, T.UINT32),
        (f"{a}.attention.value_length", HEAD_DIM, T.UINT32),
        ("general.file_type", 1, T.UINT32),  # mostly F16
        (f"{a}.vocab_size", VOCAB, T.UINT32),
        (f"{a}.attention.sliding_window", WINDOW, T.UINT32),
        (f"{a}.expert_feed_forward_length", FF_EXP, T.UINT32),
        (f"{a}.expert_shared_feed_forward_length", FF_SHEXP, T.UINT32),
        (f"{a}.expert_weights_norm", True, T.BOOL),
        (f"{a}.expert_weights_scale", 1.0, T.FLOAT32),
        (f"{a}.expert_gating_func", 2, T.UINT32),  # sigmoid
        (f"{a}.leading_dense_block_count", 1, T.UINT32),
        (f"{a}.rope.dimension_count", HEAD_DIM // 2, T.UINT32),  # partial rotary 0.5 on full layers
        (f"{a}.rope.dimension_count_swa", HEAD_DIM, T.UINT32),
        ("general.quantization_version", 2, T.UINT32),
        ("tokenizer.ggml.model", "gpt2", T.STRING),
        ("tokenizer.ggml.pre", "gpt-2", T.STRING),
        ("tokenizer.ggml.tokens", tokens, T.ARRAY, T.STRING),
        ("tokenizer.ggml.token_type", types, T.ARRAY, T.INT32),
        ("tokenizer.ggml.merges", merges, T.ARRAY, T.STRING),
        ("tokenizer.ggml.bos_token_id", 2, T.UINT32),
        ("tokenizer.ggml.eos_token_id", 2, T.UINT32),
        ("tokenizer.ggml.unknown_token_id", 1, T.UINT32),
        ("tokenizer.ggml.padding_token_id", 0, T.UINT32),
        ("tokenizer.ggml.mask_token_id", 12, T.UINT32),
        ("tokenizer.ggml.eot_token_id", 13, T.UINT32),
        ("tokenizer.ggml.add_bos_token", False, T.BOOL),
    ]
    for key, val, typ, *sub in kv:
        w.add_key_value(key, val, typ, sub[0] if sub else None)
    plan = target_plan(n_layer)
    for t in plan:
        w.add_tensor_info(t.name, t.shape, np.dtype(t.dtype), t.nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    pools = Pools(seed)
    for t in plan:
        w.write_tensor_data(pools.make(t))
        if on_tensor:
            on_tensor(t)
    w.close()


def quantize_q4_k_m(src: Path, dst: Path, n_threads: int) -> None:
    """llama.cpp's Q4_K_M mix, with ffn_down/attn_v of each layer pinned (see Q6_LAYERS)."""
    import llama_cpp.llama_cpp as ll

    from laguna_dflash.runtime.llama import _init_backend

    _init_backend()
    params = ll.llama_model_quantize_default_params()
    params.ftype = ll.LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.nthread = n_threads
    q6 = "|".join(str(i) for i in Q6_LAYERS)
    q4 = "|".join(str(i) for i in range(N_LAYERS_BUILT) if i not in Q6_LAYERS)
    patterns = [(rf"^blk\.({q6})\.(ffn_down|attn_v)", ll.GGML_TYPE_Q6_K),
                (rf"^blk\.({q4})\.(ffn_down|attn_v)", ll.GGML_TYPE_Q4_K)]
    keep = [p.encode() for p, _ in patterns]  # the C side keeps pointers into these
    arr = (ll.llama_model_tensor_override * (len(patterns) + 1))()
    for i, (p, (_, ty)) in enumerate(zip(keep, patterns)):
        arr[i].pattern = p
        arr[i].type = ty
    arr[len(patterns)].pattern = None
    params.tt_overrides = ctypes.cast(arr, ctypes.POINTER(ll.llama_model_tensor_override))
    tmp = dst.with_name(dst.name + ".partial")
    rc = ll.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama_model_quantize failed ({rc}) on {src}")
    os.replace(tmp, dst)


def cut_layers(src: Path, dst: Path, n_layer: int, shared_routing: bool = False, seed: int = 0) -> None:
    """A copy of a quantised target that keeps only its first ``n_layer`` blocks (raw tensor bytes);
    with ``shared_routing`` each layer's expert selection bias sends every token to the same 8 experts."""
    from gguf import GGUFReader, GGUFValueType as T, GGUFWriter

    from laguna_dflash.convert.target import field_kv

    r = GGUFReader(src, "r")
    arch = "laguna"
    tmp = dst.with_name(dst.name + ".partial")
    w = GGUFWriter(tmp, arch)
    for key in r.fields:
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        kv = field_kv(r, key)
        if key == f"{arch}.block_count":
            w.add_key_value(key, n_layer, T.UINT32)
        elif key == f"{arch}.attention.head_count":
            w.add_key_value(key, kv.value[:n_layer], kv.type, kv.sub_type)
        elif key == "general.name":
            w.add_key_value(key, f"Laguna XS 2.1 shapes, random, {n_layer} layers"
                            + (", shared routing" if shared_routing else ""), T.STRING)
        else:
            w.add_key_value(key, kv.value, kv.type, kv.sub_type)
    keep = []
    for t in r.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n_layer:
            continue
        keep.append(t)
        w.add_tensor_info(t.name, tuple(int(x) for x in reversed(t.shape)), np.dtype(np.float32),
                          int(t.n_bytes), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed + 17)
    for t in keep:
        data = t.data
        if shared_routing and t.name.endswith(".exp_probs_b.bias"):
            data = np.zeros(N_EXPERT, dtype=np.float32)
            data[rng.choice(N_EXPERT, N_USED, replace=False)] = 8.0  # sigmoid scores are < 1: always chosen
        w.write_tensor_data(data)
    w.close()
    os.replace(tmp, dst)


@dataclass
class Artifacts:
    targets: dict[tuple[str, int], Path]  # (routing, layers) -> GGUF
    drafter: Path


def build(root: Path, seed: int, n_threads: int, force: bool) -> Artifacts:
    from laguna_dflash.convert.converter import convert
    from laguna_dflash.convert.quantize import OutType
    from tests.helpers.synthetic import XS_2_1, write_drafter
    from laguna_dflash.convert.target import read_target

    root.mkdir(parents=True, exist_ok=True)
    stamp = hashlib.sha256(f"{BUILD_VERSION}:{seed}".encode()).hexdigest()[:10]
    work = root / stamp
    targets = {(r, n): work / f"laguna-xs-shapes-L{n}-Q4_K_M{'-shared-routing' if r == 'shared' else ''}.gguf"
               for r in ROUTINGS for n in VARIANTS}
    drafter = work / "laguna-xs-dflash-random-Q8_0.gguf"
    if force and work.exists():
        shutil.rmtree(work)
    if all(p.exists() for p in targets.values()) and drafter.exists():
        return Artifacts(targets, drafter)
    work.mkdir(parents=True, exist_ok=True)
    full = targets[("random", N_LAYERS_BUILT)]
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console) as prog:
        if not full.exists():
            f16 = work / f"laguna-xs-shapes-L{N_LAYERS_BUILT}-F16.gguf"
            plan = target_plan(N_LAYERS_BUILT)
            task = prog.add_task(f"writing the F16 target ({sum(t.nbytes for t in plan) / 1e9:.1f} GB)", total=len(plan))
            write_target_f16(f16, N_LAYERS_BUILT, seed, on_tensor=lambda _t: prog.advance(task))
            task = prog.add_task("llama_model_quantize → Q4_K_M (minutes on 2 cores)", total=1)
            quantize_q4_k_m(f16, full, n_threads)
            prog.advance(task)
            f16.unlink()
        for (r, n), path in targets.items():
            if not path.exists():
                task = prog.add_task(f"cutting the {n}-layer target ({r} routing)", total=1)
                cut_layers(full, path, n, shared_routing=r == "shared", seed=seed)
                prog.advance(task)
        if not drafter.exists():
            task = prog.add_task("random XS 2.1 drafter (bf16) → Q8_0", total=2)
            with tempfile.TemporaryDirectory(dir=work) as tmp:
                ckpt = Path(tmp) / "drafter"
                shapes = {**XS_2_1, "num_target_layers": N_LAYERS_BUILT,
                          "target_layer_ids": tuple(range(N_LAYERS_BUILT))}
                write_drafter(ckpt, **shapes, dtype="bf16", seed=seed, name_or_path="random/Laguna-XS-2.1-DFlash-shapes")
                prog.advance(task)
                convert(ckpt, read_target(full), drafter, OutType.Q8_0)
                prog.advance(task)
    return Artifacts(targets, drafter)


# ----------------------------------------------------------------------------- measurement

def machine_info() -> dict:
    from laguna_dflash.runtime.cores import cpu_facts

    cpu = cpu_facts()["model"]
    mem = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu": cpu, "mem_total_gib": round(mem / 2**30, 1),
            "python": platform.python_version(), "loadavg_start": list(os.getloadavg())}


def median(xs) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


class Bench:
    """Paired, interleaved timing.

    A repeat visits the two routings in a random order. For one routing both its targets (2 and 5
    layers) are loaded at once (about 5.5 GB with llama.cpp's repacked weight copies; the 4-layer
    one too would pass 8 GB), with the ``context``-token prompt in their KV caches (restored from a
    saved state after the first load), and with the random routing also the drafter. Then every
    item runs once, in a random order. An item is a tight group of passes, timed one by one and
    also as a ratio within the group (whose spread over the repeats shows how far the machine's
    load moved the estimate; the estimate itself is the ratio of the passes' medians):

    * ``verify k``: a decode step and a ``k+1``-row pass on both targets (4 passes, shuffled):
      one sample of ``T40(k+1) / T40(1)``;
    * ``draft k`` / ``inject a``: a decode step on both targets and one drafter pass: one sample of
      ``t_draft(k) / T40(1)`` or ``t_inject(a) / T40(1)``.

    Every pass's own time is recorded too (for the absolute table).
    """

    def __init__(self, art: Artifacts, args) -> None:
        self.args = args
        self.art = art
        self.P = args.context
        self.threads = args.threads or os.cpu_count() or 1
        self.n_ctx = self.P + 160
        self.rng = np.random.default_rng(1)
        self.prompt = self.rng.integers(300, VOCAB, self.P).tolist()
        self.width = N_LAYERS_BUILT * HIDDEN  # one captured layer per target layer id
        self.context_feats = self.rng.standard_normal((self.P, self.width), dtype=np.float32)
        self.feats = self.rng.standard_normal((16, self.width), dtype=np.float32)
        self.states: dict[str, bytes] = {}
        self.t_prefill: dict[str, float] = {}
        self.samples: dict[str, list[float]] = {}
        self.models: dict[int, object] = {}
        self.ctxs: dict[int, object] = {}
        self.drafter = None
        self.record = False
        self.peer = str(args.ik_bench) if getattr(args, "ik_bench", None) else None
        self.peer_build: str | None = None
        self.loadavg: list[list[float]] = []

    # -- loading

    @staticmethod
    def _save(ctx) -> bytes:
        import llama_cpp.llama_cpp as ll

        size = ll.llama_state_seq_get_size(ctx.ptr, 0)
        buf = (ctypes.c_ubyte * size)()
        n = ll.llama_state_seq_get_data(ctx.ptr, buf, size, 0)
        return bytes(buf[:n])

    @staticmethod
    def _restore(ctx, state: bytes) -> bool:
        import llama_cpp.llama_cpp as ll

        buf = (ctypes.c_ubyte * len(state)).from_buffer_copy(state)
        return ll.llama_state_seq_set_data(ctx.ptr, buf, len(state), 0) == len(state)

    def open(self, routing: str) -> None:
        from laguna_dflash.runtime.drafter import Drafter
        from laguna_dflash.runtime.llama import Context, ContextParams, Model

        for n in VARIANTS:
            model = Model(self.art.targets[(routing, n)])
            ctx = Context(model, ContextParams(n_ctx=self.n_ctx, n_batch=self.args.n_batch,
                                               n_ubatch=self.args.n_batch, n_threads=self.threads))
            self.models[n], self.ctxs[n] = model, ctx
            key = f"target:{routing}:{n}"
            if key not in self.states or not self._restore(ctx, self.states[key]):
                ctx.clear()
                t0 = time.perf_counter()
                for i0 in range(0, self.P, self.args.n_batch):
                    chunk = self.prompt[i0:i0 + self.args.n_batch]
                    ctx.decode(chunk, np.arange(i0, i0 + len(chunk)), logits="last")
                self.t_prefill[key] = time.perf_counter() - t0
                self.states[key] = self._save(ctx)
            # untimed: touch what the timed passes will use
            for rows in (ROWS[-1], 1):
                ctx.decode(self.rng.integers(300, VOCAB, rows), np.arange(self.P, self.P + rows), logits="all")
                ctx.seq_rm(self.P, -1)
        if routing == DRAFTER_HOST[0]:
            self.drafter = Drafter(self.art.drafter, self.ctxs[DRAFTER_HOST[1]], n_threads=self.threads,
                                   n_batch=self.args.n_batch)
            self.mask = self.drafter.spec.mask_token_id
            if "drafter" not in self.states or not self._restore(self.drafter.ctx, self.states["drafter"]):
                self.drafter.ctx.clear()
                self.drafter.n_context = 0
                self.drafter.inject(self.context_feats, 0)
                self.states["drafter"] = self._save(self.drafter.ctx)
            self.drafter.n_context = self.P
            for k in (MEASURED_DEPTHS[-1], 1):
                self.time_draft(k)

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.close()
            self.drafter = None
        for d in (self.ctxs, self.models):
            for obj in d.values():
                obj.close()
            d.clear()

    # -- single timed passes

    def _add(self, key: str, value: float) -> None:
        if self.record:
            self.samples.setdefault(key, []).append(value)

    def time_target(self, routing: str, n: int, rows: int) -> float:
        ctx = self.ctxs[n]
        toks = self.rng.integers(300, VOCAB, rows)
        t0 = time.perf_counter()
        ctx.decode(toks, np.arange(self.P, self.P + rows), logits="all" if rows > 1 else "last")
        dt = time.perf_counter() - t0
        ctx.seq_rm(self.P, -1)
        self._add(f"target:{routing}:{n}:{rows}", dt)
        return dt

    def time_draft(self, k: int) -> float:
        block = [int(self.rng.integers(300, VOCAB))] + [self.mask] * k
        rows = np.ones(k + 1, dtype=bool)
        rows[0] = False  # row 0 re-predicts the bonus; only the k proposals need logits
        t0 = time.perf_counter()
        self.drafter.ctx.decode(block, np.arange(self.P, self.P + k + 1), logits=rows)
        dt = time.perf_counter() - t0
        self.drafter.ctx.seq_rm(self.P, -1)
        return dt

    def time_inject(self, a: int) -> float:
        t0 = time.perf_counter()
        self.drafter.ctx.decode_embd(self.feats[:a + 1], np.arange(self.P, self.P + a + 1))
        dt = time.perf_counter() - t0
        self.drafter.ctx.seq_rm(self.P, -1)
        return dt

    def time_peer(self, routing: str) -> float:
        """ik_llama.cpp's plain step on this routing's 2- and 5-layer targets (one llama-bench run,
        the files in a random order); returns its 40-layer extrapolation from the run's medians."""
        paths = {n: str(self.art.targets[(routing, n)]) for n in VARIANTS}
        order = list(VARIANTS)
        random.shuffle(order)
        cmd = peer_command(self.peer, [paths[n] for n in order], self.threads, self.args.ik_reps,
                           self.P, shlex.split(self.args.ik_args))
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{shlex.join(cmd)} failed:\n{r.stderr[-2000:]}")
        report = json.loads(r.stdout)
        steps = peer_step_samples(report)
        self.peer_build = report[0].get("build_commit", self.peer_build)
        for n in VARIANTS:
            for x in steps[paths[n]]:
                self._add(f"peer:{routing}:{n}", x)
        return extrapolate(*(median(steps[paths[n]]) for n in VARIANTS))["t40"]

    # -- items

    def items(self, routing: str) -> list[tuple]:
        its = [("verify", k) for k in MEASURED_DEPTHS]
        if routing == DRAFTER_HOST[0]:
            its += [("draft", k) for k in MEASURED_DEPTHS] + [("inject", a) for a in INJECT_ACCEPTED]
        return its

    def n_items(self) -> int:
        """Progress steps per repeat: our items, and one peer run per routing."""
        return sum(len(self.items(r)) for r in ROUTINGS) + (len(ROUTINGS) if self.peer else 0)

    def run_item(self, routing: str, item: tuple) -> None:
        what, k = item
        passes = [(n, 1) for n in VARIANTS]
        if what == "verify":
            passes += [(n, k + 1) for n in VARIANTS]
        else:
            passes.append(("drafter", k))
        random.shuffle(passes)
        t: dict[tuple, float] = {}
        for n, rows in passes:
            if n != "drafter":
                t[(n, rows)] = self.time_target(routing, n, rows)
            elif what == "draft":
                t[("drafter", k)] = self.time_draft(k)
            else:
                t[("drafter", k)] = self.time_inject(k)
        dec = extrapolate(*(t[(n, 1)] for n in VARIANTS))["t40"]
        self._add(f"decode40:{routing}", dec)
        if what == "verify":
            self._add(f"ratio:verify:{routing}:{k}", extrapolate(*(t[(n, k + 1)] for n in VARIANTS))["t40"] / dec)
        else:
            self._add(f"{what}:{k}", t[("drafter", k)])
            self._add(f"ratio:{what}:{k}", t[("drafter", k)] / dec)

    def repeat(self, record: bool, engine: bool, on_done=None, on_phase=None) -> None:
        self.record = record
        routings = list(ROUTINGS)
        random.shuffle(routings)
        for routing in routings:
            # the peer runs while none of our models is loaded, before or after our passes
            peer_first = bool(self.peer) and random.random() < 0.5
            if peer_first:
                peer_t40 = self.peer_step(routing, on_done, on_phase)
            ours_from = len(self.samples.get(f"decode40:{routing}", []))
            if on_phase:
                on_phase(f"{routing} routing")
            self.open(routing)
            try:
                order = self.items(routing)
                random.shuffle(order)
                for item in order:
                    self.run_item(routing, item)
                    if on_done:
                        on_done()
                if engine and routing == DRAFTER_HOST[0]:
                    if on_phase:
                        on_phase("engine rounds (5-layer pair)")
                    self.drafter.close()  # the engine brings its own target and drafter contexts
                    self.drafter = None
                    for n in VARIANTS:
                        self.ctxs.pop(n).close()
                    self.models.pop(VARIANTS[0]).close()
                    self.engine_pass(self.models[N_LAYERS_BUILT], on_done)
            finally:
                self.close()
            if self.peer and not peer_first:
                peer_t40 = self.peer_step(routing, on_done, on_phase)
            if self.peer and record:  # this repeat's plain steps, ours over the peer's, side by side
                ours = median(self.samples[f"decode40:{routing}"][ours_from:])
                self._add(f"peer_decode40:{routing}", peer_t40)
                self._add(f"ratio:decode_over_peer:{routing}", ours / peer_t40)
        self.loadavg.append(list(os.getloadavg()))

    def peer_step(self, routing: str, on_done=None, on_phase=None) -> float:
        if on_phase:
            on_phase(f"ik_llama.cpp, {routing} routing")
        t40 = self.time_peer(routing)
        if on_done:
            on_done()
        return t40

    # -- the engine: host overhead per round

    def engine_pass(self, model, on_done=None) -> None:
        """One generate() per depth with the 5-layer pair. A round's wall time is the time
        between consecutive round traces (a whole loop iteration); its host overhead is that minus
        the time spent inside llama_decode (target and drafter) in the same interval. Only rounds
        that ran at the asked depth are kept."""
        from laguna_dflash.runtime import llama as rl
        from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions

        in_decode = [0.0]
        plain_run = rl.Context._run

        def timed_run(ctx, batch, n):
            t0 = time.perf_counter()
            try:
                plain_run(ctx, batch, n)
            finally:
                in_decode[0] += time.perf_counter() - t0

        rl.Context._run = timed_run
        eng = Engine(model, self.art.drafter, EngineConfig(n_ctx=self.n_ctx, n_batch=self.args.n_batch,
                                                           n_ubatch=self.args.n_batch, n_threads=self.threads))
        try:
            depths = [0, *DEPTHS]
            random.shuffle(depths)
            for k in depths:
                stamps: list[tuple[float, float, int, int]] = []

                def trace(ev, stamps=stamps):
                    stamps.append((time.perf_counter(), in_decode[0], ev["depth"], ev["accepted"]))

                n_predict = self.args.engine_rounds + k + 2
                eng.generate(self.prompt, GenerateOptions(n_predict=n_predict, n_max=k, trace=trace))
                for (t0, d0, _, _), (t1, d1, depth, acc) in zip(stamps, stamps[1:]):
                    if depth == k:
                        self.samples.setdefault(f"round:{k}", []).append(t1 - t0)
                        self.samples.setdefault(f"host:{k}", []).append((t1 - t0) - (d1 - d0))
                        self.samples.setdefault(f"accepted:{k}", []).append(float(acc))
                if on_done:
                    on_done()
        finally:
            rl.Context._run = plain_run
            eng.drafter.close()
            eng.drafter = None
            eng.ctx.close()


# ----------------------------------------------------------------------------- acceptance models

def cumulative(a: list[float], k: int) -> list[float]:
    """P_i = probability that the first i drafts are all accepted, i = 1..k."""
    out, p = [], 1.0
    for i in range(k):
        p *= a[i]
        out.append(p)
    return out


def expected_tokens(a: list[float], k: int) -> float:
    return 1.0 + sum(cumulative(a, k))


def accepted_distribution(a: list[float], k: int) -> list[float]:
    """Probability of accepting exactly j drafts, j = 0..k."""
    P = [1.0] + cumulative(a, k)
    return [P[j] - (P[j + 1] if j < k else 0.0) for j in range(k + 1)]


def fit_constant(target_acc: float, k: int = 15) -> float:
    """p such that a geometric acceptance a_j = p accepts ``target_acc`` drafts per round at depth k."""
    lo, hi = 0.0, 0.999999
    for _ in range(100):
        mid = (lo + hi) / 2
        if expected_tokens([mid] * k, k) - 1 < target_acc:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def acceptance_models() -> dict[str, dict]:
    head = [0.88, 1.00, 0.75, 0.62]  # mlxcel: per-position accuracy along the reference path, code

    def err(r):  # mlxcel on code: 3.33 accepted at block 8 (7 drafts), 3.55 at block 16 (15 drafts)
        a = head + [r] * 11
        return (expected_tokens(a, 7) - 1 - 3.33) ** 2 + (expected_tokens(a, 15) - 1 - 3.55) ** 2

    r = min((i / 1000 for i in range(1, 1000)), key=err)
    lo, hi = fit_constant(2.6), fit_constant(3.9)
    models = {
        "code (mlxcel fit)": {"a": head + [r] * 11,
                              "rule": f"a = 0.88, 1.00, 0.75, 0.62, then {r:.3f} per position "
                                      "(tail fitted to 3.33 accepted at 7 drafts and 3.55 at 15)"},
        "code, low": {"a": [lo] * 15, "rule": f"geometric a = {lo:.3f} (2.6 accepted per round at 15 drafts)"},
        "code, high": {"a": [hi] * 15, "rule": f"geometric a = {hi:.3f} (3.9 accepted per round at 15 drafts)"},
        "think / prose-like": {"a": [0.88, 0.50, 0.25] + [0.25] * 12,
                               "rule": "a = 0.88, 0.50, 0.25, then 0.25 (mlxcel inside <think>: 1.1-1.8 accepted)"},
    }
    for m in models.values():
        m["accepted_per_round"] = {k: round(expected_tokens(m["a"], k) - 1, 3) for k in range(1, 16)}
    return models


# ----------------------------------------------------------------------------- analysis

def interp(xs: list[float], ys: list[float], x: float) -> float:
    return float(np.interp(x, xs, ys))


def extrapolate(t2: float, t5: float) -> dict[str, float]:
    """One MoE layer m = (T5 - T2) / 3 (the 5-layer target has 3 more: two sliding, one full);
    c = T2 - m is the embedding, head, output norm and dense first layer; 40 layers = c + 39 m."""
    m = (t5 - t2) / 3
    c = t2 - m
    return {"c": c, "m": m, "t40": c + REAL_MOE_LAYERS * m}


def peer_command(binary: str, models: list[str], threads: int, reps: int, context: int,
                 extra: list[str]) -> list[str]:
    """llama-bench timing a plain step of each model: one token generated after a ``context``-token
    prompt (``-gp``: only the generated token is timed), or a one-token prompt at an empty cache
    for ``context`` 0."""
    test = ["-p", "0", "-n", "0", "-gp", f"{context},1"] if context else ["-p", "1", "-n", "0"]
    return [binary, *(a for m in models for a in ("-m", m)), *test, "-t", str(threads), "-r", str(reps),
            "-o", "json", *extra]


def peer_step_samples(report: list[dict]) -> dict[str, list[float]]:
    """Seconds per plain step by model file, from llama-bench's JSON report."""
    out: dict[str, list[float]] = {}
    for test in report:
        steps = int(test.get("n_gen") or 0) or int(test["n_prompt"])
        if steps != 1:
            raise ValueError(f"{test['model_filename']}: a test of {steps} tokens, not one plain step")
        out.setdefault(test["model_filename"], []).extend(ns / 1e9 for ns in test["samples_ns"])
    return out


def versus_peer(tokens_per_round: float, cost_over_decode: float, decode_over_peer: float) -> float:
    """Our tokens per second over the peer's plain decoding: ``tokens_per_round`` per round of
    ``cost_over_decode`` of our decode steps, each ``decode_over_peer`` of the peer's step."""
    return tokens_per_round / (cost_over_decode * decode_over_peer)


def iqr(xs) -> list[float]:
    return [float(np.percentile(xs, 25)), float(np.percentile(xs, 75))] if len(xs) else [float("nan")] * 2


def analyse(samples: dict[str, list[float]]) -> dict:
    """Medians of the timed repeats (warm-up repeats are not recorded), and the derived model."""
    med = {k: median(v) for k, v in samples.items()}
    inj_rows = [a + 1 for a in INJECT_ACCEPTED]
    draft = {k: med[f"draft:{k}"] for k in MEASURED_DEPTHS}
    inject = {a: med[f"inject:{a}"] for a in INJECT_ACCEPTED}

    host = {}
    for k in (0, *DEPTHS):
        if f"host:{k}" in med:
            host[k] = {"round": med[f"round:{k}"], "host": med[f"host:{k}"],
                       "accepted": med.get(f"accepted:{k}", 0.0)}
    host_depths = sorted(d for d in host if d > 0)
    host0 = host[0]["host"] if 0 in host else 0.0

    def host_at(k):
        return interp(host_depths, [host[d]["host"] for d in host_depths], k) if host_depths else 0.0

    models = acceptance_models()
    out: dict = {"routing": {}, "acceptance_models": {k: {"a": v["a"], "rule": v["rule"]} for k, v in models.items()},
                 "host": host, "draft_s": draft, "inject_s": inject,
                 "n_verify_samples": min(len(v) for k, v in samples.items() if k.startswith("ratio:verify"))}
    for routing in ROUTINGS:
        def T(n, rows, routing=routing):
            return med[f"target:{routing}:{n}:{rows}"]

        layers = {rows: extrapolate(T(2, rows), T(5, rows)) for rows in ROWS}
        # Ratios of medians: every pass's median over the repeats (the decode step has a sample in
        # every item, the others one per repeat), then the extrapolation. The per-item paired ratios
        # only give the spread (IQR): each of them extrapolates single passes, which multiplies a
        # pass's noise by about 13, so their median is a noisier estimate than the ratio of medians.
        dec = layers[1]["t40"]
        d_ratio = {k: draft[k] / dec for k in MEASURED_DEPTHS}
        i_ratio = {a: inject[a] / dec for a in INJECT_ACCEPTED}
        v_ratio = {rows: layers[rows]["t40"] / dec for rows in ROWS}
        v_rows = sorted(v_ratio)

        def verify_r(k, v_ratio=v_ratio, v_rows=v_rows):  # k drafts = k + 1 rows, interpolated between measured
            return interp(v_rows, [v_ratio[r] for r in v_rows], k + 1)

        def draft_r(k, d_ratio=d_ratio):
            return interp(list(MEASURED_DEPTHS), [d_ratio[d] for d in MEASURED_DEPTHS], k)

        def inject_r(a, i_ratio=i_ratio):
            return interp(inj_rows, [i_ratio[x] for x in INJECT_ACCEPTED], a + 1)

        h0 = host0 / dec
        predictions = {}
        for name, m in models.items():
            a = m["a"]
            by_depth = {}
            for k in range(1, 16):
                dist = accepted_distribution(a, k)
                compute = draft_r(k) + verify_r(k) + sum(p * inject_r(j) for j, p in enumerate(dist))
                cost = compute + host_at(k) / dec
                e = expected_tokens(a, k)
                by_depth[k] = {"tokens_per_round": e, "cost_over_decode": cost,
                               "speedup": e * (1 + h0) / cost, "speedup_no_host": e / compute}
                if k in MEASURED_DEPTHS:  # the verify ratio's IQR over the repeats, carried through
                    lo, hi = iqr(samples[f"ratio:verify:{routing}:{k}"])
                    by_depth[k]["speedup_iqr"] = [e * (1 + h0) / (cost - verify_r(k) + v) for v in (hi, lo)]
            predictions[name] = by_depth

        implied = {}  # the tokens per round ik_llama.cpp's CPU speed-ups would need under these costs
        for n_max, sp in IK_CPU.items():
            k = min(n_max, 15)
            cost = draft_r(k) + verify_r(k) + inject_r(k / 2) + host_at(k) / dec
            implied[n_max] = sp * cost / (1 + h0)

        out["routing"][routing] = {
            "per_layer_s": layers,
            "t40_s": {rows: layers[rows]["t40"] for rows in ROWS},
            "decode40_ms": 1e3 * dec,
            "decode40_iqr_ms": [1e3 * x for x in iqr(samples[f"decode40:{routing}"])],  # paired items
            "verify_over_decode": {k: v_ratio[k + 1] for k in MEASURED_DEPTHS},
            "verify_iqr": {k: iqr(samples[f"ratio:verify:{routing}:{k}"]) for k in MEASURED_DEPTHS},  # paired items
            "draft_iqr": {k: iqr(samples.get(f"ratio:draft:{k}", [])) for k in MEASURED_DEPTHS},
            "verify_over_decode_L5_direct": {k: T(N_LAYERS_BUILT, k + 1) / T(N_LAYERS_BUILT, 1)
                                             for k in MEASURED_DEPTHS},
            "draft_over_decode": d_ratio,
            "inject_over_decode": i_ratio,
            "host_over_decode": {k: v["host"] / dec for k, v in host.items()},
            "predictions": predictions,
            "ik_tokens_per_round_needed": implied,
        }
        if f"peer:{routing}:{N_LAYERS_BUILT}" in med:
            out["routing"][routing]["peer"] = against_peer(samples, routing, dec, h0, predictions)
    return out


def against_peer(samples: dict[str, list[float]], routing: str, dec: float, h0: float, predictions: dict) -> dict:
    """Our predicted tokens per second over the peer's plain decoding, per acceptance model and
    depth (0: our plain decoding); the spread carries the IQR of the per-repeat ratio of the two
    plain steps (ours: the median of the repeat's items; the peer's: its run in that repeat)."""
    med = {k: median(v) for k, v in samples.items()}
    peer = extrapolate(*(med[f"peer:{routing}:{n}"] for n in VARIANTS))
    r = dec / peer["t40"]
    lo, hi = iqr(samples.get(f"ratio:decode_over_peer:{routing}", []))
    x_peer = {}
    for name, by_depth in predictions.items():
        row = {0: {"x_peer": versus_peer(1.0, 1 + h0, r),
                   "x_peer_iqr": [versus_peer(1.0, 1 + h0, q) for q in (hi, lo)]}}
        for k, p in by_depth.items():
            row[k] = {"x_peer": versus_peer(p["tokens_per_round"], p["cost_over_decode"], r),
                      "x_peer_iqr": [versus_peer(p["tokens_per_round"], p["cost_over_decode"], q) for q in (hi, lo)],
                      "tokens_per_s": p["tokens_per_round"] / (p["cost_over_decode"] * dec)}
        x_peer[name] = row
    return {
        "per_layer_s": peer,
        "decode40_ms": 1e3 * peer["t40"],
        "decode40_iqr_ms": [1e3 * x for x in iqr(samples.get(f"peer_decode40:{routing}", []))],
        "tokens_per_s": 1 / peer["t40"],
        "ours_plain_tokens_per_s": 1 / (dec * (1 + h0)),
        "decode_over_peer": r,
        "decode_over_peer_iqr": [lo, hi],
        "L5_one_row_ms": {"ours": 1e3 * med[f"target:{routing}:{N_LAYERS_BUILT}:1"],
                          "peer": 1e3 * med[f"peer:{routing}:{N_LAYERS_BUILT}"]},
        "L2_one_row_ms": {"ours": 1e3 * med[f"target:{routing}:{VARIANTS[0]}:1"],
                          "peer": 1e3 * med[f"peer:{routing}:{VARIANTS[0]}"]},
        "predictions": x_peer,
    }


# ----------------------------------------------------------------------------- report

def print_tables(res: dict) -> None:
    a = res["analysis"]
    med = {k: median(v) for k, v in res["samples_s"].items()}
    for routing in ROUTINGS:
        r = a["routing"][routing]
        t = Table(title=f"Target pass, ms ({routing} routing; 1 row = decode step, k+1 rows = verify k drafts)")
        t.add_column("model")
        for n_rows in ROWS:
            t.add_column(f"{n_rows} row" + ("s" if n_rows > 1 else ""), justify="right")
        for n in VARIANTS:
            t.add_row(f"{n} layers (measured)", *(f"{1e3 * med[f'target:{routing}:{n}:{x}']:.1f}" for x in ROWS))
        lay = r["per_layer_s"]
        t.add_row("  m: one MoE layer = (T5 - T2) / 3", *(f"{1e3 * lay[x]['m']:.1f}" for x in ROWS))
        t.add_row("  c: embd, head, dense layer 0", *(f"{1e3 * lay[x]['c']:.1f}" for x in ROWS))
        t.add_row("[bold]40 layers = c + 39 m[/bold]", *(f"[bold]{1e3 * r['t40_s'][x]:.1f}[/bold]" for x in ROWS))
        console.print(t)

    rr, rs = a["routing"]["random"], a["routing"]["shared"]
    t = Table(title=f"Cost relative to one 40-layer decode step ({rr['decode40_ms']:.0f} ms random routing, "
                    f"{rs['decode40_ms']:.0f} ms shared), one run")
    for c in ("k", "verify/decode random", "IQR", "5-layer direct", "verify/decode shared", "IQR",
              "draft/decode", "inject(a=k)/decode", "host/decode", "host ms"):
        t.add_column(c, justify="right")
    for k in MEASURED_DEPTHS:
        lo, hi = rr["verify_iqr"][k]
        lo2, hi2 = rs["verify_iqr"][k]
        h = rr["host_over_decode"].get(k, float("nan"))
        t.add_row(str(k), f"{rr['verify_over_decode'][k]:.2f}", f"{lo:.2f}-{hi:.2f}",
                  f"{rr['verify_over_decode_L5_direct'][k]:.2f}", f"{rs['verify_over_decode'][k]:.2f}",
                  f"{lo2:.2f}-{hi2:.2f}", f"{rr['draft_over_decode'][k]:.3f}",
                  f"{rr['inject_over_decode'][k]:.3f}" if k in rr["inject_over_decode"] else "",
                  f"{h:.3f}" if k in a["host"] else "",
                  f"{1e3 * a['host'][k]['host']:.1f}" if k in a["host"] else "")
    h0 = rr["host_over_decode"].get(0, float("nan"))
    t.add_row("0", "1", "", "1", "1", "", "", "", f"{h0:.3f}", f"{1e3 * a['host'].get(0, {}).get('host', float('nan')):.1f}")
    console.print(t)

    t = Table(title="Predicted speed-up of a real XS 2.1 pair on this CPU: random routing / shared routing "
                    "(expected tokens per round)")
    t.add_column("acceptance")
    for k in MEASURED_DEPTHS:
        t.add_column(f"k={k}", justify="right")
    for name in a["acceptance_models"]:
        pr, ps = rr["predictions"][name], rs["predictions"][name]
        t.add_row(name, *(f"{pr[k]['speedup']:.2f} / {ps[k]['speedup']:.2f} ({pr[k]['tokens_per_round']:.2f})"
                          for k in MEASURED_DEPTHS))

    def ik(k):
        return 16 if k == 15 else k

    t.add_row("ik_llama.cpp measured, CPU, code",
              *(f"{IK_CPU[ik(k)]:.2f}" if ik(k) in IK_CPU else "" for k in MEASURED_DEPTHS))
    t.add_row("tokens/round that needs here", *(
        f"{rr['ik_tokens_per_round_needed'][ik(k)]:.2f} / {rs['ik_tokens_per_round_needed'][ik(k)]:.2f}"
        if ik(k) in IK_CPU else "" for k in MEASURED_DEPTHS))
    console.print(t)
    console.print("ik_llama.cpp's n_max 16 is shown at k = 15 (a block of 16 holds at most 15 drafts).")
    if "peer" in rr:
        print_peer_tables(a)


def print_peer_tables(a: dict) -> None:
    rr, rs = a["routing"]["random"], a["routing"]["shared"]
    pr, ps = rr["peer"], rs["peer"]
    t = Table(title="Plain step, ours against ik_llama.cpp's (same files, same run), ms")
    for c in ("routing", "2 layers: ours / ik", "5 layers: ours / ik", "40 layers: ours / ik",
              "ours / ik, IQR over repeats", "tokens/s: ours / ik"):
        t.add_column(c, justify="right")
    for name, r, p in (("random", rr, pr), ("shared", rs, ps)):
        lo, hi = p["decode_over_peer_iqr"]
        t.add_row(name, f"{p['L2_one_row_ms']['ours']:.1f} / {p['L2_one_row_ms']['peer']:.1f}",
                  f"{p['L5_one_row_ms']['ours']:.1f} / {p['L5_one_row_ms']['peer']:.1f}",
                  f"{r['decode40_ms']:.0f} / {p['decode40_ms']:.0f} = {p['decode_over_peer']:.2f}",
                  f"{lo:.2f}-{hi:.2f}", f"{p['ours_plain_tokens_per_s']:.2f} / {p['tokens_per_s']:.2f}")
    console.print(t)
    t = Table(title="Predicted tokens/s over ik_llama.cpp's plain decoding: random / shared routing "
                    "[IQR of the plain steps' ratio, random; shared]")
    t.add_column("acceptance")
    for k in (0, *MEASURED_DEPTHS):
        t.add_column("plain" if k == 0 else f"k={k}", justify="right")
    for name in a["acceptance_models"]:
        xr, xs = pr["predictions"][name], ps["predictions"][name]
        t.add_row(name, *(f"{xr[k]['x_peer']:.2f} / {xs[k]['x_peer']:.2f} "
                          f"[{xr[k]['x_peer_iqr'][0]:.2f}-{xr[k]['x_peer_iqr'][1]:.2f}; "
                          f"{xs[k]['x_peer_iqr'][0]:.2f}-{xs[k]['x_peer_iqr'][1]:.2f}]"
                          for k in (0, *MEASURED_DEPTHS)))
    console.print(t)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = res["analysis"]
    rr, rs = a["routing"]["random"], a["routing"]["shared"]
    ks = list(MEASURED_DEPTHS)
    peer = "peer" in rr
    fig, axes = plt.subplots(1, 3 if peer else 2, figsize=(16 if peer else 11, 4.3))
    ax1, ax2 = axes[0], axes[1]
    x = np.arange(len(ks))
    w = 0.38
    for off, r, name, alpha in ((-w / 2, rr, "random routing", 1.0), (w / 2, rs, "shared routing", 0.55)):
        v = np.array([r["verify_over_decode"][k] for k in ks])
        d = np.array([r["draft_over_decode"][k] for k in ks])
        i = np.array([r["inject_over_decode"][0]] * len(ks))
        h = np.array([max(0.0, r["host_over_decode"].get(k, 0.0)) for k in ks])
        lab = (lambda s: s) if off < 0 else (lambda s: None)
        ax1.bar(x + off, v, w, color="#4c72b0", alpha=alpha, label=lab("verify (k+1 rows)"))
        ax1.bar(x + off, d, w, bottom=v, color="#dd8452", alpha=alpha, label=lab("draft (k+1 rows)"))
        ax1.bar(x + off, i, w, bottom=v + d, color="#55a868", alpha=alpha, label=lab("inject (1 row)"))
        ax1.bar(x + off, h, w, bottom=v + d + i, color="#8172b2", alpha=alpha, label=lab("host (Python)"))
    ax1.axhline(1.0, color="k", lw=0.8, ls="--")
    code = a["acceptance_models"]["code (mlxcel fit)"]["a"]
    ax1.plot(x, [expected_tokens(code, k) for k in ks], "kD", ms=5,
             label="tokens per round, code (break-even)")
    ax1.set_xticks(x, [f"{k}\nr | s" for k in ks], fontsize=8)
    ax1.set_xlabel("depth k (drafts per round); r: random routing, s: shared")
    ax1.set_ylabel("round cost / one decode step")
    ax1.set_title(f"Round cost, 40-layer XS 2.1 (decode {rr['decode40_ms']:.0f} ms)", fontsize=10)
    ax1.legend(fontsize=8)
    kk = list(range(1, 16))
    colors = {"code (mlxcel fit)": "#c44e52", "code, low": "#dd8452", "code, high": "#937860",
              "think / prose-like": "#4c72b0"}
    for name, col in colors.items():
        lo = [rr["predictions"][name][k]["speedup"] for k in kk]
        hi = [rs["predictions"][name][k]["speedup"] for k in kk]
        ax2.fill_between(kk, lo, hi, color=col, alpha=0.15)
        ax2.plot(kk, lo, "-", color=col, lw=1.5, label=f"{name}")
        ax2.plot(kk, hi, "--", color=col, lw=1.0)
        ax2.plot(ks, [rr["predictions"][name][k]["speedup"] for k in ks], "o", color=col, ms=3)
    ax2.plot([1, 2, 4, 8, 15], list(IK_CPU.values()), "ks", label="ik_llama.cpp measured (CPU)")
    ax2.axhline(1.0, color="k", lw=0.8)
    ax2.set_xlabel("depth k")
    ax2.set_ylabel("speed-up vs plain decoding")
    ax2.set_title("Predicted on this CPU (solid: random routing, dashed: shared)", fontsize=10)
    ax2.set_xticks(list(MEASURED_DEPTHS))
    ax2.legend(fontsize=7, loc="upper right")
    if peer:
        ax3 = axes[2]
        k0 = [0, *kk]
        for name, col in colors.items():
            lo = [rr["peer"]["predictions"][name][k]["x_peer"] for k in k0]
            hi = [rs["peer"]["predictions"][name][k]["x_peer"] for k in k0]
            ax3.fill_between(k0, lo, hi, color=col, alpha=0.15)
            ax3.plot(k0, lo, "-", color=col, lw=1.5, label=name)
            ax3.plot(k0, hi, "--", color=col, lw=1.0)
        ax3.axhline(1.0, color="k", lw=0.8)
        ax3.set_xlabel("depth k (0: plain decoding)")
        ax3.set_ylabel("tokens/s over ik_llama.cpp's plain step")
        ax3.set_title(f"Against ik -rtr plain ({rr['peer']['decode40_ms']:.0f} / {rs['peer']['decode40_ms']:.0f} ms "
                      "a step, random / shared)", fontsize=10)
        ax3.set_xticks([0, *MEASURED_DEPTHS])
        ax3.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ----------------------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=None, help="where the synthetic models live (default: "
                    "$LAGUNA_DFLASH_CACHE/costmodel or ~/.cache/laguna-dflash/costmodel)")
    ap.add_argument("--rebuild", action="store_true", help="rebuild the synthetic models")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="0: all cores")
    ap.add_argument("--context", type=int, default=512, help="tokens in the KV cache when timing")
    ap.add_argument("--n-batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=9, help="timed repeats of every measurement")
    ap.add_argument("--warmup", type=int, default=1, help="untimed repeats first")
    ap.add_argument("--engine-passes", type=int, default=2, help="engine passes (all depths), interleaved")
    ap.add_argument("--engine-rounds", type=int, default=8, help="timed rounds per depth and pass")
    ap.add_argument("--ik-bench", type=Path, default=None,
                    help="ik_llama.cpp's llama-bench: time its plain step on the same targets in the same run")
    ap.add_argument("--ik-args", default="-rtr 1", help="more llama-bench arguments for ik (default: -rtr 1)")
    ap.add_argument("--ik-reps", type=int, default=3, help="llama-bench -r per target, routing and repeat")
    ap.add_argument("--json", type=Path, default=None, help="results JSON (default: <cache>/cost-model.json)")
    ap.add_argument("--png", type=Path, default=None, help="chart (default: <cache>/cost-model.png)")
    ap.add_argument("--from-json", type=Path, default=None,
                    help="no measuring: redo the analysis, tables and chart from an earlier run's JSON")
    args = ap.parse_args()

    if args.from_json:
        res = json.loads(args.from_json.read_text())
        res["analysis"] = analyse(res["samples_s"])
        print_tables(res)
        if args.json:
            write_json(args.json, res, indent=1, default=float)
            console.print(f"wrote {args.json}")
        out_png = args.png or args.from_json.with_suffix(".png")
        plot(res, out_png)
        console.print(f"wrote {out_png} ({out_png.stat().st_size / 1e3:.0f} kB)")
        return 0

    if args.ik_bench and not (args.ik_bench.is_file() and os.access(args.ik_bench, os.X_OK)):
        ap.error(f"--ik-bench {args.ik_bench}: expected ik_llama.cpp's llama-bench, an executable file")
    root = args.cache or cache_root()
    threads = args.threads or os.cpu_count() or 1
    t_start = time.perf_counter()
    art = build(root, args.seed, threads, args.rebuild)
    console.print(f"models in {art.drafter.parent}: {', '.join(p.name for p in art.targets.values())}, {art.drafter.name}")
    if args.build_only:
        return 0
    info = machine_info()
    console.print(f"machine: {info['nproc']} cores, {info['cpu']}, {info['mem_total_gib']} GiB, "
                  f"load average {info['loadavg_start'][0]:.2f}")
    if threads > 1 and info["loadavg_start"][0] > 0.5 * (info["nproc"] or 1):
        console.print(f"[yellow]note: the machine is busy (load {info['loadavg_start'][0]:.1f} on {info['nproc']} "
                      f"cores); with {threads} threads llama.cpp's per-op barriers stall whenever one thread is "
                      "descheduled, which inflates and scatters timings. --threads 1 is steadier.[/yellow]")

    random.seed(args.seed)
    bench = Bench(art, args)
    total = (args.warmup + args.repeats) * bench.n_items() + args.engine_passes * (len(DEPTHS) + 1)
    # engine passes ride along with timed repeats spread evenly over the run
    engine_at = {args.warmup + (2 * i + 1) * args.repeats // (2 * args.engine_passes)
                 for i in range(args.engine_passes)}
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), console=console) as prog:
        task = prog.add_task("measuring", total=total)
        for i in range(args.warmup + args.repeats):
            label = f"repeat {i + 1}/{args.warmup + args.repeats}" + (" (warm-up)" if i < args.warmup else "")
            bench.repeat(record=i >= args.warmup, engine=i in engine_at, on_done=lambda: prog.advance(task),
                         on_phase=lambda what, label=label: prog.update(task, description=f"{label}: {what}"))
    samples = bench.samples
    t_prefill = bench.t_prefill
    info["loadavg_end"] = list(os.getloadavg())

    res = {
        "command": command_line(sys.argv[0]),
        "machine": info,
        "settings": {"threads": threads, "context": args.context, "n_batch": args.n_batch,
                     "repeats": args.repeats, "warmup": args.warmup, "engine_passes": args.engine_passes,
                     "engine_rounds": args.engine_rounds, "kv_type": "f16", "target_quant": "Q4_K_M",
                     "drafter_quant": "Q8_0", "layers_built": list(VARIANTS), "real_layers": REAL_LAYERS,
                     "real_mix": REAL_MIX, "q6_k_layers": list(Q6_LAYERS), "routings": list(ROUTINGS)},
        "models": {"targets": {f"{r}:{n}": str(p) for (r, n), p in art.targets.items()}, "drafter": str(art.drafter),
                   "target_bytes": {f"{r}:{n}": p.stat().st_size for (r, n), p in art.targets.items()},
                   "drafter_bytes": art.drafter.stat().st_size},
        "prefill_s": t_prefill,
        "samples_s": samples,
        "analysis": analyse(samples),
        "ik_llama_cpu": IK_CPU,
        "loadavg_per_repeat": bench.loadavg,
        "wall_s": time.perf_counter() - t_start,
    }
    if bench.peer:
        from tests.helpers.ik_interop import peer_snapshot

        res["peer"] = {"llama_bench": bench.peer, "args": args.ik_args, "reps": args.ik_reps,
                       "command": shlex.join(peer_command(bench.peer, ["TARGET"], threads, args.ik_reps, args.context,
                                                          shlex.split(args.ik_args))),
                       "build_commit": bench.peer_build, "snapshot": peer_snapshot(args.ik_bench.parent)}
    print_tables(res)
    out_json = args.json or root / "cost-model.json"
    out_json.parent.mkdir(parents=True, exist_ok=True)
    write_json(out_json, res, indent=1, default=float)
    out_png = args.png or root / "cost-model.png"
    plot(res, out_png)
    console.print(f"wrote {out_json} and {out_png} ({out_png.stat().st_size / 1e3:.0f} kB); "
                  f"{res['wall_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
