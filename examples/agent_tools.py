"""The agent's four tools: their OpenAI function schemas and safe executors over one directory.

Shared by ``examples/agent.py`` (which runs them for a model) and the agent pair's training data
(``tests/helpers/agent_tasks.py``, which runs them to put real outputs in the conversations),
so the model is trained on exactly what the demo's tools return.

Safety: every path is resolved (symlinks included) and must stay inside the workspace root;
files are only read; ``run_python`` runs the code in a separate, isolated interpreter
(``python -I -S``) in an empty temporary directory, with a wall-clock limit, a CPU-time limit and an
address-space limit, and its output cut to a few hundred characters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

MAX_LIST = 20
MAX_MATCHES = 6
MAX_OUTPUT_CHARS = 400
RUN_SECONDS = 5

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "list_dir", "description": "List a directory of the workspace.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read lines of a text file of the workspace.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "start": {"type": "integer"}, "lines": {"type": "integer"}},
            "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "grep", "description": "Find a plain text in the .py files of a workspace directory.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}, "path": {"type": "string"}},
                       "required": ["text"]}}},
    {"type": "function", "function": {
        "name": "run_python", "description": "Run Python code and return what it prints.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}},
]

TOOL_NAMES = tuple(t["function"]["name"] for t in TOOLS)


class ToolError(Exception):
    """A tool refused or failed; its message is what the model sees."""


class Workspace:
    """The directory the tools may read; every tool call goes through :meth:`call`."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self._text: dict[Path, str] = {}

    def _read(self, p: Path) -> str:
        """A file's text, read once (the workspace is read-only for the tools)."""
        if p not in self._text:
            self._text[p] = p.read_text(encoding="utf-8", errors="replace")
        return self._text[p]

    def _path(self, path: Any) -> Path:
        if not isinstance(path, str) or not path:
            raise ToolError("path must be a non-empty string")
        p = (self.root / path).resolve()
        if p != self.root and self.root not in p.parents:
            raise ToolError(f"{path} is outside the workspace")
        return p

    def _shown(self, p: Path) -> str:
        return "." if p == self.root else str(p.relative_to(self.root))

    def list_dir(self, path: str = ".") -> str:
        p = self._path(path)
        if not p.is_dir():
            raise ToolError(f"no such directory: {path}")
        names = sorted(e.name + ("/" if e.is_dir() else "") for e in p.iterdir()
                       if not e.name.startswith(".") and e.name != "__pycache__")
        more = f"\n... ({len(names) - MAX_LIST} more)" if len(names) > MAX_LIST else ""
        return "\n".join(names[:MAX_LIST]) + more

    def read_file(self, path: str, start: int = 1, lines: int = 10) -> str:
        p = self._path(path)
        if not p.is_file():
            raise ToolError(f"no such file: {path}")
        if not isinstance(start, int) or not isinstance(lines, int) or start < 1 or not 1 <= lines <= 40:
            raise ToolError("start must be >= 1 and lines between 1 and 40")
        chunk = self._read(p).splitlines()[start - 1:start - 1 + lines]
        return "\n".join(f"{start + i}: {line}" for i, line in enumerate(chunk)) or "(no lines there)"

    def grep(self, text: str, path: str = ".") -> str:
        if not isinstance(text, str) or not text:
            raise ToolError("text must be a non-empty string")
        p = self._path(path)
        files = [p] if p.is_file() else sorted(p.glob("*.py")) if p.is_dir() else None
        if files is None:
            raise ToolError(f"no such file or directory: {path}")
        hits = []
        for f in files:
            if text not in self._read(f):
                continue
            for n, line in enumerate(self._read(f).splitlines(), 1):
                if text in line:
                    hits.append(f"{self._shown(f)}:{n}: {line.strip()}")
        more = f"\n... ({len(hits) - MAX_MATCHES} more)" if len(hits) > MAX_MATCHES else ""
        return "\n".join(hits[:MAX_MATCHES]) + more if hits else "no matches"

    def run_python(self, code: str) -> str:
        if not isinstance(code, str) or not code.strip():
            raise ToolError("code must be non-empty Python source")
        with tempfile.TemporaryDirectory(prefix="agent-run-") as tmp:
            try:
                done = subprocess.run([sys.executable, "-I", "-S", "-c", code], cwd=tmp, capture_output=True, text=True,
                                      timeout=RUN_SECONDS, env={"PATH": os.defpath}, preexec_fn=_limits)
            except subprocess.TimeoutExpired:
                raise ToolError(f"timed out after {RUN_SECONDS} s") from None
        if done.returncode != 0:
            raise ToolError((done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1])
        out = done.stdout.strip()
        return out[:MAX_OUTPUT_CHARS] or "(no output)"

    def call(self, name: str, arguments: Any) -> str:
        """The tool's output, or ``Error: ...`` (a refusal is an answer the model must handle)."""
        if name not in TOOL_NAMES:
            return f"Error: no tool named {name}"
        if not isinstance(arguments, dict):
            return "Error: arguments must be a JSON object"
        try:
            return getattr(self, name)(**arguments)
        except ToolError as e:
            return f"Error: {e}"
        except TypeError as e:  # unknown or missing argument names
            return f"Error: {e}"


def _limits() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CPU, (RUN_SECONDS, RUN_SECONDS))
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def parse_arguments(arguments: str | dict) -> Any:
    """OpenAI clients carry arguments as a JSON string."""
    if isinstance(arguments, dict):
        return arguments
    try:
        return json.loads(arguments)
    except (TypeError, ValueError):
        return None
