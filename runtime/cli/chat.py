"""laguna-run's chat flags (run --chat, run -cnv / laguna-run chat, serve), declared once, and
the two chat modes of run: one turn (--chat) and a session (-cnv) over runtime/chat_session.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

from ...convert.command_line import flag, switch
from ...convert.errors import UserError

from .. import assets
from .interrupt import CtrlC, Interrupted
from .options import RpcFailed, err, flag_error

ChatTemplateFileOpt = Annotated[Optional[Path], flag("--chat-template-file", help=(
    "Jinja chat template to use instead of the GGUF's tokenizer.chat_template."))]
ChatTemplateKwargsOpt = Annotated[Optional[str], flag("--chat-template-kwargs", metavar="JSON", help=(
    "Chat template variables, a JSON object, e.g. '{\"enable_thinking\": true}' (a request's own "
    "chat_template_kwargs replace them)."))]
ThinkOpt = Annotated[Optional[bool], switch("--think/--no-think", show_default=False, help=(
    "Chat: the template's enable_thinking on or off (default: the template's own); the reasoning is shown "
    "apart from the answer."))]
SystemOpt = Annotated[Optional[str], flag("-sys", "--system-prompt", help="The chat's system message.")]


def read_template_file(path: Path | None) -> str | None:
    """The text of --chat-template-file (None without one), read before any model loads."""
    if path is None:
        return None
    text = assets.read_prompt_text(path)  # UTF-8, one-line errors
    if not text.strip():
        raise UserError(f"{path}: --chat-template-file: expected a Jinja chat template, found an empty file")
    return text


def template_kwargs(text: str | None, think: bool | None = None) -> dict:
    """--chat-template-kwargs as a dict (one line naming the flag when it is not a JSON object);
    --think / --no-think set enable_thinking over it."""
    from ..chat_template import check_template_kwargs

    kwargs = {}
    if text is not None:
        try:
            kwargs = json.loads(text)
        except ValueError as e:
            raise UserError(f"--chat-template-kwargs: expected a JSON object, found text that is not JSON ({e})") \
                from None
        if not isinstance(kwargs, dict):
            raise UserError(f"--chat-template-kwargs: expected a JSON object, found {type(kwargs).__name__}")
    if think is not None:
        kwargs["enable_thinking"] = think
    return check_template_kwargs(kwargs, "--chat-template-kwargs")


def chat_template(target, file: Path | None, text: str | None):
    """The ChatTemplate of --chat-template-file's ``text``, else the GGUF's."""
    from ..chat_template import TEMPLATE_KEY, ChatTemplate

    if text is not None:
        return ChatTemplate(text, file)
    try:
        text = target.chat_template()
    except UnicodeDecodeError as e:
        raise UserError(f"{target.path}: {TEMPLATE_KEY}: expected UTF-8 text, found invalid bytes ({e.reason})") \
            from None
    if not text:
        raise UserError(f"{target.path}: {TEMPLATE_KEY}: expected a chat template, found none (give one with "
                        "--chat-template-file)")
    return ChatTemplate(text, target.path)


def chat_once(session, prompt: str, opts, json_out: bool, placement, ctrl_c: CtrlC, stats_table) -> None:
    """--chat: one turn; the answer on stdout, the reasoning on stderr (or all in one JSON object)."""
    from ..chat_session import TerminalPrinter, turn_json

    printer = None if json_out else TerminalPrinter()
    with ctrl_c:
        result = session.ask(prompt, opts, printer)
    if json_out:
        print(json.dumps({"text": result.text, "placement": placement.describe(), **turn_json(result)}, indent=2,
                         ensure_ascii=False))
        return
    printer.end_turn()
    err.print(placement.describe(), highlight=False)
    err.print(stats_table(result.stats))


def run_conversation(session, opts, json_out: bool, placement) -> None:
    """-cnv: messages from standard input until its end or /exit."""
    from ..chat_session import run_session

    from ..request import RequestError
    from ..rpc import RpcError

    err.print(placement.describe(), highlight=False)
    ctrl_c = CtrlC()
    opts.should_stop = ctrl_c
    try:
        with ctrl_c:
            run_session(session, opts, sys.stdin, json_lines=json_out)
    except RequestError as e:  # e.g. the conversation outgrew the context: named by its flag
        raise flag_error(e) from None
    except ValueError as e:
        raise UserError(str(e)) from None
    except RpcError as e:
        raise RpcFailed(str(e)) from None
    if ctrl_c.requested:
        print("interrupted (Ctrl-C)", file=sys.stderr)
        raise Interrupted()
