"""laguna-run: speculative decoding for a Laguna target with its DFlash drafter.

    laguna-run -m target.gguf -md drafter.gguf -p "def quicksort(xs):" -n 128 --n-max 4
    laguna-run bench -m target.gguf -md drafter.gguf --prompts code.txt --n-max 1,2,4,8

Flag names follow llama.cpp wherever one exists.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from convert.errors import USER_ERROR_EXIT, UserError
from convert.poolside import native_drafter_path

from . import assets
from .sampling import SamplingParams

err = Console(stderr=True)

run_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode="rich")
bench_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode="rich")

ModelOpt = Annotated[Path, typer.Option("-m", "--model", help="Target GGUF (a Laguna model).",
                                        show_default=False)]
DraftOpt = Annotated[Optional[Path], typer.Option(
    "-md", "--model-draft", help="Drafter GGUF written by [bold]laguna-gguf convert[/bold]. Without it: plain decoding.")]
CtxOpt = Annotated[int, typer.Option("-c", "--ctx-size", help="Context size (tokens) of both contexts.")]
BatchOpt = Annotated[int, typer.Option("-b", "--batch-size", help="Prompt chunk size (n_batch).")]
UbatchOpt = Annotated[int, typer.Option("-ub", "--ubatch-size", help="Microbatch size (n_ubatch).")]
ThreadsOpt = Annotated[int, typer.Option("-t", "--threads", help="CPU threads (0: all cores).")]
NglOpt = Annotated[Optional[int], typer.Option("-ngl", "--n-gpu-layers", help="Target layers on the GPU (default: all on cuda, 0 on cpu).")]
NgldOpt = Annotated[Optional[int], typer.Option("-ngld", "--n-gpu-layers-draft", help="Drafter layers on the GPU.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto | cpu | cuda. auto: CUDA when this wheel has it and a GPU is present.")]
DraftDeviceOpt = Annotated[Optional[str], typer.Option("--draft-device", help="Drafter device (default: the target's).")]
ForceOpt = Annotated[bool, typer.Option("--force-placement", help="Allow a CPU drafter next to a GPU target (it loses at every measured depth).")]
CacheOpt = Annotated[str, typer.Option("--cache-type", help="KV cache type of both contexts: f16, or f32 for bit-exact greedy comparisons with plain decoding.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show llama.cpp's log.")]


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


def _engine(model: Path, draft: Path | None, ctx: int, batch: int, ubatch: int, threads: int,
            ngl, ngld, device, draft_device, force, verbose, kv_type="f16"):
    from .engine import Engine, EngineConfig
    from .llama import LlamaError
    from .placement import resolve

    if kv_type not in ("f16", "f32"):
        raise UserError(f"--cache-type: expected f16 or f32, found {kv_type!r}")
    placement = resolve(device, draft_device, ngl, ngld, force)
    cfg = EngineConfig(n_ctx=ctx, n_batch=batch, n_ubatch=min(ubatch, batch), n_threads=threads,
                       n_gpu_layers=placement.n_gpu_layers, n_gpu_layers_draft=placement.n_gpu_layers_draft,
                       kv_type=kv_type, verbose=verbose)
    try:
        return Engine.load(model, draft, cfg), placement
    except LlamaError as e:
        raise UserError(str(e)) from None


def _apply_chat(engine, prompt: str) -> str:
    template = engine.target.chat_template()
    if not template:
        raise UserError(f"{engine.target.path}: tokenizer.chat_template: expected a chat template, found none")
    import jinja2

    env = jinja2.Environment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(
        messages=[{"role": "user", "content": prompt}], add_generation_prompt=True,
        bos_token=engine.target.special_text("bos"), eos_token=engine.target.special_text("eos"))


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
    n_max: Annotated[str, typer.Option("--n-max", "--draft-max", help="Draft depth per round: 0 = no speculation, 1..15, or 'auto' (tuned online).")] = "4",
    chat: Annotated[bool, typer.Option("--chat", help="Wrap the prompt in the GGUF's chat template.")] = False,
    ctx_size: CtxOpt = 4096,
    batch_size: BatchOpt = 512,
    ubatch_size: UbatchOpt = 512,
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
    seed: Annotated[Optional[int], typer.Option("--seed", "-s", help="RNG seed for sampling.")] = None,
    stop: Annotated[Optional[list[str]], typer.Option("--stop", help="Stop string (repeatable).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object (text + stats) instead of streaming.")] = False,
    trace: Annotated[Optional[Path], typer.Option("--trace", help="Write one JSON line per round to this file.")] = None,
    cache_type: CacheOpt = "f16",
    verbose: VerboseOpt = False,
) -> None:
    """Generate text from a Laguna target, drafting with its DFlash drafter.

    Greedy output (the default, --temp 0) is token-for-token the target's own greedy output;
    with sampling every token is drawn from the target's distribution (sample-and-compare).
    """
    if model is None:
        model, model_draft = assets.default_pair(model_draft)
    model_draft = model_draft and native_drafter_path(model_draft, model)  # Poolside's layout: its rewrite
    if (prompt is None) == (file is None):
        raise UserError("give the prompt with exactly one of -p TEXT or -f FILE")
    if file is not None:
        if not file.is_file():
            raise UserError(f"{file}: no such file")
        prompt = file.read_text()
    depth = parse_depth(n_max)
    from .engine import GenerateOptions

    engine, placement = _engine(model, model_draft, ctx_size, batch_size, ubatch_size, threads,
                                n_gpu_layers, n_gpu_layers_draft, device, draft_device, force_placement, verbose,
                                kv_type=cache_type)
    with engine:
        if chat:
            prompt = _apply_chat(engine, prompt)
        trace_f = open(trace, "w") if trace else None
        try:
            opts = GenerateOptions(
                n_predict=n_predict, n_max=depth, stop=tuple(stop or ()),
                sampling=SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p,
                                        repeat_penalty=repeat_penalty, seed=seed),
                trace=(lambda r: trace_f.write(json.dumps(r) + "\n")) if trace_f else None)
            try:
                if json_out:
                    res = engine.generate(prompt, opts)
                    print(json.dumps({"text": res.text, "tokens": res.tokens, "stop_reason": res.stop_reason,
                                      "placement": placement.describe(), "stats": res.stats.as_dict()}, indent=2))
                    return
                last = {}
                opts.trace = _tee(opts.trace, last)
                gen = engine.stream(prompt, opts)
                sys.stdout.write(prompt if not chat else "")
                for piece in gen:
                    sys.stdout.write(piece)
                    sys.stdout.flush()
                sys.stdout.write("\n")
                err.print(placement.describe(), highlight=False)
                err.print(stats_table(engine.last_stats))
            except ValueError as e:
                raise UserError(str(e)) from None
        finally:
            if trace_f:
                trace_f.close()


def _tee(fn, last: dict):
    def f(r: dict) -> None:
        last.update(r)
        if fn:
            fn(r)
    return f


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
    ubatch_size: UbatchOpt = 512,
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
) -> None:
    """Tokens/s of plain decoding and of each draft depth, measured in one process (greedy)."""
    from .bench import SWEEP_CONTENT, SWEEP_DEPTHS, plot, run_bench

    if model is None:
        model, model_draft = assets.default_pair(model_draft)
    model_draft = model_draft and native_drafter_path(model_draft, model)  # Poolside's layout: its rewrite
    if model_draft is None:
        raise UserError("bench compares speculative decoding with plain decoding: give a drafter with -md")
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
    engine, placement = _engine(model, model_draft, ctx_size, batch_size, ubatch_size, threads,
                                n_gpu_layers, n_gpu_layers_draft, device, draft_device, force_placement, verbose,
                                kv_type=cache_type)
    with engine:
        result = run_bench(engine, {f.stem: assets.read_prompts(f) for f in files}, depths, n_predict, repeats,
                           console=err)
    result["placement"] = placement.describe()
    result["command"] = " ".join(["laguna-run"] + sys.argv[1:])
    from .bench import bench_table

    Console().print(bench_table(result))
    if json_out:
        json_out.write_text(json.dumps(result, indent=2))
        err.print(f"wrote {json_out}")
    if png:
        plot(result, png)
        err.print(f"wrote {png}")


def _invoke(app: typer.Typer, args: list[str]) -> int:
    try:
        app(args=args, prog_name="laguna-run" if app is run_app else "laguna-run bench", standalone_mode=False)
        return 0
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)  # one line, never wrapped
        return USER_ERROR_EXIT
    except typer.Exit as e:
        return e.exit_code
    except (typer.BadParameter, Exception) as e:
        import click

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            return USER_ERROR_EXIT
        if isinstance(e, click.exceptions.Abort):
            return 130
        raise


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "bench":
        code = _invoke(bench_app, args[1:])
    else:
        code = _invoke(run_app, args[1:] if args and args[0] == "run" else args)
    if argv is None:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
