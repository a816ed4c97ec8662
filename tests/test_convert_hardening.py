"""laguna-gguf convert never replaces an input, never writes garbage silently, never ends in a traceback.

One test (or parametrised group) per class of issue 18's converter share: output paths, shard
confinement, non-finite / overflowing weights, OS errors while writing, unencodable metadata,
and SIGINT / SIGTERM during a real conversion subprocess.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from convert_fixtures import PRESETS, leftovers, read_gguf, run_cli, target_for
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType, GGUFWriter

from laguna_dflash.convert.gguf import keys as K
from laguna_dflash.convert.converter import prepare
from laguna_dflash.convert.errors import ContractError, UserError
from laguna_dflash.convert.quantize import check_values
from laguna_dflash.convert.safetensors_io import read_header
from helpers.synthetic import write_drafter
from laguna_dflash.convert.target import read_target
from laguna_dflash.convert.writer import KV, TensorSpec, write_gguf

REPO = Path(__file__).resolve().parent.parent
XS = PRESETS["xs"]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    """A tiny drafter directory and a target GGUF that pairs with it."""
    return write_drafter(tmp_path / "drafter", **XS), target_for(XS, tmp_path / "target.gguf")


# --------------------------------------------------------------------------- 1. the output path


@pytest.mark.parametrize("which", ["model.safetensors", "config.json", "target", "symlink", "hardlink"])
def test_output_that_is_an_input_is_refused(tmp_path: Path, pair: tuple[Path, Path], which: str) -> None:
    drafter, target = pair
    victim = target if which == "target" else drafter / ("config.json" if which == "config.json" else
                                                         "model.safetensors")
    out = victim
    if which == "symlink":
        out = tmp_path / "link.gguf"
        out.symlink_to(drafter / "model.safetensors")
    elif which == "hardlink":
        out = tmp_path / "hard.gguf"
        os.link(drafter / "model.safetensors", out)
    before = sha(victim)
    res = run_cli("convert", drafter, "--target", target, "-o", out, "-q")
    assert res.code == 2, res.stdout + res.stderr
    line = one_error_line(res.stderr)
    expected = "the target file" if which == "target" else "an input of this conversion"
    if which in ("symlink", "hardlink"):
        expected += f" ({drafter / 'model.safetensors'}, through a link or another name)"
    assert line == f"error: -o {out}: is {expected}; choose another output name", line
    assert sha(victim) == before
    assert not list(tmp_path.rglob("*.partial-*"))


def test_output_that_is_a_shard_or_the_index_is_refused(tmp_path: Path) -> None:
    drafter = write_drafter(tmp_path / "d", **XS, shards=2)
    target = target_for(XS, tmp_path / "t.gguf")
    for name in ("model-00002-of-00002.safetensors", "model.safetensors.index.json"):
        before = sha(drafter / name)
        res = run_cli("convert", drafter, "--target", target, "-o", drafter / name, "-q")
        assert res.code == 2, res.stderr
        assert one_error_line(res.stderr) == (f"error: -o {drafter / name}: is an input of this conversion; "
                                              "choose another output name")
        assert sha(drafter / name) == before


def test_output_that_is_a_file_of_an_hf_target_directory_is_refused(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    drafter, target_gguf = pair
    hf = tmp_path / "Target-HF"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "tokenizer.json").write_text('{"model": {}}')
    target = dataclasses.replace(read_target(target_gguf), source=hf)
    job = prepare(drafter, target)
    with pytest.raises(UserError, match=r"tokenizer\.json: is an input of this conversion; choose"):
        job.write(hf / "tokenizer.json")
    assert (hf / "tokenizer.json").read_text() == '{"model": {}}'
    job.write(hf / "drafter.gguf")  # a new file next to the target's is fine
    assert (hf / "drafter.gguf").is_file()


@pytest.mark.parametrize("kind", ["fifo", "directory", "device-symlink"])
def test_output_that_is_not_a_regular_file_is_refused(tmp_path: Path, pair: tuple[Path, Path], kind: str) -> None:
    drafter, target = pair
    out = tmp_path / "special.gguf"
    if kind == "fifo":
        os.mkfifo(out)
    elif kind == "directory":
        out.mkdir()
    else:  # a symlink to /dev/null: the link (not /dev/null) is what a rename would replace
        out.symlink_to("/dev/null")
    res = run_cli("convert", drafter, "--target", target, "-o", out, "-q")
    assert res.code == 2, res.stderr
    line = one_error_line(res.stderr)
    expected = {"fifo": "a FIFO", "directory": "a directory", "device-symlink": "a character device"}[kind]
    assert line.startswith(f"error: -o {out}: is {expected}; expected the name of a regular file"), line
    mode = out.lstat().st_mode
    assert {"fifo": stat.S_ISFIFO, "directory": stat.S_ISDIR, "device-symlink": stat.S_ISLNK}[kind](mode)
    assert not list(tmp_path.glob("*.partial-*"))


def test_missing_output_directory(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    drafter, target = pair
    out = tmp_path / "no" / "such" / "dir" / "o.gguf"
    res = run_cli("convert", drafter, "--target", target, "-o", out, "-q")
    assert res.code == 2
    assert f"-o {out}: the output directory {out.parent} does not exist" in one_error_line(res.stderr)


# --------------------------------------------------------------------------- 2. shard confinement


def _sharded_with_entry(tmp_path: Path, make_entry: Any) -> tuple[Path, Path, str]:
    """A 2-shard drafter whose second shard is moved outside and named by ``make_entry(drafter, moved)``."""
    drafter = write_drafter(tmp_path / "d", **XS, shards=2)
    shard = "model-00002-of-00002.safetensors"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    moved = outside / shard
    shutil.move(drafter / shard, moved)
    entry = make_entry(drafter, moved)
    index = drafter / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"] = {k: (entry if v == shard else v) for k, v in data["weight_map"].items()}
    index.write_text(json.dumps(data))
    return drafter, target_for(XS, tmp_path / "t.gguf"), entry


def _link_inside(drafter: Path, moved: Path) -> str:
    (drafter / "innocent.safetensors").symlink_to(moved)
    return "innocent.safetensors"


@pytest.mark.parametrize("make_entry,fragment", [
    (lambda d, m: "../elsewhere/" + m.name, "(no absolute path, no '..')"),
    (lambda d, m: str(m), "(no absolute path, no '..')"),
    (_link_inside, "which leads to"),
], ids=["dot-dot", "absolute", "symlink-out"])
def test_index_entries_are_confined_to_the_checkpoint(tmp_path: Path, make_entry: Any, fragment: str) -> None:
    drafter, target, entry = _sharded_with_entry(tmp_path, make_entry)
    res = run_cli("convert", drafter, "--target", target, "-o", tmp_path / "o.gguf", "-q")
    assert res.code == 2, res.stdout + res.stderr
    line = one_error_line(res.stderr)
    assert line.startswith(f"error: {drafter / 'model.safetensors.index.json'}: weight_map["), line
    assert "expected a shard file inside" in line and fragment in line and json.dumps(entry) in line
    assert leftovers(tmp_path) == ["t.gguf"]


def test_hugging_face_cache_layout_is_accepted(tmp_path: Path) -> None:
    """snapshots/<rev>/<shard> -> ../../blobs/<hash>: how huggingface_hub's cache stores every file."""
    repo = tmp_path / "models--poolside--Tiny-DFlash"
    snap = write_drafter(repo / "snapshots" / "abc123", **XS, shards=2)
    (repo / "blobs").mkdir()
    for f in sorted(snap.glob("model-*.safetensors")):
        blob = repo / "blobs" / sha(f)
        shutil.move(f, blob)
        f.symlink_to(Path("../../blobs") / blob.name)
    res = run_cli("convert", snap, "--target", target_for(XS, tmp_path / "t.gguf"), "-o", tmp_path / "o.gguf", "-q")
    assert res.code == 0, res.stderr


def test_a_fifo_as_weights_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    # Hold a writer end with a few bytes in it, so that a reader that does open the FIFO gets data, not a hang.
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        os.write(fd, bytes(8))
        with pytest.raises(UserError, match="expected a regular safetensors file, found a FIFO"):
            read_header(fifo)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- 3. non-finite and overflowing weights


def _poke(drafter: Path, tensor: str, index: int, value: float) -> None:
    """Overwrite element ``index`` of ``tensor`` in the drafter's model.safetensors (stored dtype kept)."""
    path = drafter / "model.safetensors"
    ref = read_header(path)[tensor]
    if ref.dtype == "F32":
        raw = np.array([value], np.float32).tobytes()
    elif ref.dtype == "F16":
        raw = np.array([value], np.float16).tobytes()
    else:
        raw = (np.array([value], np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    with open(path, "r+b") as f:
        f.seek(ref.offset + index * len(raw))
        f.write(raw)


MATRIX = "layers.0.mlp.down_proj.weight"
NORM = "layers.1.post_attention_layernorm.weight"


@pytest.mark.parametrize("outtype", ["bf16", "f16", "f32", "q8_0"])
@pytest.mark.parametrize("tensor,value,found", [
    (MATRIX, float("nan"), "found nan at [0, 37]"),
    (MATRIX, float("-inf"), "found -inf at [0, 37]"),
    (NORM, float("inf"), "found inf at [37]"),  # norms stay F32 whatever the outtype
], ids=["nan", "-inf", "norm-inf"])
def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path: Path, pair: tuple[Path, Path], outtype: str,
                                                          tensor: str, value: float, found: str) -> None:
    drafter, target = pair
    _poke(drafter, tensor, 37, value)
    res = run_cli("convert", drafter, "--target", target, "-o", tmp_path / "o.gguf", "--outtype", outtype, "-q")
    assert res.code == 2, res.stdout + res.stderr
    line = one_error_line(res.stderr)
    assert f"model.safetensors: {tensor}: values: expected finite numbers (no NaN or Inf), {found}" in line, line
    assert leftovers(tmp_path) == ["target.gguf"]


@pytest.mark.parametrize("outtype,value,expected", [
    ("f16", 70000.0, "expected |x| <= 65504 to fit F16"),
    ("bf16", 3.4e38, "expected |x| < 3.39618e+38 to fit BF16"),
    ("q8_0", 1e7, "expected |x| <= 8.31901e+06 for Q8_0 (use --outtype bf16)"),
])
def test_values_that_overflow_the_outtype_are_refused(tmp_path: Path, outtype: str, value: float,
                                                      expected: str) -> None:
    drafter = write_drafter(tmp_path / "d", **XS, dtype="f32")
    _poke(drafter, MATRIX, 5, value)
    res = run_cli("convert", drafter, "--target", target_for(XS, tmp_path / "t.gguf"), "-o", tmp_path / "o.gguf",
                  "--outtype", outtype, "-q")
    assert res.code == 2, res.stdout + res.stderr
    line = one_error_line(res.stderr)
    assert f"{MATRIX}: values: {expected}" in line, line
    assert leftovers(tmp_path) == ["t.gguf"]
    # f32 holds any float32: the same checkpoint converts.
    assert run_cli("convert", drafter, "--target", tmp_path / "t.gguf", "-o", tmp_path / "o.gguf",
                   "--outtype", "f32", "-q").code == 0


def test_the_value_check_allocates_nothing_the_size_of_the_tensor() -> None:
    x = np.random.default_rng(0).standard_normal((1024, 2048), dtype=np.float32)  # 8 MiB
    tracemalloc.start()
    try:
        for qtype in (Q.F32, Q.F16, Q.BF16, Q.Q8_0):
            check_values(x, qtype, "t")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < x.nbytes // 16, peak
    x[3, 4] = np.nan
    with pytest.raises(ContractError, match=r"t: values: expected finite numbers .*found nan at \[3, 4\]"):
        check_values(x, Q.F32, "t")


# --------------------------------------------------------------------------- 4. OS errors and unencodable values


@pytest.mark.parametrize("where", ["tensor", "close"])
def test_full_disk_while_writing_is_one_line_and_leaves_nothing(tmp_path: Path, pair: tuple[Path, Path],
                                                                monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """ENOSPC in a tensor's write, or in the final flush (which fails again when the cleanup closes the file)."""
    drafter, target = pair
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    if where == "tensor":
        real = GGUFWriter.write_tensor_data
        calls = []

        def write_then_fill_up(self: GGUFWriter, tensor: np.ndarray, *a: Any, **k: Any) -> None:
            calls.append(1)
            if len(calls) == 3:
                raise full
            real(self, tensor, *a, **k)

        monkeypatch.setattr(GGUFWriter, "write_tensor_data", write_then_fill_up)
    else:
        def close_fails_to_flush(self: GGUFWriter) -> None:
            for f in self.fout or []:
                f.close()
            raise full

        monkeypatch.setattr(GGUFWriter, "close", close_fails_to_flush)
    out = tmp_path / "out" / "o.gguf"
    out.parent.mkdir()
    res = run_cli("convert", drafter, "--target", target, "-o", out, "-q")
    assert res.code == 2, res.stdout + res.stderr
    line = one_error_line(res.stderr)
    what = "tensor " if where == "tensor" else "the end of the file "
    assert line.startswith(f"error: -o {out}: writing {what}"), line
    assert "failed: No space left on device (ENOSPC); the partial file was removed" in line
    assert list(out.parent.iterdir()) == []


def _mount_tiny_tmpfs(where: Path, size: str) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    return r.returncode == 0


def test_a_really_full_disk(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    """A 64 KiB tmpfs: the error may surface in a write or in the flush at close (needs root and mount)."""
    drafter, target = pair
    disk = tmp_path / "disk"
    if not _mount_tiny_tmpfs(disk, "64k"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        res = run_cli("convert", drafter, "--target", target, "-o", disk / "o.gguf", "-q")
        assert res.code == 2, res.stdout + res.stderr
        line = one_error_line(res.stderr)
        assert f"-o {disk / 'o.gguf'}: writing " in line and "No space left on device (ENOSPC)" in line, line
        assert list(disk.iterdir()) == []
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_unwritable_output_directory(tmp_path: Path, pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    drafter, target = pair
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:  # root writes anywhere: make creating the partial file fail as it would for a user
        real_open = os.open

        def refuse(path: Any, flags: int, *a: Any, **k: Any) -> int:
            if ".partial-" in str(path):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return real_open(path, flags, *a, **k)

        monkeypatch.setattr(os, "open", refuse)
    else:
        ro.chmod(0o555)
    try:
        res = run_cli("convert", drafter, "--target", target, "-o", ro / "o.gguf", "-q")
    finally:
        ro.chmod(0o755)
    assert res.code == 2, res.stdout + res.stderr
    line = one_error_line(res.stderr)
    assert line == f"error: -o {ro / 'o.gguf'}: cannot create a file in {ro}: Permission denied (EACCES)", line
    assert list(ro.iterdir()) == []


def test_a_name_that_is_not_utf8_is_refused(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    """A non-UTF-8 command-line argument reaches Python as lone surrogates, which GGUF strings cannot hold."""
    drafter, target = pair
    out = tmp_path / "o.gguf"
    res = run_cli("convert", drafter, "--target", target, "-o", out, "--name", "caf\udce9", "-q")
    assert res.code == 2, res.stdout + res.stderr
    assert one_error_line(res.stderr) == (f"error: {out}: metadata general.name: expected a UTF-8 string, "
                                          "found 'caf\\udce9'")
    assert leftovers(tmp_path) == ["target.gguf"]


@pytest.mark.parametrize("kv,field,expected", [
    (KV(2**32, GGUFValueType.UINT32), "metadata k", "an integer in 0..4294967295 (UINT32)"),
    (KV(-1, GGUFValueType.UINT32), "metadata k", "an integer in 0..4294967295 (UINT32)"),
    (KV(1.5, GGUFValueType.INT32), "metadata k", "an integer in -2147483648..2147483647 (INT32)"),
    (KV(1e39, GGUFValueType.FLOAT32), "metadata k", "a number within +-3.40282e+38 (FLOAT32)"),
    (KV([1, 2**31], GGUFValueType.ARRAY, GGUFValueType.INT32), "metadata k[1]", "an integer in -2147483648"),
    (KV([], GGUFValueType.ARRAY, GGUFValueType.INT32), "metadata k", "a non-empty array"),
    (KV([b"ok", "\udc80"], GGUFValueType.ARRAY, GGUFValueType.STRING), "metadata k[1]", "a UTF-8 string"),
], ids=["u32-overflow", "u32-negative", "int-float", "f32-overflow", "array-item", "empty-array", "string-item"])
def test_metadata_the_writer_cannot_encode(tmp_path: Path, kv: KV, field: str, expected: str) -> None:
    out = tmp_path / "o.gguf"
    specs = [TensorSpec("t", (32,), Q.F32)]
    with pytest.raises(ContractError) as e:
        write_gguf(out, K.ARCH, {"ok": KV(1, GGUFValueType.UINT32), "k": kv}, specs, [np.zeros(32, np.float32)])
    assert str(e.value).startswith(f"{out}: {field}: expected {expected}"), str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_a_planted_partial_file_is_never_written_through(tmp_path: Path) -> None:
    """The partial name is predictable (PID); a symlink planted there must not redirect the write."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "o.gguf"
    (tmp_path / f"o.gguf.partial-{os.getpid()}").symlink_to(victim)
    with pytest.raises(UserError, match=r"the temporary file .* already exists"):
        write_gguf(out, K.ARCH, {}, [TensorSpec("t", (32,), Q.F32)], [np.zeros(32, np.float32)])
    assert victim.read_text() == "precious" and not out.exists()


# --------------------------------------------------------------------------- 5. signals


#: Runs the real CLI with every tensor's encoding slowed down, so a signal lands mid-write.
#: SIGINT is reset to Python's default handler: a child of a non-interactive shell may inherit it ignored.
SLOW_CLI = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
import laguna_dflash.convert.converter as c
_encode = c.encode
def slow_encode(*a, **k):
    time.sleep(0.15)
    return _encode(*a, **k)
c.encode = slow_encode
from laguna_dflash.convert.cli import main
sys.argv[0] = "laguna-gguf"
main()
"""


@pytest.mark.parametrize("signum,code,word", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                              (signal.SIGINT, 130, "interrupted (SIGINT)")], ids=["term", "int"])
def test_a_signal_mid_write_removes_the_partial_file(tmp_path: Path, pair: tuple[Path, Path], signum: int,
                                                     code: int, word: str) -> None:
    drafter, target = pair
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", SLOW_CLI, "convert", str(drafter), "--target", str(target),
                             "-o", str(out_dir / "o.gguf"), "-q"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not any(p.stat().st_size > 0 for p in out_dir.glob("o.gguf.partial-*")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the conversion never started writing"
            time.sleep(0.02)
        time.sleep(0.3)  # a few tensors in
        assert proc.poll() is None, "the conversion finished before the signal"
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, (proc.returncode, stderr)
    assert one_error_line(stderr) == f"error: {word}: no output written, the partial file was removed"
    assert list(out_dir.iterdir()) == []


# --------------------------------------------------------------------------- valid input: unchanged


def test_valid_input_still_converts_to_the_same_file(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    drafter, target = pair
    for outtype in ("q8_0", "bf16"):
        out = tmp_path / f"o-{outtype}.gguf"
        res = run_cli("convert", drafter, "--target", target, "-o", out, "--outtype", outtype, "-q")
        assert res.code == 0, res.stderr
        again = run_cli("convert", drafter, "--target", target, "-o", out, "--outtype", outtype, "-q")
        assert again.code == 0, again.stderr  # overwriting a previous output is still allowed
        assert read_gguf(out).tensors.keys()
