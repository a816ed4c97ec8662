"""What every benchmark leaves behind: its results JSON names the CPU it was measured on
(scripts/recorded.py, laguna_dflash.runtime.cores.cpu_facts) and, where a peer ran, the snapshot
that peer was built from; the peer benchmark prints both before its figures."""

from __future__ import annotations

import ast
import json
import stat
from pathlib import Path

import pytest

from laguna_dflash.runtime.cores import cpu_facts
from scripts.bench import bench_peer, bench_rows
from scripts.recorded import REPO, write_json, write_results

#: the lab's folders whose scripts write measurements
MEASURING = ("bench", "tuning", "investigate")
WRITERS = {"write_json", "write_results"}


def test_write_json_adds_the_cpu_and_keeps_the_result(tmp_path):
    out = tmp_path / "r.json"
    write_json(out, {"command": "python -m scripts.bench.x", "rows": [1.5]}, indent=None, separators=(",", ":"))
    text = out.read_text()
    assert text.endswith("\n") and "\n" not in text[:-1] and '"rows":[1.5]' in text
    result = json.loads(text)
    assert result == {"command": "python -m scripts.bench.x", "rows": [1.5], "cpu": cpu_facts()}
    assert result["cpu"]["model"] and result["cpu"]["cores"] >= 1


def test_write_results_goes_through_write_json(tmp_path):
    drawn = []
    printed = []
    console = type("Console", (), {"print": lambda self, line: printed.append(line)})()
    write_results({"a": 1}, tmp_path / "r.json", tmp_path / "r.png", lambda r, p: drawn.append(r), console)
    assert json.loads((tmp_path / "r.json").read_text())["cpu"] == cpu_facts()
    assert drawn == [{"a": 1}] and len(printed) == 2


def json_writes_around_write_json(source: str) -> list[int]:
    """Lines that write JSON to a file themselves: json.dump, or a write whose text is
    json.dumps(...)."""
    def dumps_inside(node) -> bool:
        return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "dumps"
                   and isinstance(n.func.value, ast.Name) and n.func.value.id == "json" for n in ast.walk(node))

    lines = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr == "dump" and isinstance(node.func.value, ast.Name) and node.func.value.id == "json":
            lines.append(node.lineno)
        elif node.func.attr in ("write_text", "write") and any(dumps_inside(a) for a in node.args):
            lines.append(node.lineno)
    return lines


def test_the_finder_sees_each_way_of_writing_json_by_hand():
    source = ("import json\np.write_text(json.dumps(r) + '\\n')\nf.write(json.dumps(r))\njson.dump(r, f)\n"
              "print(json.dumps(r))\nwrite_json(p, r)\n")
    assert json_writes_around_write_json(source) == [2, 3, 4]


def test_every_measuring_script_writes_its_json_through_write_json():
    scripts = sorted(f for folder in MEASURING for f in (REPO / "scripts" / folder).glob("*.py"))
    assert len(scripts) > 30
    by_hand = {str(f.relative_to(REPO)): lines for f in scripts
               if (lines := json_writes_around_write_json(f.read_text()))}
    assert by_hand == {}
    # a script that takes an output file names one of the writers
    silent = [str(f.relative_to(REPO)) for f in scripts
              if any(flag in f.read_text() for flag in ('"--json"', '"--out"'))
              and not WRITERS & {n.id for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.Name)}]
    assert silent == []


#: llama-bench -o json's answer: one sample per row count
ONE_SAMPLE_A_ROW_COUNT = ("echo '[{\"n_prompt\": 1, \"samples_ns\": [2000000], \"build_commit\": \"c0ffee\"},"
                          " {\"n_prompt\": 2, \"samples_ns\": [3000000], \"build_commit\": \"c0ffee\"}]'\n")


def fake_llama_bench(root: Path, commit: str | None, script: str = ONE_SAMPLE_A_ROW_COUNT) -> Path:
    """A llama-bench in ROOT/build/bin running SCRIPT (sh), as build_peer.sh lays a peer out
    (ROOT/.complete holding its commit)."""
    bin_dir = root / "build" / "bin"
    bin_dir.mkdir(parents=True)
    binary = bin_dir / "llama-bench"
    binary.write_text("#!/bin/sh\n" + script)
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    if commit:
        (root / ".complete").write_text(commit + "\n")
    return binary


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    """A target file for llama-bench's -m: the fakes never read it."""
    path = tmp_path / "target.gguf"
    path.write_bytes(b"GGUF")
    return path


def test_bench_rows_records_the_cpu_and_each_builds_snapshot(tmp_path, model):
    ik = fake_llama_bench(tmp_path / "ik_llama.cpp", "0123456789abcdef0123456789abcdef01234567")
    mine = fake_llama_bench(tmp_path / "elsewhere", None)
    out = tmp_path / "rows.json"
    assert bench_rows.main(["-m", str(model), "--config", f"ik={ik}", "--config", f"ours={mine}", "--rows", "1,2",
                            "--rounds", "1", "--reps", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["cpu"] == cpu_facts()
    assert result["peer_snapshot"] == {"ik": "0123456789abcdef0123456789abcdef01234567", "ours": None}
    assert result["build_commit"] == {"ik": "c0ffee", "ours": "c0ffee"}
    assert result["table"]["ik"]["2"]["median_ms"] == 3.0
    # a wrapper script loads no ggml library of its own: recorded as unknown, not refused
    assert result["libggml_cpu"] == {"ik": {"path": None, "sha256": None}, "ours": {"path": None, "sha256": None}}
    assert not out.with_suffix(".partial.json").exists()  # the full record replaced it


def test_bench_rows_keeps_the_rounds_done_when_a_later_one_fails(tmp_path, model):
    # the second call (round 2) fails, as a crash or a kill would
    ik = fake_llama_bench(tmp_path / "ik_llama.cpp", None, f"echo x >> {tmp_path}/calls\n"
                          f"[ $(wc -l < {tmp_path}/calls) -gt 1 ] && exit 1\n" + ONE_SAMPLE_A_ROW_COUNT)
    out = tmp_path / "rows.json"
    with pytest.raises(RuntimeError, match="failed"):
        bench_rows.main(["-m", str(model), "--config", f"ik={ik}", "--rows", "1,2", "--rounds", "2", "--reps", "1",
                         "--json", str(out)])
    assert not out.exists()
    partial = json.loads(out.with_suffix(".partial.json").read_text())
    assert partial["cpu"] == cpu_facts() and partial["rounds_done"] == 1
    assert partial["samples_ms"]["ik"]["2"] == [3.0]


def test_bench_rows_reports_the_median_of_round_means_against_a_configuration(tmp_path, model, capsys):
    """Round k of ours gives samples k, k and 10k ms (mean 4k: 4, 8, 12 over three rounds; the
    median of all nine samples is 3 ms, of the round means 8); ik gives 2 ms each time."""
    ours = fake_llama_bench(tmp_path / "ours", None, f"echo x >> {tmp_path}/calls\nk=$(wc -l < {tmp_path}/calls)\n"
                            "echo \"[{\\\"n_prompt\\\": 1, \\\"samples_ns\\\": [$((k*1000000)), $((k*1000000)), "
                            "$((k*10000000))]}]\"\n")
    ik = fake_llama_bench(tmp_path / "ik", None, "echo '[{\"n_prompt\": 1, \"samples_ns\": [2000000, 2000000, 2000000]}]'\n")
    out = tmp_path / "rows.json"
    assert bench_rows.main(["-m", str(model), "--config", f"ours={ours}", "--config", f"ik={ik}", "--rows", "1",
                            "--rounds", "3", "--reps", "3", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["table"]["ours"]["1"]["median_ms"] == 3.0
    assert result["round_means_ms"]["ours"]["1"] == [4.0, 8.0, 12.0]
    assert result["against"] == "ik"
    assert result["round_table"]["ours"]["1"] == {"median_ms": 8.0, "min_ms": 4.0, "max_ms": 12.0, "rounds": 3,
                                                  "x_against": 4.0, "x_against_min": 2.0, "x_against_max": 6.0}
    assert "| 1 | 8.00 [4.00-12.00] (4.000 [2.00-6.00]) | 2.00 [2.00-2.00] |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench_rows.main(["-m", str(model), "--config", f"ours={ours}", "--against", "nobody", "--rows", "1"])


def test_the_peer_benchmark_prints_the_cpu_and_the_peers_snapshots(tmp_path):
    cpu = cpu_facts()
    ik_bin = tmp_path / "ik" / "build" / "bin"
    lines = bench_peer.machine_lines(cpu, {bench_peer.IK: ik_bin, bench_peer.FLOOR: None},
                                     {bench_peer.IK: "0123abc", bench_peer.FLOOR: None})
    assert len(lines) == 2
    assert lines[0].startswith(f"CPU: {cpu['model']}, {cpu['cores']} cores")
    assert all(flag in lines[0].split("flags: ")[1].split() for flag in cpu["flags"])
    assert lines[1] == f"ik_llama.cpp: 0123abc ({ik_bin})"
    unknown = bench_peer.machine_lines(cpu, {bench_peer.IK: ik_bin}, {bench_peer.IK: None})[1]
    assert "snapshot unknown" in unknown
