#!/usr/bin/env python3
"""Which grammar library constrains our decoding: llguidance, xgrammar, llama.cpp's grammar sampler.

    flock -x /tmp/laguna-cpu.lock .venv/bin/python -m scripts.bench.bench_constraint_libs --json docs/results/structured/structured-libs.json

xgrammar is not a dependency of the project (it needs torch); install it to compare:
``.venv/bin/pip install --no-deps xgrammar==0.2.8 apache-tvm-ffi`` (torch and transformers come
with the test extra). llama.cpp's sampler is the patched wheel's own (``llama_sampler_init_grammar``
with the GBNF that llama-cpp-python's ``json_schema_to_gbnf`` writes).

Two vocabularies, the same token ids for all three libraries:

* **tiny**: the bundled target's (``runtime/data/laguna-tiny/tokenizer/tokenizer.json``, 4096
  tokens; llama.cpp reads it from the target GGUF);
* **100k**: no 100k tokenizer ships in any package this project installs, so a byte-level BPE of
  100,000 tokens is trained here on the Python standard library's sources with ``tokenizers``
  (about 2 minutes on 2 cores; cached), and written as a vocabulary-only GGUF for llama.cpp.

For each vocabulary and schema (four of the shapes clients send: a pydantic-style record with a
nested object and a list, a list of line items with a pattern and an enum, tool arguments, any
JSON object), every library:

* **compile**: from the schema text to a matcher ready for its first mask (the tokenizer's own
  preparation, once per vocabulary, is reported apart), median of ``--repeats``;
* **mask**: the full next-token mask at every position of a valid answer (its tokenization by
  the vocabulary), each position timed once per repeat; median and 99th percentile over
  positions of the per-position median;
* **check**: how many of 8 drafted tokens the grammar allows, from 8 positions spread over the
  answer, without computing a mask (llguidance ``validate_tokens``; xgrammar ``accept_token``
  then ``rollback``; llama.cpp: a copy of the sampler, a one-candidate ``apply`` and ``accept``
  per token, since its sampler cannot roll back); median per check;
* **rollback**: whether the matcher can forget consumed tokens (what speculation needs, or a
  copy per round instead).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from laguna_dflash.runtime import assets
from scripts.recorded import command_line, write_json

TINY_TOKENIZER = assets.TINY_DIR / "tokenizer" / "tokenizer.json"
TINY_GGUF = assets.TINY_TARGET

SCHEMAS = {
    "record": ({
        "type": "object", "additionalProperties": False,
        "properties": {
            "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
            "email": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
            "address": {"type": "object", "additionalProperties": False,
                        "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                                       "zip": {"type": "string"}},
                        "required": ["street", "city", "zip"]}},
        "required": ["name", "age", "email", "tags", "address"]},
        '{"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["math", "engines", '
        '"poetry"], "address": {"street": "12 St James Square", "city": "London", "zip": "SW1Y 4JH"}}'),
    "line-items": ({
        "type": "object", "additionalProperties": False,
        "properties": {
            "status": {"enum": ["pending", "paid", "shipped", "cancelled"]},
            "items": {"type": "array", "minItems": 1, "items": {
                "type": "object", "additionalProperties": False,
                "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                               "qty": {"type": "integer", "minimum": 1}, "price": {"type": "number"}},
                "required": ["sku", "qty", "price"]}},
            "note": {"type": "string"}},
        "required": ["status", "items"]},
        '{"status": "paid", "items": [{"sku": "ABC-1234", "qty": 2, "price": 9.99}, {"sku": "XYZ-0001", '
        '"qty": 1, "price": 120.5}, {"sku": "QRS-4242", "qty": 12, "price": 0.25}], "note": "leave at the door"}'),
    "tool-args": ({
        "type": "object", "additionalProperties": False,
        "properties": {"path": {"type": "string"}, "line_start": {"type": "integer"},
                       "line_end": {"type": "integer"}, "recursive": {"type": "boolean"}},
        "required": ["path", "line_start", "line_end", "recursive"]},
        '{"path": "runtime/engine.py", "line_start": 120, "line_end": 240, "recursive": false}'),
    "json-object": ({"type": "object"},
                    '{"model": "laguna", "layers": [1, 9, 17, 23], "window": 512, "gating": {"per_head": true}}'),
}


def train_100k(cache: Path) -> Path:
    out = cache / "stdlib-bpe-100k.json"
    if out.exists():
        return out
    import sysconfig

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    files = []
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        try:
            f.read_text(encoding="utf-8")
            files.append(str(f))
        except (UnicodeDecodeError, OSError):
            continue
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=100_000, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(files, trainer)
    cache.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    return out


def vocab_only_gguf(tokenizer_json: Path, out: Path) -> Path:
    """A GGUF holding only a GPT-2-style header and this byte-level BPE vocabulary, for
    llama.cpp's ``vocab_only`` load."""
    if out.exists():
        return out
    import gguf

    spec = json.loads(tokenizer_json.read_text())
    vocab = spec["model"]["vocab"]
    tokens = [""] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    types = [gguf.TokenType.NORMAL] * len(tokens)
    for added in spec.get("added_tokens", []):
        types[added["id"]] = gguf.TokenType.CONTROL
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    w = gguf.GGUFWriter(str(out), "gpt2")
    w.add_context_length(1024)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(64)
    w.add_head_count(1)
    w.add_layer_norm_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(0)
    w.add_bos_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


class LLGuidance:
    name = "llguidance"

    def __init__(self, tokenizer_json: Path, eos: int) -> None:
        import llguidance
        import llguidance.numpy  # noqa: F401

        self.llg = llguidance
        t0 = time.perf_counter()
        self.tok = llguidance.LLTokenizer(str(tokenizer_json), eos_token=eos)
        self.t_tokenizer = time.perf_counter() - t0
        self.version = llguidance.__version__

    def compile(self, schema: dict):
        g = self.llg.LLMatcher.grammar_from_json_schema(schema, overrides={"whitespace_flexible": True})
        m = self.llg.LLMatcher(self.tok, g, log_level=0)
        assert not m.is_error(), m.get_error()
        self.bits = np.zeros((self.tok.vocab_size + 31) // 32, dtype=np.int32)
        return m

    def mask(self, m) -> None:
        m.unsafe_compute_mask_ptr(self.bits.ctypes.data, self.bits.nbytes)

    def consume(self, m, t: int) -> None:
        assert m.consume_token(t), m.get_error()

    def check(self, m, drafts: list[int]) -> int:
        return m.validate_tokens(drafts)

    def rollback(self, m, n: int) -> None:
        m.rollback(n)


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokenizer_json: Path, eos: int) -> None:
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast

        self.xgr = xgr
        t0 = time.perf_counter()
        hf = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), eos_token=None)
        info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=len(hf), stop_token_ids=[eos])
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=False)
        self.t_tokenizer = time.perf_counter() - t0
        self.bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
        from importlib.metadata import version

        self.version = version("xgrammar")

    def compile(self, schema: dict):
        compiled = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=True)
        return self.xgr.GrammarMatcher(compiled, max_rollback_tokens=32)

    def mask(self, m) -> None:
        m.fill_next_token_bitmask(self.bitmask)

    def consume(self, m, t: int) -> None:
        assert m.accept_token(t)

    def check(self, m, drafts: list[int]) -> int:
        n = 0
        for t in drafts:
            if not m.accept_token(t):
                break
            n += 1
        m.rollback(n)
        return n

    def rollback(self, m, n: int) -> None:
        m.rollback(n)


class LlamaCppGrammar:
    name = "llama.cpp"

    def __init__(self, gguf_path: Path) -> None:
        import llama_cpp
        from llama_cpp import llama_cpp as ll
        from llama_cpp.llama_grammar import json_schema_to_gbnf

        self.ll, self.to_gbnf = ll, json_schema_to_gbnf
        ll.llama_backend_init()
        params = ll.llama_model_default_params()
        params.vocab_only = True
        t0 = time.perf_counter()
        self.model = ll.llama_model_load_from_file(str(gguf_path).encode(), params)
        assert self.model, gguf_path
        self.vocab = ll.llama_model_get_vocab(self.model)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self.t_tokenizer = time.perf_counter() - t0
        self.data = (ll.llama_token_data * self.n_vocab)()
        self.fields = np.ctypeslib.as_array(self.data)  # a structured view: refilled in one numpy pass
        self.ids = np.arange(self.n_vocab, dtype=np.int32)
        self.one = (ll.llama_token_data * 1)()
        self.version = llama_cpp.__version__

    def _array(self, data, n):
        return self.ll.llama_token_data_array(data=data, size=n, selected=-1, sorted=False)

    def compile(self, schema: dict):
        gbnf = self.to_gbnf(json.dumps(schema))
        s = self.ll.llama_sampler_init_grammar(self.vocab, gbnf.encode(), b"root")
        assert s, "grammar refused"
        return [s]  # a list: "rollback" replaces the sampler by an earlier copy

    def refill(self) -> None:
        """The sampler drops forbidden candidates' logits to -inf in place: a fresh array per mask."""
        self.fields["id"] = self.ids
        self.fields["logit"] = 0.0
        self.fields["p"] = 0.0

    def mask(self, m) -> None:
        self.refill()
        arr = self._array(self.data, self.n_vocab)
        self.ll.llama_sampler_apply(m[0], ctypes.byref(arr))

    def consume(self, m, t: int) -> None:
        self.ll.llama_sampler_accept(m[0], t)

    def check(self, m, drafts: list[int]) -> int:
        trial = self.ll.llama_sampler_clone(m[0])
        n = 0
        try:
            for t in drafts:
                self.one[0].id, self.one[0].logit, self.one[0].p = t, 0.0, 0.0
                arr = self._array(self.one, 1)
                self.ll.llama_sampler_apply(trial, ctypes.byref(arr))
                if not np.isfinite(self.one[0].logit):
                    break
                self.ll.llama_sampler_accept(trial, t)
                n += 1
        finally:
            self.ll.llama_sampler_free(trial)
        return n

    def rollback(self, m, n: int) -> None:
        raise NotImplementedError


def refill_cost(lib) -> float:
    """llama.cpp's mask needs the candidate array refilled before each apply: what that costs
    (median of 20), subtracted from its mask times."""
    if not isinstance(lib, LlamaCppGrammar):
        return 0.0
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        lib.refill()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench(lib, tokenize, repeats: int) -> dict:
    rows = {}
    for name, (schema, answer) in SCHEMAS.items():
        tokens = tokenize(answer)
        t_compile, per_pos = [], [[] for _ in tokens]
        checks = []
        loop = refill_cost(lib)
        for _ in range(repeats):
            t0 = time.perf_counter()
            m = lib.compile(schema)
            lib.mask(m)
            t_compile.append(time.perf_counter() - t0)
            m = lib.compile(schema)
            for i, t in enumerate(tokens):
                t0 = time.perf_counter()
                lib.mask(m)
                per_pos[i].append(time.perf_counter() - t0 - loop)
                lib.consume(m, t)
            m = lib.compile(schema)
            starts = set(np.linspace(0, max(0, len(tokens) - 9), 8).astype(int).tolist())
            for i, t in enumerate(tokens):
                if i in starts:
                    t0 = time.perf_counter()
                    n = lib.check(m, tokens[i:i + 8])
                    checks.append(time.perf_counter() - t0)
                    assert n == len(tokens[i:i + 8]), (lib.name, name, i, n)
                lib.consume(m, t)
        med = [statistics.median(p) for p in per_pos]
        rows[name] = {"tokens": len(tokens), "compile_ms": 1e3 * statistics.median(t_compile),
                      "answer_ms": 1e3 * (statistics.median(t_compile) + sum(med)),
                      "mask_us_median": 1e6 * statistics.median(med),
                      "mask_us_p99": 1e6 * float(np.percentile(med, 99)),
                      "check8_us_median": 1e6 * statistics.median(checks)}
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "laguna-dflash" / "bench-constraints")
    ap.add_argument("--libs", default="llguidance,xgrammar,llama.cpp")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    from tokenizers import Tokenizer

    big = train_100k(args.cache)
    vocabs = {"tiny (4096)": (TINY_TOKENIZER, TINY_GGUF, 2),
              "stdlib BPE (100k)": (big, vocab_only_gguf(big, args.cache / "stdlib-bpe-100k.gguf"), 0)}
    results = {"repeats": args.repeats, "command": command_line(__file__, argv),
               "vocabularies": {}}
    for vname, (tj, gguf_path, eos) in vocabs.items():
        hf = Tokenizer.from_file(str(tj))

        def tokenize(text: str, hf=hf) -> list[int]:
            return hf.encode(text, add_special_tokens=False).ids

        per_lib = {}
        for lib_name in args.libs.split(","):
            try:
                lib = {"llguidance": lambda: LLGuidance(tj, eos), "xgrammar": lambda: XGrammar(tj, eos),
                       "llama.cpp": lambda: LlamaCppGrammar(gguf_path)}[lib_name]()
            except ImportError as e:
                print(f"{lib_name}: not installed ({e}); skipped", file=sys.stderr)
                continue
            per_lib[lib_name] = {"version": lib.version, "tokenizer_s": lib.t_tokenizer,
                                 "schemas": bench(lib, tokenize, args.repeats)}
            print(vname, lib_name, json.dumps(per_lib[lib_name]), flush=True)
        results["vocabularies"][vname] = per_lib
    print("\n| vocabulary | library | schema | tokens | compile ms | compile + every mask, ms | mask µs median "
          "| mask µs p99 | check 8 drafts µs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for vname, per_lib in results["vocabularies"].items():
        for lib_name, r in per_lib.items():
            for sname, row in r["schemas"].items():
                print(f"| {vname} | {lib_name} {r['version']} | {sname} | {row['tokens']} | {row['compile_ms']:.2f} | "
                      f"{row['answer_ms']:.1f} | "
                      f"{row['mask_us_median']:.1f} | {row['mask_us_p99']:.1f} | {row['check8_us_median']:.1f} |")
    if args.json:
        write_json(args.json, results, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
