"""``laguna-gguf``: convert Poolside's Laguna DFlash drafters to GGUF, and inspect the result."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

import typer
from gguf import GGMLQuantizationType, LlamaFileType
from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn,
                           TransferSpeedColumn)
from rich.table import Table

from .command_line import App, argument, flag, run, switch
from .files import human_size
from .gguf import keys as K
from .converter import Summary, check_output_path, prepare, write_job
from .drafter_info import layout_problems, pairing_problems, read_drafter_gguf
from .errors import USER_ERROR_EXIT, UserError
from .poolside import LAGUNA_DECODER, POOLSIDE_ARCH, is_poolside_layout, read_poolside
from .poolside_rewrite import prepare as prepare_poolside
from .quantize import OutType
from .target import TargetInfo, read_target
from .writer import TensorSpec, Terminated, check_metadata, sigterm_raises

app = App(
    name="laguna-gguf",
    help=(
        "Convert a Laguna DFlash speculative drafter (Hugging Face safetensors) into the GGUF layout "
        "ik_llama.cpp loads (architecture dflash-draft), and check drafter/target pairs.\n\n"
        "A drafter has no embedding or LM head of its own: it borrows the target's, and reads hidden "
        "states captured from a few target layers. That is why every command here also takes the "
        "target: the pair must agree on layer count, hidden size and vocabulary."
    ),
    no_args_is_help=True,
)

out_console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

F = TypeVar("F", bound=Callable[..., Any])


#: Exit codes of a command stopped by a signal: 128 + the signal number, as a shell reports it.
SIGINT_EXIT, SIGTERM_EXIT = 130, 143


def _interruptible(fn: F) -> F:
    """Ctrl-C (SIGINT) and SIGTERM: the partial output is removed, one line on stderr, exit 130 / 143."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with sigterm_raises():
                return fn(*args, **kwargs)
        except KeyboardInterrupt:
            typer.echo("error: interrupted (SIGINT): no output written, the partial file was removed", err=True)
            raise typer.Exit(SIGINT_EXIT) from None
        except Terminated:
            typer.echo("error: terminated (SIGTERM): no output written, the partial file was removed", err=True)
            raise typer.Exit(SIGTERM_EXIT) from None

    return wrapper  # type: ignore[return-value]


def _load_target(path: Path, quiet: bool) -> TargetInfo:
    if quiet:
        return read_target(path)
    with err_console.status(f"reading target {path} ..."):
        return read_target(path)


@app.command("convert", help=(
    "Convert a Laguna DFlash drafter to GGUF (architecture dflash-draft, the layout ik_llama.cpp loads).\n\n"
    "Every rule of the drafter contract is checked first: config fields, exact tensor names and shapes, "
    "the pairing with TARGET. A violation stops with exit code 2 and one line naming the file, the field "
    "or tensor, the expected and the found value; no output file is left behind. Tensors are then read, "
    "converted and written one at a time, so memory stays near the size of the largest tensor."
), epilog=(
    "Examples:\n\n"
    "  laguna-gguf convert Laguna-XS-2.1-DFlash --target Laguna-XS-2.1-Q4_K_M.gguf -o xs-dflash-q8_0.gguf\n\n"
    "  laguna-gguf convert ./drafter --target ./Laguna-XS-2.1 --outtype bf16   # HF target directory"
))
@_interruptible
def convert_cmd(
    drafter_dir: Annotated[Path, argument(
        "DRAFTER_DIR",
        help="The drafter's HF directory (or a drafter GGUF in Poolside's own layout, mainline llama.cpp's "
             "dflash architecture): config.json plus model.safetensors or a sharded "
             "model.safetensors.index.json (a leading 'model.', split q/k/v_proj and layers numbered "
             "after the target's are all accepted).")],
    target: Annotated[Path, flag(
        "--target", "-t", metavar="TARGET", show_default=False,
        help="The target model: its .gguf file, or its HF directory (then llama.cpp's convert_hf_to_gguf.py "
             "--vocab-only reads the tokenizer; set LAGUNA_LLAMA_CPP_DIR if it is not found). The tokenizer "
             "is copied from it, and the pair is checked: layer count, hidden size, vocabulary.")],
    outfile: Annotated[Optional[Path], flag(
        "--outfile", "-o", metavar="OUT.gguf", show_default=False,
        help="Output file (default: ./<DRAFTER_DIR name>-<outtype>.gguf). Written under a temporary name "
             "and renamed when complete, so a failed run leaves nothing behind.")] = None,
    outtype_name: Annotated[str, flag(
        "--outtype", metavar="|".join(t.value for t in OutType),
        help="Type of the weight matrices (norm vectors always stay F32). q8_0 is about half the size of "
             "bf16 and what drafters usually run in; bf16 keeps the checkpoint's exact values. q6_k, q5_k_m, "
             "q4_k_m and q4_0 are made by llama.cpp's own quantiser from a lossless intermediate file "
             "written next to the output (its per-tensor mix; rows that are not a multiple of 256 values "
             "fall back to a 32-value block type): see docs/results/lowbit/README.md.")] = OutType.Q8_0.value,
    source_repo: Annotated[Optional[str], flag(
        "--source-repo", metavar="ORG/NAME",
        help="The Hugging Face repository the drafter comes from, recorded as "
             "general.source.huggingface.repository (default: config.json's _name_or_path when it "
             "looks like ORG/NAME).")] = None,
    name: Annotated[Optional[str], flag(
        "--name", help="general.name of the output (default: the repository or directory name).")] = None,
    quiet: Annotated[bool, switch("--quiet", "-q", help="No progress bar and no summary.")] = False,
) -> None:
    t0 = time.perf_counter()
    outtype = OutType.parse(outtype_name)
    stem = drafter_dir.stem if drafter_dir.is_file() else drafter_dir.resolve().name
    out = outfile or Path(f"{stem}-{outtype.value}.gguf")
    check_output_path(out, target=target)  # before reading the target (slow for an HF directory)
    tgt = _load_target(target, quiet)
    # a file is a drafter GGUF in Poolside's own layout, rewritten into ours
    job = (prepare_poolside if drafter_dir.is_file() else prepare)(drafter_dir, tgt, outtype, name=name,
                                                                   source_repo=source_repo)
    check_output_path(out, job.inputs, target=tgt.source)  # job.write checks again; these fail before
    check_metadata(out, job.metadata)                      # the progress display starts
    cfg = job.cfg
    if not quiet:
        err_console.print(
            f"drafter [bold]{drafter_dir}[/]: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
            f"{cfg.num_attention_heads}/{cfg.num_key_value_heads} heads, target layers "
            f"{list(cfg.target_layer_ids)}\n"
            f"target  [bold]{tgt.name}[/]: {tgt.n_layer} layers, hidden {tgt.hidden_size}, vocab {tgt.vocab_size}\n"
            f"writing [bold]{out}[/] ({outtype.value}, {len(job.specs)} tensors, {human_size(job.total_bytes)}"
            f"{' before llama.cpp quantises them' if outtype.by_llama else ''})",
            soft_wrap=True)
        with Progress(TextColumn("{task.description:<28}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                      TimeElapsedColumn(), console=err_console, transient=False) as bar:
            task = bar.add_task("converting", total=job.total_bytes)
            written = [0]

            def advance(spec: TensorSpec) -> None:
                written[0] += spec.nbytes
                quantising = outtype.by_llama and written[0] >= job.total_bytes  # llama.cpp takes over now
                bar.update(task, advance=spec.nbytes,
                           description=f"llama.cpp: {outtype.value}" if quantising else spec.name)

            summary = write_job(job, out, on_tensor=advance)
            bar.update(task, description="done")
        _print_summary(summary, time.perf_counter() - t0)
    else:
        write_job(job, out)


def _print_summary(s: Summary, wall: float) -> None:
    table = Table(show_header=True, header_style="bold")
    table.add_column("type")
    table.add_column("tensors", justify="right")
    table.add_column("bytes", justify="right")
    for qtype, (n, b) in sorted(s.by_type.items()):
        table.add_row(qtype, str(n), human_size(b))
    table.add_row("[bold]total[/]", str(s.n_tensors), human_size(sum(b for _, b in s.by_type.values())))
    out_console.print(f"wrote {s.out}", soft_wrap=True)
    out_console.print(table)
    out_console.print(f"{s.n_tensors} tensors, {s.n_params:,} parameters, output {human_size(s.file_size)} "
                      f"({s.file_size:,} bytes), {wall:.1f} s", soft_wrap=True)


@app.command("inspect", help=(
    "Show a drafter GGUF's contract at a glance, check its dflash-draft layout, and with --target "
    "whether it pairs with that target.\n\n"
    "Exit code 0 when the layout is complete (and the pair works), 2 otherwise, with one line per problem."
), epilog=(
    "Examples:\n\n"
    "  laguna-gguf inspect xs-dflash-q8_0.gguf\n\n"
    "  laguna-gguf inspect xs-dflash-q8_0.gguf --target Laguna-XS-2.1-Q4_K_M.gguf"
))
def inspect_cmd(
    file: Annotated[Path, argument("FILE.gguf", help="A drafter GGUF written by `laguna-gguf convert` "
                                                     "(or one in Poolside's own layout).")],
    target: Annotated[Optional[Path], flag(
        "--target", "-t", metavar="TARGET",
        help="Also check that the drafter pairs with this target (.gguf or HF directory): layer ids within "
             "its layers, same hidden size, same vocabulary token for token. Exit code 2 when it does not.")] = None,
) -> None:
    if not file.is_file():
        raise UserError(f"{file}: not found")
    if is_poolside_layout(file):
        return print_inspection(file, target, out_console)
    info = read_drafter_gguf(file)
    table = Table(title=str(file), show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    rows = [
        ("architecture", info.architecture),
        ("name", info.get(K.GENERAL_NAME)),
        ("source repository", info.get(K.GENERAL_SOURCE_REPO)),
        ("layers", info.get(K.BLOCK_COUNT)),
        ("hidden size", info.get(K.EMBEDDING_LENGTH)),
        ("feed-forward size", info.get(K.FEED_FORWARD_LENGTH)),
        ("heads / kv heads / head dim", f"{info.get(K.HEAD_COUNT)} / {info.get(K.HEAD_COUNT_KV)} / {info.get(K.KEY_LENGTH)}"),
        ("sliding window", info.get(K.SLIDING_WINDOW) or "none (full attention)"),
        ("rope base / rotated dims", f"{info.get(K.ROPE_FREQ_BASE)} / {info.get(K.ROPE_DIMENSION_COUNT)}"),
        ("gating", info.get(K.GATING) or "per-head"),
        ("block size", info.get(K.BLOCK_SIZE)),
        ("mask token id", info.get(K.MASK_TOKEN_ID)),
        ("target layer ids (HF)", info.get(K.TARGET_LAYER_IDS)),
        ("target features", info.get(K.N_TARGET_FEATURES)),
        ("built for target", f"{info.get(K.TARGET_NAME)} ({info.get(K.TARGET_N_LAYER)} layers)"),
        ("vocabulary", f"{len(info.tokens)} tokens"),
        ("file type", _file_type_name(info.get(K.GENERAL_FILE_TYPE))),
    ]
    if runtimes := info.runtimes():
        rows.append(("loads in", ", ".join(runtimes)))
    by_type: dict[str, int] = {}
    for _, qtype, _ in info.tensors.values():
        by_type[qtype.name] = by_type.get(qtype.name, 0) + 1
    rows.append(("tensors", f"{len(info.tensors)} ({', '.join(f'{n} {t}' for t, n in sorted(by_type.items()))}), "
                            f"{info.n_params:,} parameters"))
    for k, v in rows:
        table.add_row(k, "-" if v is None else str(v))
    out_console.print(table)

    problems = layout_problems(info)
    for p in problems:
        typer.echo(f"error: {p}", err=True)
    if problems:
        raise typer.Exit(USER_ERROR_EXIT)
    out_console.print("layout: complete dflash-draft (the layout laguna-gguf convert writes)")
    if target is None:
        return
    tgt = read_target(target)
    problems = pairing_problems(info, tgt)
    for p in problems:
        typer.echo(f"error: does not pair with {target}: {p}", err=True)
    if problems:
        raise typer.Exit(USER_ERROR_EXIT)
    out_console.print(f"pairs with target {tgt.name} ({tgt.n_layer} layers, hidden {tgt.hidden_size}, "
                      f"vocab {tgt.vocab_size})", soft_wrap=True)


def print_inspection(path: Path, target_path: Path | None, console: Console) -> None:
    """``laguna-gguf inspect FILE.gguf`` for a Poolside file: its contract, and the pair with a target."""
    target = read_target(target_path) if target_path is not None else None
    pf = read_poolside(path, target)
    cfg = pf.cfg
    by_type: dict[str, int] = {}
    for t in pf.tensors.values():
        qname = GGMLQuantizationType(t.tensor_type).name
        by_type[qname] = by_type.get(qname, 0) + 1
    n_params = sum(int(t.n_elements) for t in pf.tensors.values())
    table = Table(title=str(path), show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    for k, v in [
        ("architecture", f"{POOLSIDE_ARCH} (decoder "
                         f"{pf.values.get(K.for_arch(POOLSIDE_ARCH, 'decoder_arch'), LAGUNA_DECODER)})"),
        ("name", pf.name),
        ("layers", cfg.num_hidden_layers),
        ("hidden size", cfg.hidden_size),
        ("feed-forward size", cfg.intermediate_size),
        ("heads / kv heads / head dim", f"{cfg.num_attention_heads} / {cfg.num_key_value_heads} / {cfg.head_dim}"),
        ("sliding window", cfg.sliding_window),
        ("rope base", cfg.rope_theta),
        ("block size", cfg.block_size),
        ("mask token id", cfg.mask_token_id),
        ("target layers (stored, HF id + 1)", list(pf.stored_layers)),
        ("target layer ids (HF)", list(cfg.target_layer_ids)),
        ("vocabulary", f"{len(pf.tokens)} tokens" if pf.tokens else "none (taken from the target)"),
        ("tensors", f"{len(pf.tensors)} ({', '.join(f'{n} {t}' for t, n in sorted(by_type.items()))}), "
                    f"{n_params:,} parameters"),
    ]:
        table.add_row(k, str(v))
    console.print(table)
    console.print("layout: Poolside's dflash layout (mainline llama.cpp's architecture), complete; laguna-run -md "
                  f"converts it once into {K.ARCH}, `laguna-gguf convert FILE.gguf --target T -o OUT` rewrites it",
                  soft_wrap=True)
    if target is not None:
        console.print(f"pairs with target {target.name} ({target.n_layer} layers, hidden {target.hidden_size}, "
                      f"vocab {target.vocab_size})", soft_wrap=True)


def _file_type_name(v: object) -> str:
    try:
        return f"{v} ({LlamaFileType(v).name})"
    except ValueError:
        return str(v)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point (``laguna-gguf``)."""
    code = run(app, sys.argv[1:] if argv is None else argv, "laguna-gguf")
    if argv is None:
        sys.exit(code)
    return code


try:
    from . import upload as _upload  # noqa: E402
except ImportError:  # the upload command is optional: its module or its dependencies may be absent
    _upload = None  # type: ignore[assignment]
else:
    _upload.register(app)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
