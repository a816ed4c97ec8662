#!/usr/bin/env python3
"""The demo's last line: speculative and plain decoding of the same prompt, measured in this run.

    .venv/bin/python -m scripts.demo_summary -f runtime/data/prompts/demo.py -n 200 --n-max 4 [-t 2]

One engine (the bundled pair), a short warm-up of each, then plain and speculative decoding
alternately, ``--repeats`` times each (the median of each is reported, so a busy moment of the
machine does not decide the speedup); the speculative output is compared with the plain one
token for token.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path



def summary_line(spec_tps: float, plain_tps: float, n_max, n_tokens: int, first_diff: int | None) -> str:
    """first_diff: None when every speculative output equalled the plain one, else the index of
    the first generated token where they part."""
    same = "yes" if first_diff is None else f"no, from generated token {first_diff} on (README: Greedy decoding)"
    return (f"speculative {spec_tps:.0f} tokens/s vs plain {plain_tps:.0f} tokens/s, measured in this run "
            f"(n_max {n_max}, {n_tokens} tokens): {spec_tps / plain_tps:.2f}x; "
            f"output identical to plain decoding: {same}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-f", "--file", type=Path, required=True)
    ap.add_argument("-n", "--n-predict", type=int, default=200)
    ap.add_argument("--n-max", default="4")
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    args, _ = ap.parse_known_args(argv)  # the demo passes laguna-run's extra flags along; only -t matters here

    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions

    n_max = args.n_max if args.n_max == "auto" else int(args.n_max)
    target, drafter = assets.default_pair(None)
    with Engine.load(target, drafter, EngineConfig(n_threads=args.threads)) as engine:
        prompt = engine.tokenize(args.file.read_text())
        for d in (0, n_max):
            engine.generate(prompt, GenerateOptions(n_predict=8, n_max=d))
        plain, spec = [], []
        for _ in range(args.repeats):
            plain.append(engine.generate(prompt, GenerateOptions(n_predict=args.n_predict, n_max=0)))
            spec.append(engine.generate(prompt, GenerateOptions(n_predict=args.n_predict, n_max=n_max)))
    a, b = plain[0].tokens, spec[0].tokens
    same = all(s.tokens == a for s in spec)
    first_diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    print(summary_line(statistics.median(r.stats.tokens_per_s for r in spec),
                       statistics.median(r.stats.tokens_per_s for r in plain), n_max, len(b),
                       None if same else first_diff))
    return 0


if __name__ == "__main__":
    sys.exit(main())
