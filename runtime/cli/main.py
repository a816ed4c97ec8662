"""laguna-run: speculative decoding for a Laguna target with its DFlash drafter.

    laguna-run -m target.gguf -md drafter.gguf -p "def quicksort(xs):" -n 128 --n-max 4
    laguna-run bench -m target.gguf -md drafter.gguf --prompts code.txt --n-max 1,2,4,8
    laguna-run serve -m target.gguf -md drafter.gguf --port 8080     (the OpenAI API: runtime/server)
    laguna-run chat -m target.gguf -md drafter.gguf --think          (a multi-turn chat, as llama-cli -cnv)
    laguna-run setup [--cuda] [--check]       (the patched llama-cpp-python: build or reuse it, install it)

The first argument picks the command (run when it is none of them); flag names follow llama.cpp
wherever one exists. Every user mistake is one line on stderr and exit code 2.
"""

from __future__ import annotations

import sys

from ...convert.command_line import run


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    # each command's module is imported when it is named, so a run starts fast
    if args and args[0] == "bench":
        from .bench import bench_app

        code = run(bench_app, args[1:], "laguna-run bench")
    elif args and args[0] == "setup":
        from .setup import setup_app

        code = run(setup_app, args[1:], "laguna-run setup")
    elif args and args[0] == "serve":
        from .serve import serve_app

        code = run(serve_app, args[1:], "laguna-run serve")
    else:
        from .run import run_app

        if args and args[0] == "chat":  # llama-cli -cnv's session, under a name of its own
            args = ["run", "--conversation", *args[1:]]
        code = run(run_app, args[1:] if args and args[0] == "run" else args, "laguna-run")
    if argv is None:
        sys.exit(code)
    return code
