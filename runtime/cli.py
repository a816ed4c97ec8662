"""laguna-run: speculative decoding for a Laguna target with its DFlash drafter.

    laguna-run -m target.gguf -md drafter.gguf -p "def quicksort(xs):" -n 128 --n-max 4
    laguna-run bench -m target.gguf -md drafter.gguf --prompts code.txt --n-max 1,2,4,8
    laguna-run serve -m target.gguf -md drafter.gguf --port 8080     (runtime/server: the OpenAI API)

Flag names follow llama.cpp wherever one exists.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from ..convert.errors import USER_ERROR_EXIT, UserError
from ..convert.poolside import native_drafter_path

from . import assets, template_limits
from .chat_template import TEMPLATE_KEY, render_chat
from .outputs import GuardedStream, LiveTrace, OutputFailed, check_outputs, save_plot, write_text
from .prompt_bound import check_prompt_length
from .sampling import SamplingError, SamplingParams

err = Console(stderr=True)

run_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode="rich")
bench_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode="rich")

ModelOpt = Annotated[Path, typer.Option("-m", "--model", help="Target GGUF (a Laguna model).",
                                        show_default=False)]
DraftOpt = Annotated[Optional[Path], typer.Option(
    "-md", "--model-draft", help="Drafter GGUF written by [bold]laguna-gguf convert[/bold]. Without it: plain decoding.")]
CtxOpt = Annotated[int, typer.Option("-c", "--ctx-size", help="Context size (tokens) of both contexts.")]
BatchOpt = Annotated[int, typer.Option("-b", "--batch-size", help="Prompt chunk size (n_batch).")]
UbatchOpt = Annotated[int, typer.Option("-ub", "--ubatch-size", help="Microbatch size (n_ubatch); 0: the largest that "
                                        "keeps the target's sliding-window KV cache smallest.")]
ThreadsOpt = Annotated[int, typer.Option("-t", "--threads", help="CPU threads (0: all cores).")]
NglOpt = Annotated[Optional[int], typer.Option("-ngl", "--n-gpu-layers", help="Target layers on the GPU (default: all on cuda, 0 on cpu).")]
NgldOpt = Annotated[Optional[int], typer.Option("-ngld", "--n-gpu-layers-draft", help="Drafter layers on the GPU.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto | cpu | cuda. auto: CUDA when this wheel has it and a GPU is present.")]
DraftDeviceOpt = Annotated[Optional[str], typer.Option("--draft-device", help="Drafter device (default: the target's).")]
ForceOpt = Annotated[bool, typer.Option("--force-placement", help="Allow a CPU drafter next to a GPU target (it loses at every measured depth).")]
CacheOpt = Annotated[str, typer.Option("--cache-type", help="KV cache type of both contexts: f16, or f32 for bit-exact greedy comparisons with plain decoding.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show llama.cpp's log.")]
RpcOpt = Annotated[Optional[str], typer.Option("--rpc", help="Comma-separated rpc-servers HOST:PORT (laguna-rpc-server on each): the target's layers go there, the drafter stays here.")]
TensorSplitOpt = Annotated[Optional[str], typer.Option("--tensor-split", "-ts", help="Proportions of the offloaded layers per device, in --rpc order (then this machine's GPU), e.g. 3,1. Default: by free memory.")]
DraftRpcOpt = Annotated[bool, typer.Option("--draft-rpc", help="Put the drafter's layers on the --rpc servers too.")]
RpcTimeoutOpt = Annotated[float, typer.Option("--rpc-timeout", help="Seconds an RPC server may stay silent before it counts as lost (0: forever).")]


#: flag of each SamplingParams field, for error messages
SAMPLING_FLAGS = {"temperature": "--temp", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p",
                  "repeat_penalty": "--repeat-penalty", "repeat_last_n": "--repeat-last-n", "seed": "--seed"}
#: llama.cpp's thread pool refuses more (GGML_MAX_N_THREADS) with an abort
MAX_THREADS = 512
#: llama.cpp keeps sizes in 32-bit integers
MAX_SIZE = (1 << 31) - 1


class Interrupted(Exception):
    """Ctrl-C ended the work; what was done has been reported. Exit code 130."""


class RpcFailed(Exception):
    """An RPC server was lost during the work: one line, exit code 1 (not the user's mistake)."""


def parse_depth(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        depth = int(value)
    except ValueError:
        raise UserError(f"--n-max: expected an integer 0..15 or 'auto', found {value!r}") from None
    if depth < 0:
        raise UserError(f"--n-max: expected >= 0, found {depth}")
    return depth


def check_range(flag: str, value: int, lo: int, hi: int = MAX_SIZE, note: str = "") -> None:
    if not lo <= value <= hi:
        expected = f"an integer >= {lo}" if hi == MAX_SIZE and value < lo else f"{lo}..{hi}"
        raise UserError(f"{flag}: expected {expected}{note}, found {value}")


def sampling_params(**values) -> SamplingParams:
    try:
        return SamplingParams(**values)
    except SamplingError as e:
        note = " or -1 (a random one)" if e.field == "seed" else ""
        raise UserError(f"{SAMPLING_FLAGS.get(e.field, e.field)}: expected {e.expected}{note}, found {e.found}") from None


def check_sizes(ctx: int, batch: int, ubatch: int, threads: int) -> None:
    check_range("-c/--ctx-size", ctx, 1)
    check_range("-b/--batch-size", batch, 1)
    check_range("-ub/--ubatch-size", ubatch, 0, note=" (0: fit the sliding window)")
    check_range("-t/--threads", threads, 0, MAX_THREADS, " (0: all cores)")


def check_stops(stops: list[str] | None) -> tuple[str, ...]:
    for s in stops or ():
        if not s:
            raise UserError("--stop: expected a non-empty string, found ''")
    return tuple(stops or ())


def verify_rows(depth: int | str, max_draft: int) -> int:
    """Rows of the largest verify batch a depth makes: the bonus token and the drafts."""
    return (max_draft if depth == "auto" else int(depth)) + 1


def check_depths(depths: list, drafter: Path | None, batch: int) -> None:
    """--n-max against the drafter's block size, and -b against the largest verify batch;
    read from the drafter's GGUF header, before any model loads."""
    if drafter is None:
        deep = [d for d in depths if d != "auto" and d > 0]
        if deep:
            raise UserError(f"--n-max: {deep[0]} needs a drafter (-md DRAFTER.gguf); without one use --n-max 0")
        return
    from .pair import read_drafter

    spec = read_drafter(drafter)
    for d in depths:
        if d != "auto" and d > spec.max_draft:
            raise UserError(f"--n-max: expected 0..{spec.max_draft} (the drafter's block_size - 1) or 'auto', "
                            f"found {d}")
    rows = max(verify_rows(d, spec.max_draft) for d in depths)
    if batch < rows:
        deepest = max(depths, key=lambda d: verify_rows(d, spec.max_draft))
        raise UserError(f"-b/--batch-size: expected >= {rows} (a verify pass at --n-max {deepest} is {rows} rows: "
                        f"the bonus token and up to {rows - 1} drafts), found {batch}")


def engine_config(ctx: int, batch: int, ubatch: int, threads: int, ngl, ngld, device, draft_device, force,
                  verbose, kv_type="f16", prompt_cache=True, rpc=None, tensor_split=None, draft_rpc=False,
                  rpc_timeout=60.0):
    """EngineConfig and Placement from the model/placement flags (run, bench and serve)."""
    from .engine import EngineConfig
    from .placement import resolve

    if rpc is None:
        for flag, given in (("--tensor-split", tensor_split is not None), ("--draft-rpc", draft_rpc)):
            if given:
                raise UserError(f"{flag}: needs --rpc HOST:PORT[,HOST:PORT...] (the servers to split over)")
    else:
        from . import rpc as rpc_mod

        endpoints = rpc_mod.parse_endpoints(rpc)
        split = rpc_mod.parse_tensor_split(tensor_split)
        if not rpc_timeout >= 0:
            raise UserError(f"--rpc-timeout: expected seconds >= 0 (0: forever), found {rpc_timeout}")
        if ngl is not None:
            check_range("-ngl/--n-gpu-layers", ngl, 1, note=" (with --rpc: the last N layers go to the servers)")
    placement = resolve(device, draft_device, None if rpc else ngl, ngld, force)
    cfg = EngineConfig(n_ctx=ctx, n_batch=batch, n_ubatch=min(ubatch, batch) or None, n_threads=threads,
                       n_gpu_layers=placement.n_gpu_layers, n_gpu_layers_draft=placement.n_gpu_layers_draft,
                       kv_type=kv_type, verbose=verbose, prompt_cache=prompt_cache)
    if rpc is not None:
        cfg.rpc, cfg.tensor_split, cfg.draft_rpc, cfg.rpc_timeout_s = endpoints, split, draft_rpc, rpc_timeout
        cfg.n_gpu_layers = ngl or 0  # 0: every layer (the head stays here)
        cfg.rpc_local_gpu = placement.target_device == "cuda"
        placement = _RpcPlacement(cfg)
    return cfg, placement


class _RpcPlacement:
    def __init__(self, cfg) -> None:
        self.cfg = cfg

    def describe(self) -> str:
        from .rpc import describe

        return describe(self.cfg)


def _engine(model: Path, draft: Path | None, ctx: int, batch: int, ubatch: int, threads: int,
            ngl, ngld, device, draft_device, force, verbose, kv_type="f16", prompt_cache=True, **rpc):
    from .engine import Engine
    from .llama import LlamaError

    cfg, placement = engine_config(ctx, batch, ubatch, threads, ngl, ngld, device, draft_device, force, verbose,
                                   kv_type, prompt_cache, **rpc)
    from .rpc import RpcError

    try:
        return Engine.load(model, draft, cfg), placement
    except RpcError as e:  # a server lost while the models loaded: not the user's mistake
        raise RpcFailed(str(e)) from None
    except LlamaError as e:
        raise UserError(str(e)) from None


def check_cache_type(kv_type: str) -> None:
    if kv_type not in ("f16", "f32"):
        raise UserError(f"--cache-type: expected f16 or f32, found {kv_type!r}")


def _apply_chat(engine, prompt: str) -> str:
    path = engine.target.path
    try:
        template = engine.target.chat_template()
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: {TEMPLATE_KEY}: expected UTF-8 text, found invalid bytes ({e.reason})") from None
    if not template:
        raise UserError(f"{path}: {TEMPLATE_KEY}: expected a chat template, found none")
    with template_limits.bounded(max_chars=template_limits.chars_for_context(engine.ctx.n_ctx)):
        return render_chat(template, [{"role": "user", "content": prompt}], source=path,
                           add_generation_prompt=True, bos_token=engine.target.special_text("bos"),
                           eos_token=engine.target.special_text("eos"))


class CtrlC:
    """Inside the block, a first Ctrl-C asks the work to stop at its next round boundary (so the
    partial stats are complete and the trace whole); a second one interrupts at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def __call__(self) -> bool:
        return self.requested

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> "CtrlC":
        # signal handlers can only be set from the main thread (an embedding caller may not be)
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


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


@run_app.command()
def run(
    model: ModelOpt = None,
    model_draft: DraftOpt = None,
    prompt: Annotated[Optional[str], typer.Option("-p", "--prompt", help="Prompt text.")] = None,
    file: Annotated[Optional[Path], typer.Option("-f", "--file", help="Read the prompt from a file.")] = None,
    n_predict: Annotated[int, typer.Option("-n", "--n-predict", help="Tokens to generate.")] = 128,
    n_max: Annotated[Optional[str], typer.Option("--n-max", "--draft-max", show_default=False, help="Draft depth per round: 0 = no speculation, 1..15, or 'auto' (tuned online). Default: 4 with a drafter, 0 without.")] = None,
    chat: Annotated[bool, typer.Option("--chat", help="Wrap the prompt in the GGUF's chat template.")] = False,
    ctx_size: CtxOpt = 4096,
    batch_size: BatchOpt = 512,
    ubatch_size: UbatchOpt = 0,
    threads: ThreadsOpt = 0,
    n_gpu_layers: NglOpt = None,
    n_gpu_layers_draft: NgldOpt = None,
    device: DeviceOpt = "auto",
    draft_device: DraftDeviceOpt = None,
    force_placement: ForceOpt = False,
    temp: Annotated[float, typer.Option("--temp", help="Temperature; 0 = greedy (exact: same tokens as plain decoding).")] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k")] = 40,
    top_p: Annotated[float, typer.Option("--top-p")] = 0.95,
    min_p: Annotated[float, typer.Option("--min-p")] = 0.05,
    repeat_penalty: Annotated[float, typer.Option("--repeat-penalty")] = 1.0,
    seed: Annotated[Optional[int], typer.Option("--seed", "-s", help="RNG seed for sampling (-1: a random one).")] = None,
    stop: Annotated[Optional[list[str]], typer.Option("--stop", help="Stop string (repeatable).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object (text + stats) instead of streaming.")] = False,
    trace: Annotated[Optional[Path], typer.Option("--trace", help="Write one JSON line per round to this file.")] = None,
    cache_type: CacheOpt = "f16",
    verbose: VerboseOpt = False,
    rpc: RpcOpt = None,
    tensor_split: TensorSplitOpt = None,
    draft_rpc: DraftRpcOpt = False,
    rpc_timeout: RpcTimeoutOpt = 60.0,
) -> None:
    """Generate text from a Laguna target, drafting with its DFlash drafter.

    Greedy output (the default, --temp 0) is token-for-token the target's own greedy output;
    with sampling every token is drawn from the target's distribution (sample-and-compare).
    """
    # every flag is checked before anything is read or loaded
    sampling = sampling_params(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p,
                               repeat_penalty=repeat_penalty, seed=None if seed == -1 else seed)
    check_range("-n/--n-predict", n_predict, 0)
    check_sizes(ctx_size, batch_size, ubatch_size, threads)
    check_cache_type(cache_type)
    depth = parse_depth(n_max) if n_max is not None else None
    stops = check_stops(stop)
    if (prompt is None) == (file is None):
        raise UserError("give the prompt with exactly one of -p TEXT or -f FILE")
    given_draft, bundled = model_draft, assets.TINY_DIR if model is None else None
    if model is None:
        model, model_draft = assets.default_pair(model_draft)
    model_draft = model_draft and native_drafter_path(model_draft, model)  # Poolside's layout: its rewrite
    outs = check_outputs({"--trace": trace}, inputs=[model, given_draft, model_draft, file, bundled])
    if file is not None:
        prompt = assets.read_prompt_text(file)
    if depth is None:
        depth = 4 if model_draft is not None else 0
    check_depths([depth], model_draft, batch_size)
    from .engine import GenerateOptions

    engine, placement = _engine(model, model_draft, ctx_size, batch_size, ubatch_size, threads,
                                n_gpu_layers, n_gpu_layers_draft, device, draft_device, force_placement, verbose,
                                kv_type=cache_type, rpc=rpc, tensor_split=tensor_split, draft_rpc=draft_rpc,
                                rpc_timeout=rpc_timeout)
    from .rpc import RpcError as RpcLost

    out = GuardedStream(sys.stdout)
    with engine:
        if chat:
            prompt = _apply_chat(engine, prompt)
        check_prompt_length(prompt, engine, ctx_size, "-f" if file is not None else "-p")
        ctrl_c = CtrlC()
        # the trace is line-buffered (it can be followed live) and renamed into place at the end
        with LiveTrace(outs.get("--trace")) as live:
            opts = GenerateOptions(
                n_predict=n_predict, n_max=depth, stop=stops, sampling=sampling,
                should_stop=lambda: ctrl_c() or live.should_stop() or out.failed, trace=live.callback)
            try:
                if json_out:
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

                    show(prompt if not chat else "")
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


@bench_app.command()
def bench(
    model: ModelOpt = None,
    model_draft: DraftOpt = None,
    prompts: Annotated[Optional[list[Path]], typer.Option("--prompts", help="Prompt file(s): prompts separated by lines of '---'. Default: the bundled held-out code prompts.")] = None,
    n_max: Annotated[str, typer.Option("--n-max", "--draft-max", help="Comma-separated depths to compare with plain decoding (0 is always measured), e.g. 1,2,4,8,auto.")] = "4",
    n_predict: Annotated[int, typer.Option("-n", "--n-predict", help="Tokens per prompt.")] = 96,
    repeats: Annotated[int, typer.Option("--repeats", help="Interleaved repetitions of the whole set (noise control).")] = 1,
    ctx_size: CtxOpt = 4096,
    batch_size: BatchOpt = 512,
    ubatch_size: UbatchOpt = 0,
    threads: ThreadsOpt = 0,
    n_gpu_layers: NglOpt = None,
    n_gpu_layers_draft: NgldOpt = None,
    device: DeviceOpt = "auto",
    draft_device: DraftDeviceOpt = None,
    force_placement: ForceOpt = False,
    sweep: Annotated[bool, typer.Option("--sweep", help="Content kinds (code, table, prose) x depths 1,2,4,8,15,auto (overridable with --prompts / --n-max).")] = False,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the results as JSON here.")] = None,
    png: Annotated[Optional[Path], typer.Option("--png", help="Draw the speedups as a PNG chart here.")] = None,
    cache_type: CacheOpt = "f16",
    verbose: VerboseOpt = False,
    rpc: RpcOpt = None,
    tensor_split: TensorSplitOpt = None,
    draft_rpc: DraftRpcOpt = False,
    rpc_timeout: RpcTimeoutOpt = 60.0,
) -> None:
    """Tokens/s of plain decoding and of each draft depth, measured in one process (greedy)."""
    from .bench import SWEEP_CONTENT, SWEEP_DEPTHS, bench_table, plot, run_bench

    # every flag and input is checked before the first model loads: a bench must not lose its
    # results at the end to an unwritable path or a missing plotting library
    check_range("-n/--n-predict", n_predict, 1)
    check_range("--repeats", repeats, 1)
    check_sizes(ctx_size, batch_size, ubatch_size, threads)
    check_cache_type(cache_type)
    if sweep and n_max == "4":
        depths = list(SWEEP_DEPTHS)
    else:
        depths = [parse_depth(d.strip()) for d in n_max.split(",") if d.strip()]
    if prompts:
        files = prompts
    elif sweep:
        files = [assets.PROMPTS_DIR / f"{c}.txt" for c in SWEEP_CONTENT]
    else:
        files = [assets.CODE_PROMPTS]
    prompt_sets = {f.stem: assets.read_prompts(f) for f in files}
    given_draft, bundled = model_draft, assets.TINY_DIR if model is None else None
    if model is None:
        model, model_draft = assets.default_pair(model_draft)
    model_draft = model_draft and native_drafter_path(model_draft, model)  # Poolside's layout: its rewrite
    if model_draft is None:
        raise UserError("bench compares speculative decoding with plain decoding: give a drafter with -md")
    outs = check_outputs({"--json": json_out, "--png": png},
                         inputs=[model, given_draft, model_draft, *files, bundled])
    check_depths(depths, model_draft, batch_size)
    engine, placement = _engine(model, model_draft, ctx_size, batch_size, ubatch_size, threads,
                                n_gpu_layers, n_gpu_layers_draft, device, draft_device, force_placement, verbose,
                                kv_type=cache_type, prompt_cache=False,  # each prompt measured from scratch
                                rpc=rpc, tensor_split=tensor_split, draft_rpc=draft_rpc, rpc_timeout=rpc_timeout)
    from .rpc import RpcError as RpcLost

    ctrl_c = CtrlC()
    with engine:
        for name, texts in prompt_sets.items():
            for text in texts:
                check_prompt_length(text, engine, ctx_size, f"--prompts {name}")
        try:
            with ctrl_c:
                result = run_bench(engine, prompt_sets, depths, n_predict, repeats, console=err, should_stop=ctrl_c)
        except ValueError as e:
            raise UserError(str(e)) from None
        except RpcLost as e:
            raise RpcFailed(str(e)) from None
    result["placement"] = placement.describe()
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
        Console(file=GuardedStream(sys.stdout)).print(bench_table(result))
    except OutputFailed as e:
        Console(stderr=True).print(bench_table(result))
        failed.append(OutputFailed(f"{e}; the table was written to stderr instead"))
    if failed:
        raise failed[0]
    if ctrl_c.requested:
        done = result.get("prompts_measured", {})
        print(f"interrupted (Ctrl-C): the results cover the prompts every depth completed "
              f"({', '.join(f'{k} {v}' for k, v in done.items())})", file=sys.stderr)
        raise Interrupted()


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
    prog_name = prog_name or ("laguna-run" if app is run_app else "laguna-run bench")
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
        code = _invoke(bench_app, args[1:])
    elif args and args[0] == "serve":
        from .server.cli import serve_app

        code = _invoke(serve_app, args[1:], "laguna-run serve")
    else:
        code = _invoke(run_app, args[1:] if args and args[0] == "run" else args)
    if argv is None:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
