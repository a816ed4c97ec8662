"""laguna-run's commands: run (run.py), bench (bench.py), serve (serve.py), their shared flags
(options.py) and the dispatch (main.py)."""

from .main import main

__all__ = ["main"]
