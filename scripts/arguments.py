"""Argument types and checks the benchmark scripts share: a malformed value is argparse's
one-line error and exit 2, never a traceback."""

from __future__ import annotations

import argparse
from typing import Callable


def int_list(lo: int, hi: int, words: tuple[str, ...] = ()) -> Callable[[str], tuple]:
    """A comma-separated list of integers in ``lo..hi`` (and any of ``words``, kept as text)."""

    def parse(text: str) -> tuple:
        try:
            out = tuple(x if x in words else int(x) for x in text.split(","))
        except ValueError:
            out = ()
        if not out or any(not isinstance(x, str) and not lo <= x <= hi for x in out):
            extra = "".join(f" or {w}" for w in words)
            raise argparse.ArgumentTypeError(f"integers in {lo}..{hi}{extra}, comma-separated; found {text!r}")
        return out

    return parse


def factor_list(text: str) -> tuple[float, ...]:
    """A comma-separated list of positive numbers."""
    try:
        out = tuple(float(x) for x in text.split(","))
    except ValueError:
        out = ()
    if not out or any(not 0.0 < x < float("inf") for x in out):
        raise argparse.ArgumentTypeError(f"positive numbers, comma-separated; found {text!r}")
    return out


def require_at_least(ap: argparse.ArgumentParser, args: argparse.Namespace, **least: int) -> None:
    """Refuse, in one line with exit code 2, any of these options below its least value
    (``require_at_least(ap, args, reps=1, warmup=0)``)."""
    for name, lo in least.items():
        value = getattr(args, name)
        if value < lo:
            ap.error(f"--{name.replace('_', '-')}: expected >= {lo}, found {value}")
