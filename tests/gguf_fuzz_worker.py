"""The fuzz test's worker: runs many cases in one process, one result line per tool and case.

    python tests/gguf_fuzz_worker.py CASES.json RESULTS.jsonl FIRST_CASE

Each case names the pair (the original target/drafter, or one of them mutated with
tests/gguf_mutate.py) and runs, in this order: ``laguna-gguf inspect DRAFTER --target TARGET``,
``Engine.load`` + a 4-token generation, and ``laguna-run``. Before each tool a ``start`` line is
written and flushed, after it a ``done`` line with the exit code (0 ran, 2 refused) or
``traceback`` with the exception; a process that dies by a signal leaves a ``start`` line
without its ``done``, which is how the test names the case that killed it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
import traceback
from pathlib import Path

from gguf_mutate import Source  # noqa: E402

PROMPT = "def add(a, b):"


def _stamp(path) -> tuple | None:
    try:
        st = os.stat(path)
    except (OSError, TypeError, ValueError):
        return None
    return os.fspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class ReaderMemo:
    """Parse each file version once per worker with gguf-py's reader. The tools of one case read
    the same files several times with it (about a second each for a 4096-token vocabulary); a
    file that is unchanged (same path, inode, size and mtime) parses to the same fields, so the
    parse is reused: the originals for the whole run, a mutated copy within its case."""

    def __init__(self, originals: list[Path]) -> None:
        import gguf
        import gguf.gguf_reader

        self.keep = {_stamp(p) for p in originals}
        self.cache: dict[tuple, object] = {}
        base, cache = gguf.GGUFReader, self.cache

        class MemoReader(base):
            def __new__(cls, path, mode="r", *args, **kwargs):
                hit = cache.get(_stamp(path)) if mode == "r" else None
                return hit if hit is not None else super().__new__(cls)

            def __init__(self, path, mode="r", *args, **kwargs):
                if getattr(self, "_memo_ready", False):
                    return
                super().__init__(path, mode, *args, **kwargs)
                self._memo_ready = True
                if mode == "r" and (stamp := _stamp(path)) is not None:
                    cache[stamp] = self

        gguf.GGUFReader = gguf.gguf_reader.GGUFReader = MemoReader

    def forget_copies(self) -> None:
        for stamp in [s for s in self.cache if s not in self.keep]:
            del self.cache[stamp]


def run_inspect(target: Path, drafter: Path) -> int:
    from laguna_dflash.convert.cli import main as gguf_main

    argv = sys.argv
    sys.argv = ["laguna-gguf", "inspect", str(drafter), "--target", str(target)]
    try:
        gguf_main()
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv = argv


def run_engine(target: Path, drafter: Path) -> int:
    from laguna_dflash.convert.errors import UserError
    from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions
    from laguna_dflash.runtime.llama import LlamaError

    try:
        engine = Engine.load(target, drafter, EngineConfig(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1))
    except (UserError, LlamaError) as e:
        print(f"refused: {e}", file=sys.stderr)
        return 2
    with engine:
        engine.generate(PROMPT, GenerateOptions(n_predict=4, n_max=2))
    return 0


def run_cli(target: Path, drafter: Path) -> int:
    from laguna_dflash.runtime.cli import main as run_main

    return run_main(["-m", str(target), "-md", str(drafter), "-p", PROMPT, "-n", "4", "--n-max", "2",
                     "-c", "256", "-b", "64", "-ub", "64", "-t", "1"])


TOOLS = {"inspect": run_inspect, "engine": run_engine, "laguna-run": run_cli}


#: A case that takes longer, or a process that grows beyond this, is a failure (a header value
#: that makes a tool loop or allocate without bound), not a hung or swapping CI machine.
TOOL_TIMEOUT_S = 60
ADDRESS_SPACE = 6 << 30


def main() -> None:
    import resource
    import signal

    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # the alarm kills: the parent reports the case
    cases_path, results_path, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
    spec = json.loads(Path(cases_path).read_text())
    originals = {"target": Path(spec["target"]), "drafter": Path(spec["drafter"])}
    memo = ReaderMemo(list(originals.values()))
    sources: dict[str, Source] = {}
    work = Path(spec["work_dir"])
    with open(results_path, "a", buffering=1) as results:
        def note(**kw) -> None:
            results.write(json.dumps(kw) + "\n")
            results.flush()

        for index in range(first, len(spec["cases"])):
            case = spec["cases"][index]
            role = case["role"]  # which file of the pair is mutated
            src = sources.get(role) or sources.setdefault(role, Source.of(originals[role]))
            mutated = work / f"case-{index}-{Path(originals[role]).name}"
            if case["kind"] == "value":
                src.write_fuzzed(mutated, case["key"], case["value"])
            else:
                src.write_truncated(mutated, case["offset"])
            pair = dict(originals, **{role: mutated})
            for tool in case.get("tools", list(TOOLS)):
                note(event="start", case=index, tool=tool)
                out = io.StringIO()
                signal.alarm(TOOL_TIMEOUT_S)
                t0 = time.process_time()
                try:
                    with contextlib.redirect_stdout(out):
                        rc = TOOLS[tool](pair["target"], pair["drafter"])
                    signal.alarm(0)
                    note(event="done", case=index, tool=tool, rc=rc, cpu_s=round(time.process_time() - t0, 3))
                except BaseException as e:  # noqa: BLE001 - a traceback is what the test looks for
                    signal.alarm(0)
                    note(event="traceback", case=index, tool=tool,
                         error=f"{e.__class__.__name__}: {e}", where=traceback.format_exc(limit=-3))
            memo.forget_copies()
            mutated.unlink(missing_ok=True)
    os._exit(0)  # skip interpreter teardown: llama.cpp's static destructors are not under test


if __name__ == "__main__":
    main()
