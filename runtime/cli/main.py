"""laguna-run: speculative decoding for a Laguna target with its DFlash drafter.

    laguna-run -m target.gguf -md drafter.gguf -p "def quicksort(xs):" -n 128 --n-max 4
    laguna-run bench -m target.gguf -md drafter.gguf --prompts code.txt --n-max 1,2,4,8
    laguna-run serve -m target.gguf -md drafter.gguf --port 8080     (the OpenAI API: runtime/server)

The first argument picks the command (run when it is none of them); flag names follow llama.cpp
wherever one exists. Every user mistake is one line on stderr and exit code 2.
"""

from __future__ import annotations

import sys

import typer

from ...convert.errors import USER_ERROR_EXIT, UserError

from .interrupt import Interrupted
from .options import RpcFailed


def _click_exception_types() -> tuple[type, type]:
    """ClickException and Abort of the click that typer really runs: typer >= 0.2x ships its own
    copy (typer._click), whose classes the top-level ``click`` package does not match."""
    click_exception = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
    return click_exception, typer.Abort


def _usage_line(app: typer.Typer, prog_name: str) -> str | None:
    try:
        command = typer.main.get_command(app)
        with command.make_context(prog_name, [], resilient_parsing=True) as ctx:
            return ctx.get_usage()
    except Exception:  # the usage line is a courtesy: the error line below must print anyway
        return None


def _usage_error(e: Exception, app: typer.Typer, prog_name: str) -> None:
    """Usage line and one error line, as llama.cpp's tools print them."""
    ctx = getattr(e, "ctx", None)
    usage = ctx.get_usage() if ctx is not None else _usage_line(app, prog_name)
    if usage:
        print(usage, file=sys.stderr)
    message = e.format_message() if hasattr(e, "format_message") else str(e)
    print("error: " + " ".join(message.split()), file=sys.stderr)


def _invoke(app: typer.Typer, args: list[str], prog_name: str | None = None) -> int:
    click_exception, abort = _click_exception_types()
    prog_name = prog_name or "laguna-run"
    try:
        rv = app(args=args, prog_name=prog_name, standalone_mode=False)
        # without standalone mode, click returns an Exit's code (--help: 0; typer's Ctrl-C: 130)
        if rv == 130:
            print("interrupted (Ctrl-C)", file=sys.stderr)
        return rv if isinstance(rv, int) else 0
    except UserError as e:
        print("error: " + " ".join(str(e).split()), file=sys.stderr)  # one line, never wrapped
        return USER_ERROR_EXIT
    except Interrupted:
        return 130
    except RpcFailed as e:
        print("error: " + " ".join(str(e).split()), file=sys.stderr)
        return 1
    except typer.Exit as e:
        return e.exit_code
    except (KeyboardInterrupt, abort):
        print("interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    except click_exception as e:
        _usage_error(e, app, prog_name)
        return USER_ERROR_EXIT


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "bench":
        from .bench import bench_app

        code = _invoke(bench_app, args[1:], "laguna-run bench")
    elif args and args[0] == "serve":
        from .serve import serve_app

        code = _invoke(serve_app, args[1:], "laguna-run serve")
    else:
        from .run import run_app

        code = _invoke(run_app, args[1:] if args and args[0] == "run" else args)
    if argv is None:
        sys.exit(code)
    return code
