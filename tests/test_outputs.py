"""runtime/outputs.py: an output never destroys an input, never blocks on a FIFO, and a failed
write leaves the old file (or the partial trace, named) and one line naming the path."""

from __future__ import annotations

import os
import threading

import pytest

from laguna_dflash.convert.errors import UserError
from laguna_dflash.runtime import outputs
from laguna_dflash.runtime.outputs import (AtomicFile, GuardedStream, OutputFailed, check_outputs, check_stdout,
                                           write_text)


@pytest.fixture
def files(tmp_path):
    model = tmp_path / "target.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 100)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("def f():\n")
    return tmp_path, model, prompt


def no_partials(d):
    return not [p for p in d.iterdir() if ".partial-" in p.name]


@pytest.mark.parametrize("alias", ["same", "hard link", "symlink", "relative name"])
@pytest.mark.parametrize("flag", ["--trace", "--json", "--png"])
def test_an_output_that_is_an_input_is_refused_and_left_alone(files, alias, flag, monkeypatch):
    d, model, prompt = files
    if alias == "same":
        out = model
    elif alias == "hard link":
        out = d / "linked.gguf"
        os.link(model, out)
    elif alias == "symlink":
        out = d / "sym.json"
        out.symlink_to(model)
    else:
        monkeypatch.chdir(d)
        out = type(model)("sub/../target.gguf")
        (d / "sub").mkdir()
    before = model.read_bytes()
    with pytest.raises(UserError, match=rf"{flag}: is an input of this run.*choose another name"):
        check_outputs({flag: out}, inputs=[model, prompt], stdout=False)
    assert model.read_bytes() == before
    assert no_partials(d)


def test_a_fifo_device_or_directory_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "rounds.jsonl"
    os.mkfifo(fifo)
    result = {}

    def check():  # opening a FIFO for writing would block until a reader comes: it must not be opened
        try:
            check_outputs({"--trace": fifo}, stdout=False)
        except UserError as e:
            result["error"] = str(e)

    t = threading.Thread(target=check, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "checking a FIFO output blocked"
    assert "expected a regular file to write, found a FIFO" in result["error"]
    with pytest.raises(UserError, match="found a character device"):
        check_outputs({"--trace": "/dev/full"}, stdout=False)
    with pytest.raises(UserError, match="found a character device"):
        check_outputs({"--json": "/dev/null"}, stdout=False)
    with pytest.raises(UserError, match="--json: expected a file path, found a directory"):
        check_outputs({"--json": tmp_path}, stdout=False)


def test_a_place_that_cannot_be_written_is_refused(tmp_path):
    with pytest.raises(UserError, match="expected an existing directory to write into"):
        check_outputs({"--json": tmp_path / "missing" / "out.json"}, stdout=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="expected an existing directory to write into"):
        check_outputs({"--json": tmp_path / "file" / "out.json"}, stdout=False)
    with pytest.raises(UserError, match=r"/proc/laguna-out.json: --trace: cannot write into /proc"):
        check_outputs({"--trace": "/proc/laguna-out.json"}, stdout=False)  # refused even to root
    assert no_partials(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write read-only files")
def test_a_read_only_file_is_left_alone(tmp_path):
    out = tmp_path / "keep.json"
    out.write_text("{}")
    out.chmod(0o444)
    with pytest.raises(UserError, match="read-only"):
        check_outputs({"--json": out}, stdout=False)


def test_png_format_comes_from_the_suffix(tmp_path):
    pytest.importorskip("matplotlib")
    with pytest.raises(UserError, match=r"out.txt: --png: expected a name ending in one of .*\.png.*found \.txt"):
        check_outputs({"--png": tmp_path / "out.txt"}, stdout=False)
    assert check_outputs({"--png": tmp_path / "chart.svg"}, stdout=False)["--png"].format == "svg"
    assert check_outputs({"--png": tmp_path / "chart"}, stdout=False)["--png"].format == "png"


def test_two_outputs_on_one_file_are_refused(tmp_path):
    out = tmp_path / "out.json"
    link = tmp_path / "link.json"
    link.symlink_to(out)
    with pytest.raises(UserError, match="--trace: is also --json's output"):
        check_outputs({"--json": out, "--trace": link}, stdout=False)


def test_atomic_file_replaces_the_old_one_only_when_complete(tmp_path):
    out = tmp_path / "bench.json"
    out.write_text("old")
    out.chmod(0o640)
    (o,) = check_outputs({"--json": out}, stdout=False).values()
    with pytest.raises(RuntimeError):
        with AtomicFile(o) as f:
            f.write("half")
            assert out.read_text() == "old"
            raise RuntimeError("the run failed")
    assert out.read_text() == "old" and no_partials(tmp_path)
    write_text(o, "new")
    assert out.read_text() == "new" and no_partials(tmp_path)
    assert out.stat().st_mode & 0o777 == 0o640


def test_a_symlinked_output_writes_the_file_it_names(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_text(check_outputs({"--json": link}, stdout=False)["--json"], "new")
    assert link.is_symlink() and real.read_text() == "new"


def dev_full_temp(path, mode):
    return os.open("/dev/full", os.O_WRONLY)


def test_a_full_disk_keeps_the_old_file_and_writes_the_results_elsewhere(tmp_path, monkeypatch, capsys):
    import sys

    out = tmp_path / "bench.json"
    out.write_text("old")
    o = check_outputs({"--json": out}, stdout=False)["--json"]
    monkeypatch.setattr(outputs, "_create_temp", dev_full_temp)  # every write: ENOSPC
    with pytest.raises(OutputFailed) as e:
        write_text(o, '{"rows": [1, 2]}', fallback=sys.stderr)
    message = str(e.value)
    assert "\n" not in message
    assert f"{out}: --json: write failed (No space left on device)" in message
    assert "the results were written to stderr instead" in message
    assert capsys.readouterr().err == '{"rows": [1, 2]}\n'
    assert out.read_text() == "old" and no_partials(tmp_path)
    with pytest.raises(OutputFailed, match="the file was left as it was"):
        write_text(o, "x")


def test_a_live_trace_that_fails_mid_run_keeps_its_lines_and_names_them(tmp_path):
    out = tmp_path / "rounds.jsonl"
    out.write_text("old trace\n")
    o = check_outputs({"--trace": out}, stdout=False)["--trace"]
    trace = AtomicFile(o, live=True).open()
    trace.write('{"round": 0}\n')
    trace.write('{"round": 1}\n')
    assert trace.partial.read_text() == '{"round": 0}\n{"round": 1}\n'  # line-buffered: followable live
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, trace.file.fileno())  # the disk fills up
    os.close(full)
    with pytest.raises(OutputFailed) as e:
        trace.write('{"round": 2}\n')
    assert str(e.value) == (f"{out}: --trace: write failed (No space left on device); the part written so far "
                            f"is in {trace.partial}")
    assert trace.partial.read_text() == '{"round": 0}\n{"round": 1}\n'
    assert out.read_text() == "old trace\n"
    with pytest.raises(OutputFailed):  # every later write says the same
        trace.write("x\n")


def test_a_live_trace_of_a_failed_run_is_kept_aside_or_removed_when_empty(tmp_path):
    out = tmp_path / "rounds.jsonl"
    o = check_outputs({"--trace": out}, stdout=False)["--trace"]
    with pytest.raises(ValueError):
        with AtomicFile(o, live=True) as t:
            t.write('{"round": 0}\n')
            raise ValueError("generation failed")
    assert not out.exists() and t.partial.read_text() == '{"round": 0}\n'
    t.partial.unlink()
    with pytest.raises(ValueError):
        with AtomicFile(o, live=True):
            raise ValueError("refused before the first round")
    assert not out.exists() and no_partials(tmp_path)
    with AtomicFile(o, live=True) as t:
        t.write('{"round": 0}\n')
    assert out.read_text() == '{"round": 0}\n' and no_partials(tmp_path)


def test_stdout_on_a_full_disk_or_a_closed_pipe_is_one_line_naming_it():
    with open("/dev/full", "w") as f:
        s = GuardedStream(f)
        s.write("abc")
        with pytest.raises(OutputFailed, match=r"^stdout \(/dev/full\): write failed \(No space left on device\)$"):
            s.flush()
        assert s.failed
        with pytest.raises(OutputFailed):
            s.write("more")
    r, w = os.pipe()
    os.close(r)
    with os.fdopen(w, "w") as f:
        s = GuardedStream(f)
        with pytest.raises(OutputFailed, match=r"^stdout \(pipe:.*\): write failed \(the reading end was closed\)$"):
            s.write("x" * 100_000)
            s.flush()


def test_stdout_checks(files):
    d, model, prompt = files
    with open(prompt, "a") as f:  # laguna-run -f prompt.txt >> prompt.txt
        with pytest.raises(UserError, match=r"stdout \(.*prompt.txt\): is an input of this run"):
            check_stdout([model, prompt], stream=f)
    out = d / "out.txt"
    with open(out, "w") as f:
        check_stdout([model, prompt], stream=f)
        with pytest.raises(UserError, match="stdout .* is also --json's output"):
            check_stdout([model], stream=f, outputs={"--json": out})
    with open("/dev/full", "w") as f:
        with pytest.raises(UserError, match=r"stdout \(/dev/full\): expected a terminal, a pipe, /dev/null"):
            check_stdout([model], stream=f)
    with open(os.devnull, "w") as f:
        check_stdout([model], stream=f)
    r, w = os.pipe()
    with os.fdopen(w, "w") as f:
        check_stdout([model], stream=f)
    os.close(r)
    f = open(out, "w")
    f.close()
    with pytest.raises(UserError, match="stdout: expected an open output, found it closed"):
        check_stdout([model], stream=f)


def test_a_file_inside_an_input_directory_is_an_input(tmp_path):
    checkpoint = tmp_path / "drafter-hf"
    (checkpoint / "sub").mkdir(parents=True)
    weights = checkpoint / "sub" / "model.safetensors"
    weights.write_bytes(b"weights")
    with pytest.raises(UserError, match="is an input of this run"):
        check_outputs({"--trace": weights}, inputs=[checkpoint], stdout=False)
    check_outputs({"--trace": tmp_path / "elsewhere.jsonl"}, inputs=[checkpoint], stdout=False)
