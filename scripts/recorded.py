"""The command line a benchmark script writes into its results, quoted so that it reruns as run."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def command_line(script: str, argv: list[str] | None = None) -> str:
    """``python scripts/<folder>/<script>.py <arguments>``; ``argv`` None: this process's arguments."""
    path = Path(script).resolve().relative_to(REPO).as_posix()
    return shlex.join(["python", path, *(sys.argv[1:] if argv is None else argv)])
