#!/usr/bin/env python3
"""Does our converted drafter run in ik_llama.cpp, with the acceptance laguna-run sees?

    python -m scripts.investigate.check_ik_interop                      # the converter's own output
    python -m scripts.investigate.check_ik_interop --rename-ffn-norm    # a copy with blk.N.ffn_norm -> post_attention_norm

Converts the bundled laguna-tiny drafter with ``laguna-gguf convert`` (cached, as the demo
does), runs the pair greedily in ik's ``llama-spec-bench`` with ``--spec-type dflash:n_max=N``
and in laguna-run's engine at the same depth, prompt by prompt, and compares what ik reports
(rounds, drafted and accepted tokens by position, the generated text) with our stats. laguna-run
ends each generation with ik's budget rule here (``ik_tail_depth``) so that the last rounds
compare too. Both also decode plainly: where the two targets' greedy outputs part (a near-tie
the engines' kernels break differently), the speculative texts part as well. Exit 0 when ik
loads the file and every figure matches, 1 otherwise (ik's own error lines are printed), and 0
with a message when no ik build is found (``scripts/bench/build_peer.sh`` makes one; ``IK_LLAMA_BIN``
names another bin directory).

ik names the pre-FFN norm ``blk.N.post_attention_norm``; converters that still write
``blk.N.ffn_norm`` are refused by ik's loader. ``--rename-ffn-norm`` checks a renamed copy
(written next to the converted file), which is what ik would load once the converter writes
ik's names; on a file that already has them it changes nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scripts.recorded import write_json
from tests.helpers.ik_interop import (IkFailed, compare, ik_bin_dir, ik_named_copy, legacy_norm_tensors, mean_accepted,
                                      peer_snapshot, run_ik, run_ours)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-max", type=int, default=4)
    ap.add_argument("-n", "--n-predict", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=3, help="how many of runtime/data/prompts/code.txt's prompts")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--drafter", type=Path, help="drafter GGUF (default: the bundled one, converted by laguna-gguf convert)")
    ap.add_argument("--rename-ffn-norm", action="store_true",
                    help="check a copy with blk.N.ffn_norm renamed to ik's blk.N.post_attention_norm")
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.table import Table

    from laguna_dflash.runtime import assets

    console = Console(width=max(Console().width, 150))
    bin_dir = ik_bin_dir()
    if bin_dir is None:
        print("no ik_llama.cpp build found (scripts/bench/build_peer.sh builds one; IK_LLAMA_BIN names "
              "its bin directory): nothing checked")
        return 0
    target = assets.TINY_TARGET
    drafter = args.drafter or assets.converted_tiny_drafter()
    ours_drafter = drafter
    legacy = legacy_norm_tensors(drafter)
    if args.rename_ffn_norm and legacy:
        drafter = ik_named_copy(drafter)
        print(f"renamed {len(legacy)} tensors (ffn_norm -> post_attention_norm): {drafter}")
    elif legacy:
        print(f"{drafter.name} names its pre-FFN norms {legacy[0]} ... (ik looks for post_attention_norm)")
    prompts = assets.read_prompts(assets.CODE_PROMPTS)[:args.prompts]
    try:
        theirs = run_ik(bin_dir, target, drafter, args.n_max, prompts, args.n_predict, args.threads)
    except IkFailed as e:
        print(f"ik_llama.cpp did not run the pair: {drafter}")
        for line in e.lines:
            print(f"  ik: {line}")
        return 1
    ours = run_ours(target, ours_drafter, args.n_max, prompts, args.n_predict, args.threads)
    # plain decoding in both: where the targets' own greedy outputs part (a near-tie that the two
    # engines' kernels break differently), the speculative runs follow different texts
    ik_plain = run_ik(bin_dir, target, None, 0, prompts, args.n_predict, args.threads)
    ours_plain = run_ours(target, ours_drafter, 0, prompts, args.n_predict, args.threads)
    rows = compare(ours, theirs)
    for r, a, b in zip(rows, ours_plain, ik_plain):
        r["plain texts equal"] = a.text == b.text
    table = Table(title=f"laguna-run vs ik_llama.cpp, greedy, n_max={args.n_max}, {args.n_predict} tokens, "
                        f"-t {args.threads}", title_justify="left")
    for col in ("prompt", "plain texts equal", "spec texts equal", "rounds ours/ik", "drafted ours/ik",
                "accepted ours/ik", "accepted by position ours / ik"):
        table.add_column(col, justify="right")
    for r in rows:
        o, t = r["ours"], r["ik"]
        yes = {True: "yes", False: "no"}
        table.add_row(str(r["prompt"]), yes[r["plain texts equal"]], yes[r["equal"]["text"]],
                      *(f"{o[k]}/{t[k]}" for k in ("rounds", "drafted", "accepted")),
                      f"{o['accepted by position']} / {t['accepted by position']}")
    console.print(table)
    ok = all(all(r["equal"].values()) for r in rows)
    print(f"mean accepted per round: laguna-run {mean_accepted(ours):.2f}, ik {mean_accepted(theirs):.2f}; "
          + ("every figure equal" if ok else "they differ"))
    if args.json:
        write_json(args.json, {"drafter": str(drafter), "n_max": args.n_max, "n_predict": args.n_predict,
                               "peer_snapshot": {"ik_llama.cpp": peer_snapshot(bin_dir)},
                               "rows": rows, "mean_accepted": {"ours": mean_accepted(ours),
                                                               "ik": mean_accepted(theirs)}}, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
