"""The standard library as the bundled pairs' corpus: every machine with CPython has it. The
held-out modules are never seen by the tokenizer, the target or the drafter; the code pair's
benchmark prompts and the agent pair's held-out tasks come from them."""

from __future__ import annotations

import sysconfig
from pathlib import Path

#: stdlib modules never seen by the tokenizer, the target or the drafter; the prompts come from them
HELD_OUT = (
    "bisect.py", "colorsys.py", "fnmatch.py", "glob.py", "graphlib.py", "heapq.py", "numbers.py",
    "queue.py", "reprlib.py", "sched.py", "secrets.py", "shlex.py", "textwrap.py", "zipapp.py",
)


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def training_files() -> list[Path]:
    """Top-level stdlib modules, sorted, minus the held-out list."""
    files = sorted(stdlib_dir().glob("*.py"))
    return [p for p in files if p.name not in HELD_OUT]


def held_out_files() -> list[Path]:
    return [stdlib_dir() / n for n in HELD_OUT if (stdlib_dir() / n).exists()]


def read(p: Path) -> str:
    return p.read_text(encoding="utf-8", errors="replace")
