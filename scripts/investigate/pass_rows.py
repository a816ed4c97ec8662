#!/usr/bin/env python3
"""What bounds the aggregate of several plain streams in one batched engine: every pass of a run
recorded (a prompt's part, or a decoding pass and its rows), and the run's time set against the
same requests one at a time and against the time it would take if every decoding pass held all
the streams.

    X=~/.cache/laguna-dflash/costmodel/78a62070aa
    python -m scripts.investigate.pass_rows --target $X/laguna-xs-shapes-L5-Q4_K_M.gguf --json rows.json

The workload of ``bench_concurrency``'s XS line (``--requests`` greedy completions of
``--n-predict`` tokens on the first ``--prompt-tokens`` tokens of the bundled code prompts, F16
cache, prompt cache off, plain decoding, ``--streams`` in a closed loop), after one untimed run of
each engine. The bound: the prompts' passes as they ran, plus the decoded tokens over the streams
times the median time of a decoding pass of all of them; over the one-at-a-time time it is the
most the run could gain while prompts take passes of their own (as they must for each output to
be its output alone).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from scripts.recorded import command_line, write_json


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, required=True, help="target GGUF (plain decoding: no drafter)")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.batch import BatchEngine
    from laguna_dflash.runtime.engine import EngineConfig, GenerateOptions
    from laguna_dflash.runtime.llama import Context, Model
    from laguna_dflash.runtime.open_pair import resolve_pair

    pair = resolve_pair(args.target, None)
    cfg = EngineConfig(n_ctx=1024, n_threads=args.threads, kv_type="f16", prompt_cache=False)
    texts = assets.read_prompts(assets.CODE_PROMPTS)
    passes: list[tuple[str, int, float]] = []  # kind, rows, seconds of the decode
    real_decode = Context.decode_seqs

    def timed_decode(self, parts):
        t = time.perf_counter()
        out = real_decode(self, parts)
        prompt = any(len(tokens) > 1 for _, tokens, _, _ in parts)
        passes.append(("prompt" if prompt else "decode", sum(len(p[1]) for p in parts), time.perf_counter() - t))
        return out

    opts = GenerateOptions(n_predict=args.n_predict, n_max=0)
    with Model(pair.target.path) as target:
        prompts = [target.tokenize(texts[i % len(texts)])[:args.prompt_tokens] for i in range(args.requests)]
        with BatchEngine(target, pair, cfg, n_seq=1) as alone, BatchEngine(target, pair, cfg, n_seq=args.streams) as batched:
            alone.generate_all(prompts[:1], opts)  # untimed: graphs, buffers, pages of the weights
            batched.generate_all(prompts[:args.streams], opts)
            t = time.perf_counter()
            for p in prompts:
                alone.generate_all([p], opts)
            one_at_a_time = time.perf_counter() - t
            Context.decode_seqs = timed_decode
            try:
                t = time.perf_counter()
                results = batched.generate_all(prompts, opts)
                run = time.perf_counter() - t
            finally:
                Context.decode_seqs = real_decode
    tokens = sum(len(r.tokens) for r in results)
    prompt_s = sum(s for kind, _, s in passes if kind == "prompt")
    by_rows: dict[int, list[float]] = {}
    for kind, rows, s in passes:
        if kind == "decode":
            by_rows.setdefault(rows, []).append(s)
    decoded_rows = sum(rows * len(v) for rows, v in by_rows.items())
    full = statistics.median(by_rows[args.streams]) if args.streams in by_rows else None
    bound = prompt_s + decoded_rows / args.streams * full if full is not None else None
    summary = {
        "one_at_a_time_s": one_at_a_time, "batched_s": run, "ratio": one_at_a_time / run,
        "prompt_passes": sum(kind == "prompt" for kind, _, _ in passes), "prompt_s": prompt_s,
        "decoding_passes": {str(r): {"passes": len(v), "median_ms": statistics.median(v) * 1e3, "total_s": sum(v)}
                            for r, v in sorted(by_rows.items())},
        "decoded_rows": decoded_rows, "tokens": tokens,
        "other_s": run - sum(s for _, _, s in passes),
        "bound_s": bound, "bound_ratio": one_at_a_time / bound if bound else None,
    }
    print(f"one at a time {one_at_a_time:.2f} s, {args.streams} streams {run:.2f} s: {one_at_a_time / run:.2f}x; "
          f"prompts {summary['prompt_passes']} passes {prompt_s:.2f} s; decoding passes by rows "
          + ", ".join(f"{r}: {d['passes']} x {d['median_ms']:.1f} ms" for r, d in summary["decoding_passes"].items())
          + (f"; every decoding pass of {args.streams} rows: {bound:.2f} s, {summary['bound_ratio']:.2f}x" if bound else ""))
    if args.json:
        write_json(args.json, {"command": command_line(__file__, argv), "target": args.target.name,
                               "streams": args.streams, "requests": args.requests, "n_predict": args.n_predict,
                               "prompt_tokens": args.prompt_tokens, "threads": args.threads, **summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
