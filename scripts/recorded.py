"""The command line a benchmark script writes into its results, quoted so that it reruns as run."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path


def command_line(script: str, argv: list[str] | None = None) -> str:
    """``python scripts/<script's name> <arguments>``; ``argv`` None: this process's arguments."""
    return shlex.join(["python", f"scripts/{Path(script).name}", *(sys.argv[1:] if argv is None else argv)])
