"""Ctrl-C in a command: the first stops the work at a round boundary, the second at once."""

from __future__ import annotations

import signal
import threading

from ...convert.command_line import Interrupted

__all__ = ["CtrlC", "Interrupted"]


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
