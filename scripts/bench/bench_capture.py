#!/usr/bin/env python3
"""What hidden-state capture costs a plain decoding step, and what the engine adds to one.

With a drafter loaded, every target decode copies the captured slots' rows out of the graph
(off the GPU when the target runs there). This times one-row plain steps of the bundled
target with the drafter's capture slots on and off, in alternating blocks of 16 steps (the
machine drifts), and prints the median step of each and their ratio, measured in one run.
Then the same prompt through the engine's plain decoding (n_max 0), without a drafter and
with one loaded, as time per generated token: on an H200 a bare step took 0.28 ms while the
engine's plain rounds took 1.2-1.3 ms (docs/results/gpu/README.md). That bare step was timed around the
decode call alone, which on a GPU only queues the work; a step now ends when its logits are read.

    python -m scripts.bench.bench_capture [--device cuda] [--steps 512]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from scripts.recorded import write_json


def engine_plain(placement, prompt: list[int], n: int) -> dict[str, float]:
    """Seconds per generated token of the engine's plain decoding, without and with a drafter
    loaded (the best of three generations each, interleaved)."""
    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions
    from laguna_dflash.runtime.llama import Model

    cfg = EngineConfig(n_ctx=len(prompt) + n + 64, n_gpu_layers_draft=placement.n_gpu_layers_draft)
    best = {"no drafter": float("inf"), "drafter loaded": float("inf")}
    with Model(assets.TINY_TARGET, n_gpu_layers=placement.n_gpu_layers) as model, \
            Engine(model, None, cfg) as alone, Engine(model, assets.converted_tiny_drafter(), cfg) as paired:
        for _ in range(3):
            for name, eng in (("no drafter", alone), ("drafter loaded", paired)):
                stats = eng.generate(prompt, GenerateOptions(n_predict=n, n_max=0)).stats
                best[name] = min(best[name], stats.t_total / max(1, stats.n_generated - 1))
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--steps", type=int, default=512)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.llama import Context, ContextParams, Model
    from laguna_dflash.convert.gguf.specs import read_drafter
    from laguna_dflash.runtime.placement import resolve

    placement = resolve(args.device)
    slots = read_drafter(assets.converted_tiny_drafter()).capture_slots
    block = 16
    times = {True: [], False: []}
    after_switch = []  # the first step after each switch of capture (patch 0005: one graph rebuild)
    with Model(assets.TINY_TARGET, n_gpu_layers=placement.n_gpu_layers) as model, \
            Context(model, ContextParams(n_ctx=args.steps + 256)) as ctx:
        prompt = model.tokenize(assets.read_prompts(assets.CODE_PROMPTS)[0])[:128]
        ctx.decode(prompt, np.arange(len(prompt)), logits="last")
        tok, pos = int(ctx.logits_row(-1).argmax()), len(prompt)
        for b in range(args.steps // block):
            on = b % 2 == 0
            for s in slots:
                ctx.set_capture(s, on)
            for i in range(block):
                # a step ends when its logits are read: llama_decode only queues the work of a
                # GPU backend, and reading the logits waits for it (session 5 timed the decode
                # call alone, 0.28 ms on an H200: the launch, not the step)
                t0 = time.perf_counter()
                ctx.decode([tok], [pos], logits="last")
                tok, pos = int(ctx.logits_view(0).argmax()), pos + 1
                t = time.perf_counter() - t0
                if i >= 2:  # the first steps after a toggle rebuild the graph
                    times[on].append(t)
                elif i == 0 and b:
                    after_switch.append(t)
    on, off = statistics.median(times[True]), statistics.median(times[False])
    switch = statistics.median(after_switch)
    result = {"placement": placement.describe(), "slots": list(slots), "steps": args.steps,
              "median_step_s": {"capture_on": on, "capture_off": off, "first_after_switch": switch},
              "ratio_on_to_off": on / off}
    print(f"{placement.describe()}: plain step {1e3 * off:.3f} ms with capture off, {1e3 * on:.3f} ms with "
          f"slots {list(slots)} captured: x{on / off:.3f}; the first step after a switch {1e3 * switch:.3f} ms")
    # the engine reports totals: compare means (a busy machine's stalls lift a mean, not a median)
    bare = result["mean_step_s_capture_off"] = statistics.fmean(times[False])
    result["engine_plain_s_per_token"] = engine_plain(placement, prompt, min(args.steps, 256))
    print(f"bare step, capture off: mean {1e3 * bare:.3f} ms")
    for name, t in result["engine_plain_s_per_token"].items():
        print(f"engine, plain decoding, {name}: {1e3 * t:.3f} ms per token (x{t / bare:.2f} the bare step's mean)")
    if args.json:
        write_json(args.json, result, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
