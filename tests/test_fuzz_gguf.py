"""Fuzz the bundled laguna-tiny pair's GGUF headers (issue 18): no value and no truncation may
kill the process or end in a traceback.

Every numeric metadata key of the drafter GGUF and of the target GGUF (the first element of an
array) is set to 0, -1, NaN, +inf, -inf, 2^31 and 2^63, in its own type where that type holds the
value and else in one that does (a type change is a case too); both files are also cut short
inside the header, the metadata, the tensor infos and the tensor data. For each case
``laguna-gguf inspect``, ``Engine.load`` (plus a four-token generation) and ``laguna-run`` must
either run (exit 0) or refuse (exit 2, a UserError or LlamaError from the API); a death by a
signal, a traceback, a tool running over a minute or growing past 6 GiB fails the test.

Cases run in batches inside worker processes (tests/gguf_fuzz_worker.py), two at a time; a worker
killed by a signal is reported with the case and tool it was running, and restarted after it.
"""

from __future__ import annotations

import concurrent.futures
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from gguf_fuzz_worker import TOOL_TIMEOUT_S
from gguf_mutate import Source
from laguna_dflash.runtime import assets

WORKER = Path(__file__).resolve().parent / "gguf_fuzz_worker.py"
N_WORKERS = 2
CASE_TIMEOUT_S = 3 * TOOL_TIMEOUT_S  # a worker's own alarm ends a hung tool first


def fuzz_cases() -> list[dict]:
    cases = []
    for role, path in (("drafter", assets.converted_tiny_drafter()), ("target", assets.TINY_TARGET)):
        src = Source.of(path)
        for key, label in src.fuzz_cases():
            cases.append({"role": role, "kind": "value", "key": key, "value": label})
        for where, offset in src.truncation_offsets().items():
            cases.append({"role": role, "kind": "truncated", "where": where, "offset": offset})
    return cases


def describe(case: dict) -> str:
    what = f"{case['key']} = {case['value']}" if case["kind"] == "value" else \
        f"cut at byte {case['offset']} ({case['where']})"
    return f"{case['role']} {what}"


def _run_shard(spec_path: Path, results: Path, log: Path, first: int, last: int) -> list[str]:
    """Run cases [first, last) in workers, restarting after each death; returns the failures."""
    failures = []
    cases = json.loads(spec_path.read_text())["cases"]
    shard_spec = spec_path.with_name(f"{spec_path.stem}-{first}.json")
    spec = json.loads(spec_path.read_text())
    spec["cases"] = cases[first:last]
    spec["work_dir"] = str(spec_path.parent / f"shard-{first}")  # mutated copies must not collide
    Path(spec["work_dir"]).mkdir(exist_ok=True)
    shard_spec.write_text(json.dumps(spec))
    start = 0
    while start < last - first:
        with open(log, "a") as err:
            proc = subprocess.run([sys.executable, str(WORKER), str(shard_spec), str(results), str(start)],
                                  stdout=subprocess.DEVNULL, stderr=err,
                                  timeout=CASE_TIMEOUT_S * (last - first - start))
        events = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
        started = [e for e in events if e["event"] == "start"]
        finished = {(e["case"], e["tool"]) for e in events if e["event"] != "start"}
        if proc.returncode == 0:
            break
        dead = next((e for e in reversed(started) if (e["case"], e["tool"]) not in finished), None)
        if dead is None:  # died between cases (reading the originals): nothing to blame but the worker
            failures.append(f"worker exited {proc.returncode} outside any case")
            break
        last_words = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        failures.append(f"{describe(cases[first + dead['case']])}: {dead['tool']} died: {_death(proc.returncode)}"
                        f" (stderr: {last_words})")
        results.write_text(results.read_text() + json.dumps({"event": "died", **dead}) + "\n")
        start = dead["case"] + 1
    for e in (json.loads(line) for line in results.read_text().splitlines() if line.strip()):
        case = cases[first + e["case"]]
        if e["event"] == "traceback":
            failures.append(f"{describe(case)}: {e['tool']} raised {e['error']}\n{e['where']}")
        elif e["event"] == "done" and e["rc"] not in (0, 2):
            failures.append(f"{describe(case)}: {e['tool']} exited {e['rc']}")
    return failures


def _death(rc: int) -> str:
    if rc == -signal.SIGALRM:
        return f"ran over {TOOL_TIMEOUT_S} s"
    if rc < 0:
        return f"signal {signal.Signals(-rc).name}"
    return f"exit {rc}" + (" (abort)" if rc == 134 else " (segfault)" if rc == 139 else "")


def run_fuzz(cases: list[dict], work: Path) -> tuple[list[str], dict[int, dict[str, int]]]:
    """Run the cases in N_WORKERS parallel shards; (failures, exit codes by case index and tool)."""
    work.mkdir(parents=True, exist_ok=True)
    spec_path = work / "cases.json"
    spec_path.write_text(json.dumps({"target": str(assets.TINY_TARGET), "drafter": str(assets.converted_tiny_drafter()),
                                     "work_dir": str(work), "cases": cases}))
    bounds = [round(i * len(cases) / N_WORKERS) for i in range(N_WORKERS + 1)]
    with concurrent.futures.ThreadPoolExecutor(N_WORKERS) as pool:
        jobs = [pool.submit(_run_shard, spec_path, work / f"results-{a}.jsonl", work / f"stderr-{a}.log", a, b)
                for a, b in zip(bounds, bounds[1:])]
        failures = [f for j in jobs for f in j.result()]
    codes: dict[int, dict[str, int]] = {}
    for a in bounds[:-1]:
        for e in (json.loads(x) for x in (work / f"results-{a}.jsonl").read_text().splitlines() if x.strip()):
            if e["event"] == "done":
                codes.setdefault(a + e["case"], {})[e["tool"]] = e["rc"]
    return failures, codes


def test_fuzzed_and_truncated_headers_never_kill_the_process(tmp_path):
    cases = fuzz_cases()
    t0 = time.perf_counter()
    failures, codes = run_fuzz(cases, tmp_path)
    wall = time.perf_counter() - t0
    assert not failures, f"{len(failures)} of {len(cases)} cases failed:\n" + "\n".join(failures)
    assert len(codes) == len(cases)
    # the harness must reach llama.cpp: some mutations are harmless and run, the rest refuse
    ran = sum(1 for c in codes.values() if c.get("laguna-run") == 0)
    assert 0 < ran < len(cases)
    print(f"{len(cases)} cases in {wall:.0f} s; {ran} ran, {len(cases) - ran} refused")


if __name__ == "__main__":  # PYTHONPATH=. python tests/test_fuzz_gguf.py [SUBSTRING]: each case's exit codes
    import tempfile

    chosen = [c for c in fuzz_cases() if len(sys.argv) < 2 or sys.argv[1] in describe(c)]
    with tempfile.TemporaryDirectory() as d:
        fails, codes = run_fuzz(chosen, Path(d))
    for i, c in enumerate(chosen):
        print(f"{describe(c):70s} {codes.get(i)}")
    print("\n".join(fails) or "no failures")
