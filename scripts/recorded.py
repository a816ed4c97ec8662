"""What a benchmark script leaves behind: the command line it writes into its results (quoted so
that it reruns as run), and the results themselves as JSON and a plot. Every results JSON goes
through ``write_json``, which adds the CPU it was measured on (``cpu``: model, the flags ggml's
kernels choose by, core counts; ``laguna_dflash.runtime.cores.cpu_facts``)."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def command_line(script: str, argv: list[str] | None = None) -> str:
    """``python -m scripts.<folder>.<script> <arguments>`` (run from the repository root);
    ``argv`` None: this process's arguments."""
    module = ".".join(Path(script).resolve().relative_to(REPO).with_suffix("").parts)
    return shlex.join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])


def write_json(path: Path, result: dict, *, indent: int | None = 1, **dumps) -> None:
    """``result`` as JSON into ``path``, with the CPU's facts under ``cpu`` (the key is theirs);
    ``dumps``: json.dumps's other options."""
    from laguna_dflash.runtime.cores import cpu_facts

    result = {**result, "cpu": cpu_facts()}
    path.write_text(json.dumps(result, indent=indent, **dumps) + "\n")


def write_results(result: dict, json_path: Path | None, png_path: Path | None,
                  plot: Callable[[dict, Path], None], console, *, indent: int = 1) -> None:
    """``result`` as JSON into ``json_path`` and ``plot(result, png_path)``, each where a path is
    given, saying on ``console`` (a rich Console) what was written."""
    if json_path:
        write_json(json_path, result, indent=indent)
        console.print(f"wrote {json_path}")
    if png_path:
        plot(result, png_path)
        console.print(f"wrote {png_path}")
