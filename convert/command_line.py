"""The command-line layer laguna-gguf and laguna-run both stand on: one app and command class,
one way to declare an option, one mapping from errors to exit codes.

    app = App(help="...")

    @app.command("convert")
    def convert(src: Annotated[Path, argument("SRC", help="...")],
                quiet: Annotated[bool, switch("--quiet", "-q", help="...")] = False): ...

    sys.exit(run(app, sys.argv[1:], "laguna-gguf"))

A user's mistake (:class:`UserError`, a usage error) is one line on stderr and exit code 2; work
that failed for another reason (:class:`Failed`) one line and 1; Ctrl-C 130. The help shows no
value type for a flag that takes none, and every option has a help line (``help`` is required).
It sits in convert/ because runtime/ stands on convert/, never the other way round.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import typer
import typer.core

from .errors import USER_ERROR_EXIT, UserError

#: Ctrl-C, as a shell reports a command stopped by SIGINT
INTERRUPTED_EXIT = 130


class Failed(Exception):
    """Work that failed for a reason that is not the user's mistake: one line, exit code 1."""


class Interrupted(Exception):
    """Stopped by Ctrl-C after the command reported what it had done: exit code 130, no more lines."""


def flag(*names: str, help: str, **kw: Any) -> Any:
    """An option that takes a value."""
    return typer.Option(*names, help=help, **kw)


def switch(*names: str, help: str, **kw: Any) -> Any:
    """A boolean option: given or not (the help shows no value type for it)."""
    return typer.Option(*names, help=help, metavar="", **kw)


def argument(metavar: str, help: str, **kw: Any) -> Any:
    return typer.Argument(metavar=metavar, help=help, show_default=False, **kw)


def _one_line(text: str) -> str:
    return "error: " + " ".join(text.split())


def _errors_to_exit_codes(invoke):
    """Run a command's callback; a UserError, Failed or Ctrl-C becomes its line and exit code."""
    try:
        return invoke()
    except UserError as e:
        print(_one_line(str(e)), file=sys.stderr)
        raise typer.Exit(USER_ERROR_EXIT) from None
    except Failed as e:
        print(_one_line(str(e)), file=sys.stderr)
        raise typer.Exit(1) from None
    except Interrupted:
        raise typer.Exit(INTERRUPTED_EXIT) from None
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C)", file=sys.stderr)
        raise typer.Exit(INTERRUPTED_EXIT) from None


def _click_exception() -> type:
    """ClickException of the click typer really runs (typer ships its own copy, typer._click)."""
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


class _Main:
    """``main`` of the command or group a program starts at: usage errors as llama.cpp's tools
    print them (the usage line, then one error line), exit code 2."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        click_exception = _click_exception()
        try:
            rv = super().main(args, prog_name, standalone_mode=False, **extra)  # type: ignore[misc]
            # without standalone mode, click returns an Exit's code (--help: 0) or the callback's value
            code = rv if isinstance(rv, int) and not isinstance(rv, bool) else 0
        except typer.Exit as e:
            code = e.exit_code
        except (KeyboardInterrupt, typer.Abort):
            print("interrupted (Ctrl-C)", file=sys.stderr)
            code = INTERRUPTED_EXIT
        except click_exception as e:
            code = self._usage_error(e, prog_name)
        if standalone_mode:
            sys.exit(code)
        return code

    def _usage_error(self, e: Exception, prog_name: str | None) -> int:
        if type(e).__name__ == "NoArgsIsHelpError":  # no arguments: the help itself
            e.show()  # type: ignore[attr-defined]
            return e.exit_code  # type: ignore[attr-defined]
        ctx = getattr(e, "ctx", None)
        try:
            if ctx is None:
                ctx = self.make_context(prog_name or "", [], resilient_parsing=True)  # type: ignore[attr-defined]
            print(ctx.get_usage(), file=sys.stderr)
        except Exception:  # the usage line is a courtesy: the error line below must print anyway
            pass
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        print(_one_line(message), file=sys.stderr)
        return USER_ERROR_EXIT


def _no_value_types_on_flags(command) -> None:
    for param in command.params:
        if getattr(param, "is_flag", False):
            param.metavar = ""


class Command(_Main, typer.core.TyperCommand):
    """A command whose help shows no value type for a flag (typer's shows ``<bool>``) and whose
    errors are one line with an exit code."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        _no_value_types_on_flags(self)

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option

    def invoke(self, ctx):
        return _errors_to_exit_codes(lambda: super(Command, self).invoke(ctx))


class Group(_Main, typer.core.TyperGroup):
    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option


class App(typer.Typer):
    """typer's app with this layer's command classes, rich help, no shell completion and no
    pretty tracebacks (an error is one line)."""

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("cls", Group)
        kw.setdefault("add_completion", False)
        kw.setdefault("pretty_exceptions_enable", False)
        kw.setdefault("rich_markup_mode", "rich")
        super().__init__(**kw)

    def command(self, *args: Any, **kw: Any):
        kw.setdefault("cls", Command)
        return super().command(*args, **kw)


def run(app: typer.Typer, args: Sequence[str], prog_name: str) -> int:
    """Run ``app`` on ``args``; the exit code (errors already printed)."""
    return typer.main.get_command(app).main(list(args), prog_name, standalone_mode=False)
