"""laguna-run setup: build (or reuse from the cache) the patched llama-cpp-python and install it.

    laguna-run setup                      # the CPU wheel, into this Python environment
    laguna-run setup --cuda --cuda-arch 90
    laguna-run setup --check              # what is installed, patched or not, backends, CPU features
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from ...convert.command_line import App, flag, switch

err = Console(stderr=True)
out = Console(soft_wrap=True)

setup_app = App()

#: CMAKE_CUDA_ARCHITECTURES when --cuda-arch is not given: the GPU of the machine that builds
CUDA_ARCH_DEFAULT = os.environ.get("LAGUNA_CUDA_ARCH", "native")


def _say(msg: str) -> None:
    err.print(f"[dim]setup:[/] {msg}", highlight=False, soft_wrap=True)


def print_check() -> bool:
    """The --check report on standard output; whether the runtime can use what is installed."""
    from ..setup import report

    r = report.gather()
    if r.version is None:
        out.print("llama-cpp-python: not installed (run `laguna-run setup`)")
        return False
    if r.this_build:
        which = "the CPU build of this install's patches"
    elif r.this_series and "CUDA" in r.backends:
        which = "a CUDA build of this install's patches"
    else:
        which = "not the build of this install's patches (`laguna-run setup` replaces it)"
    out.print(f"llama-cpp-python: {r.version}, {which}", highlight=False)
    if r.patched:
        out.print("Laguna patches: present, ABI as this runtime expects")
    if r.problem:
        out.print(f"problem: {r.problem}", highlight=False, soft_wrap=True)
    if r.backends:
        out.print(f"backends: {', '.join(r.backends)}", highlight=False)
        for device in r.devices:
            out.print(f"  device {device}", highlight=False)
        out.print(f"CPU features: {' '.join(r.cpu_features) or 'none reported'}", highlight=False)
        out.print(f"RPC (--rpc, laguna-rpc-server): {'yes' if r.rpc else 'no'}")
    return r.ready


@setup_app.command(help=(
    "Build the patched llama-cpp-python this runtime needs (llama-cpp-python 0.3.36 with the Laguna "
    "patches), or reuse it from the cache, and install it into this Python environment. The first "
    "build compiles llama.cpp (minutes); the wheel is cached under ~/.cache/laguna-dflash (or "
    "$LAGUNA_DFLASH_CACHE), keyed by the sources, the patches and the build flags, so a later setup "
    "with the same ones installs in seconds."))
def setup(
    cuda: Annotated[bool, switch("--cuda", help=(
        "Build with CUDA (needs the CUDA toolkit; no GPU or driver needed to build)."))] = False,
    cuda_arch: Annotated[str, flag("--cuda-arch", metavar="N", help=(
        "CUDA architecture to compile for, as CMake's CMAKE_CUDA_ARCHITECTURES: 90 for Hopper (H100, H200), "
        "89 Ada, 80 A100; native: the GPU of this machine. With --cuda."))] = CUDA_ARCH_DEFAULT,
    check: Annotated[bool, switch("--check", help=(
        "Only report: the llama-cpp-python installed, patched or not, its backends, devices and CPU "
        "features. Exit code 0 when laguna-run can use it, 1 otherwise."))] = False,
    no_install: Annotated[bool, switch("--no-install", help="Build or reuse the wheel, but do not install it.")] = False,
    wheel_path: Annotated[bool, switch("--wheel-path", help=(
        "Print the wheel's path (building it if needed) and install nothing."))] = False,
    source_dir: Annotated[bool, switch("--source-dir", help=(
        "Print the patched llama-cpp-python source tree (unpacked once into the cache) and exit."))] = False,
    rebuild: Annotated[bool, switch("--rebuild", help=(
        "Compile even if the cache holds a wheel with this key."))] = False,
) -> None:
    from ..setup import wheel

    if check:
        raise typer.Exit(0 if print_check() else 1)
    wheel.log = _say
    try:
        if source_dir:
            print(wheel.source_tree())
            return
        p = wheel.plan(cuda, cuda_arch)
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=err, transient=True) as bar:
            task = bar.add_task("compiling llama.cpp", total=None)
            path, built = wheel.ensure_wheel(p, rebuild, lambda done, total: bar.update(task, completed=done,
                                                                                      total=total))
        _say(f"{'built' if built else 'reusing cached'} {path.name} (key {p.key})")
        if wheel_path:
            print(path)
            return
        if no_install:
            return
        if wheel.installed_version() == p.version and not rebuild:
            _say(f"llama-cpp-python {p.version} already installed")
        else:
            with err.status(f"installing {path.name} into {sys.prefix}"):
                wheel.install(path)
            _say(f"installed llama-cpp-python {p.version} into {sys.prefix}")
    except wheel.BuildError as e:
        err.print(f"error: {e}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1) from None
    # the report from a fresh interpreter: this one may hold the llama-cpp-python that was replaced
    checked = subprocess.run([sys.executable, "-m", "laguna_dflash.runtime.cli", "setup", "--check"])
    if checked.returncode != 0:
        raise typer.Exit(1)
