#!/usr/bin/env python3
"""Where the batched engine's rounds spend their time: cProfile over ``--streams`` sequences of the
bundled code pair decoding at ``--depth`` in one BatchEngine, after an untimed warm-up, with the
time inside each target decode and each drafter pass summed apart.

    python -m scripts.investigate.profile_rounds --device cuda --streams 2 --depth 4 --json profile.json

On a GPU, ``llama_decode`` queues work and a logits or capture read waits for it, so the profile's
``logits``/``capture`` rows carry the GPU's time and ``decode`` rows the launches. The JSON holds
the run's figures and the ``--top`` functions by own time and by cumulative time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path

from scripts.recorded import command_line, write_json


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--json", type=Path, help="the run's figures and top functions")
    args = ap.parse_args(argv)

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.batch import BatchEngine
    from laguna_dflash.runtime.engine import EngineConfig, GenerateOptions
    from laguna_dflash.runtime.open_pair import resolve_pair
    from laguna_dflash.runtime.placement import ALL_LAYERS

    layers = ALL_LAYERS if args.device == "cuda" else 0
    cfg = EngineConfig(n_ctx=1024, n_threads=args.threads, kv_type="f16", prompt_cache=False,
                       n_gpu_layers=layers, n_gpu_layers_draft=layers)
    pair = resolve_pair(assets.TINY_TARGET, assets.converted_tiny_drafter())
    texts = assets.read_prompts(assets.CODE_PROMPTS)
    opts = GenerateOptions(n_predict=args.n_predict, n_max=args.depth)
    with BatchEngine.open(pair, cfg, n_seq=args.streams) as engine:
        prompts = [engine.tokenize(texts[i % len(texts)])[:96] for i in range(args.requests)]
        engine.generate_all(prompts[:args.streams], opts)  # warm-up: graphs, buffers
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        results = engine.generate_all(prompts, opts)
        prof.disable()
        wall = time.perf_counter() - t0
    tokens = sum(len(r.tokens) for r in results)
    rounds = max(r.stats.rounds for r in results)
    head = (f"{args.device}, {args.streams} streams, depth {args.depth}: {tokens} tokens in {wall:.3f} s "
            f"({tokens / wall:.0f} tok/s), {sum(r.stats.rounds for r in results)} sequence-rounds "
            f"(longest sequence {rounds})\n")
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    for key in ("tottime", "cumulative"):
        stats.sort_stats(key).print_stats(args.top)
    print(head + text.getvalue())
    if args.json:
        rows = [{"function": f"{path}:{line}({name})", "calls": nc, "own_s": tt, "cumulative_s": ct}
                for (path, line, name), (_, nc, tt, ct, _) in stats.stats.items()]
        write_json(args.json, {
            "command": command_line(__file__, argv), "device": args.device, "streams": args.streams,
            "depth": args.depth, "tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall,
            "sequence_rounds": sum(r.stats.rounds for r in results),
            "by_own_time": sorted(rows, key=lambda r: -r["own_s"])[:args.top],
            "by_cumulative_time": sorted(rows, key=lambda r: -r["cumulative_s"])[:args.top]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
