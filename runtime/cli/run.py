"""laguna-run [run]: generate text from a Laguna target, drafting with its DFlash drafter;
with --chat through its chat template, and with -cnv (``laguna-run chat``) a multi-turn chat."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

from rich.table import Table

from ...convert.errors import UserError

from .. import assets
from ..outputs import GuardedStream, LiveTrace, OutputFailed, check_outputs
from ..prompt_bound import check_prompt_length
from .interrupt import CtrlC, Interrupted
from .chat import ChatTemplateFileOpt, ChatTemplateKwargsOpt, SystemOpt, ThinkOpt, chat_once, chat_template, \
    read_template_file, run_conversation, template_kwargs
from ...convert.command_line import App, flag, switch
from ..params import REQUEST
from .options import NMaxOpt, PairFlags, RpcFailed, engine_config, err, open_engine, pair_flags, pair_inputs, \
    request_options, sampling_flags

SUBCOMMANDS = """Commands (the first argument; run is the default):

  run    generate from a prompt (these options)
  chat   a multi-turn chat in the terminal: laguna-run -cnv, these options
  bench  tokens/s of plain decoding and each draft depth: laguna-run bench --help
  serve  the OpenAI-compatible HTTP server: laguna-run serve --help"""

run_app = App()


def _constraint(grammar, grammar_file, json_schema, json_schema_file):
    """The output constraint of llama.cpp's flags, checked as far as it can be before the pair
    loads (UserError naming the flag)."""
    if grammar is None and grammar_file is None and json_schema is None and json_schema_file is None:
        return None
    from ..constraint import ConstraintError, constraint_from_flags, precheck

    try:
        return precheck(constraint_from_flags(grammar, grammar_file, json_schema, json_schema_file))
    except ConstraintError as e:
        raise UserError(str(e)) from None


def stats_table(stats, title: str = "laguna-run") -> Table:
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column(justify="right")
    d = stats.as_dict()
    t.add_row("prompt tokens", str(d["n_prompt"]))
    t.add_row("generated tokens", str(d["n_generated"]))
    t.add_row("rounds", str(d["rounds"]))
    t.add_row("drafted / accepted", f"{d['drafted']} / {d['accepted']}")
    t.add_row("mean accepted per round", f"{d['mean_accepted_per_round']:.2f}")
    if d["acceptance_by_position"]:
        t.add_row("acceptance by position", " ".join(f"{a:.2f}" for a in d["acceptance_by_position"]))
    if len(d["depth_rounds"]) > 1:
        t.add_row("rounds by depth", " ".join(f"{k}:{v}" for k, v in d["depth_rounds"].items()))
    t.add_row("tokens/s", f"{d['tokens_per_s']:.1f}")
    ts = d["time_s"]
    t.add_row("time: prefill", f"{ts['prefill']:.3f} s")
    t.add_row("time: draft / verify / host",
              f"{ts['draft']:.3f} / {ts['verify']:.3f} / {ts['host']:.3f} s")
    return t


@run_app.command(epilog=SUBCOMMANDS.replace("\n", "\n\n"))
@pair_flags
@sampling_flags
def run(
    prompt: REQUEST["prompt"].annotated() = None,
    file: Annotated[Optional[Path], flag("-f", "--file", help="Read the prompt from a file ('-': standard input).")] = None,
    n_predict: REQUEST["n_predict"].annotated() = REQUEST["n_predict"].default,
    n_max: NMaxOpt = None,
    chat: Annotated[bool, switch("--chat", help=(
        "Wrap the prompt in the chat template and read the reply as Laguna writes it: reasoning (on stderr) "
        "apart from the answer, tool calls."))] = False,
    conversation: Annotated[bool, switch("-cnv", "--conversation", help=(
        "A multi-turn chat (also: laguna-run chat): one message per line on standard input, /reset, /exit; "
        "answers on stdout, reasoning and per-turn stats on stderr."))] = False,
    system: SystemOpt = None,
    chat_template_file: ChatTemplateFileOpt = None,
    chat_template_kwargs: ChatTemplateKwargsOpt = None,
    think: ThinkOpt = None,
    stop: REQUEST["stop"].annotated() = None,
    json_out: Annotated[bool, switch("--json", help=(
        "Print one JSON object (text, the chat message with reasoning and tool calls, stats) instead of "
        "streaming; with -cnv one per turn."))] = False,
    trace: Annotated[Optional[Path], flag("--trace", help="Write one JSON line per round to this file.")] = None,
    grammar: Annotated[Optional[str], flag("--grammar", help="Constrain the output to this GBNF grammar (or Lark, llguidance's dialect).")] = None,
    grammar_file: Annotated[Optional[Path], flag("--grammar-file", help="... read from a file.")] = None,
    json_schema: Annotated[Optional[str], flag("-j", "--json-schema", help="Constrain the output to JSON valid under this schema.")] = None,
    json_schema_file: Annotated[Optional[Path], flag("-jf", "--json-schema-file", help="... read from a file.")] = None,
    *,
    flags: PairFlags,
    sampling: dict,
) -> None:
    """Generate text from a Laguna target, drafting with its DFlash drafter.

    Greedy output (the default, --temp 0) is token-for-token the target's own greedy output;
    with sampling every token is drawn from the target's distribution (sample-and-compare).
    """
    # every flag is checked before anything is read or loaded
    request = dict(n_predict=n_predict, stop=tuple(stop or ()))
    flags.check()
    request_options([0 if n_max is None else n_max], sampling=dict(sampling), **request)  # before the pair
    chat = chat or conversation
    if not chat:
        given = [f for f, v in (("-sys/--system-prompt", system), ("--chat-template-file", chat_template_file),
                                ("--chat-template-kwargs", chat_template_kwargs), ("--think", think)) if v is not None]
        if given:
            raise UserError(f"{given[0]}: needs --chat (or laguna-run chat)")
    kwargs = template_kwargs(chat_template_kwargs, think) if chat else {}
    template_text = read_template_file(chat_template_file) if chat else None
    if conversation:
        if prompt is not None or file is not None:
            raise UserError("-p/-f: a chat reads its messages from standard input (the system message: "
                            "-sys/--system-prompt)")
        if trace is not None:
            raise UserError("--trace: one generation's rounds; not with a chat")
    elif (prompt is None) == (file is None):
        raise UserError("give the prompt with exactly one of -p TEXT or -f FILE")
    stdin = Path("/dev/stdin") if file is not None and str(file) == "-" else file  # -f -: the file behind it
    check_outputs({"--trace": trace}, inputs=[stdin])  # the flag's own mistakes first, then against the models
    if file is not None:
        prompt = assets.read_prompt_text(file)
    constraint = _constraint(grammar, grammar_file, json_schema, json_schema_file)
    pair = flags.open_pair()
    outs = check_outputs({"--trace": trace}, inputs=[*pair_inputs(flags, pair), stdin])
    depth = n_max if n_max is not None else 4 if pair.drafter is not None else 0
    (opts,) = request_options([depth], pair, flags, sampling=sampling, **request)
    cfg, placement = engine_config(flags)
    engine = open_engine(pair, cfg)
    from ..rpc import RpcError as RpcLost

    out = GuardedStream(sys.stdout)
    with engine:
        if chat:
            from ..chat_session import ChatSession

            session = ChatSession(engine, chat_template(engine.target, chat_template_file, template_text),
                                  system=system, template_kwargs=kwargs)
        if constraint is not None:
            from ..constraint import ConstraintError, compile_constraint

            try:
                opts.constraint = compile_constraint(constraint, engine.target)
            except ConstraintError as e:
                raise UserError(str(e)) from None
        if conversation:
            return run_conversation(session, opts, json_out, placement)
        check_prompt_length(prompt, engine, flags.ctx_size, "-f" if file is not None else "-p")
        ctrl_c = CtrlC()
        # the trace is line-buffered (it can be followed live) and renamed into place at the end
        with LiveTrace(outs.get("--trace")) as live:
            opts.should_stop = lambda: ctrl_c() or live.should_stop() or out.failed
            opts.trace = live.callback
            try:
                if chat:
                    chat_once(session, prompt, opts, json_out, placement, ctrl_c, stats_table)
                elif json_out:
                    with ctrl_c:
                        res = engine.generate(prompt, opts)
                    text = json.dumps({"text": res.text, "tokens": res.tokens, "stop_reason": res.stop_reason,
                                       "placement": placement.describe(), "stats": res.stats.as_dict()}, indent=2)
                    try:
                        out.write(text + "\n")
                        out.flush()
                    except OutputFailed as e:  # the result goes to stderr instead
                        print(text, file=sys.stderr)
                        raise OutputFailed(f"{e}; the JSON was written to stderr instead") from None
                else:
                    def show(text: str) -> None:
                        try:
                            out.write(text)
                            out.flush()
                        except OutputFailed:  # should_stop ends the generation at its next round;
                            pass  # the error is reported below, after the stats

                    show(prompt)
                    with ctrl_c:
                        for piece in engine.stream(prompt, opts):
                            show(piece)
                    show("\n")
                    err.print(placement.describe(), highlight=False)
                    err.print(stats_table(engine.last_stats))
                    if out.error is not None:
                        raise OutputFailed(f"{out.error}; generation stopped there, the stats above cover it")
            except ValueError as e:
                raise UserError(str(e)) from None
            except RpcLost as e:
                raise RpcFailed(str(e)) from None
        if live.error is not None:
            raise OutputFailed(f"{live.error}; generation stopped at that round")
    if ctrl_c.requested:
        print("interrupted (Ctrl-C): the stats above cover the tokens generated so far", file=sys.stderr)
        raise Interrupted()

