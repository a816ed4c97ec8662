"""laguna-run setup: the wheel's cache key, the patch series found from the installed package, the
--check report, and the one line every message about a missing patched wheel gives a user."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from laguna_dflash.runtime import bindings, cores, patch_series
from laguna_dflash.runtime.cli import main
from laguna_dflash.runtime.setup import report, wheel

REPO = Path(__file__).resolve().parents[1]


def test_the_patch_series_is_the_one_of_this_tree():
    assert patch_series.PATCH_DIR == REPO / "patches"
    assert [p.name for p in patch_series.series()] == [ln.strip() for ln in (REPO / "patches" / "series").read_text()
                                                .splitlines() if ln.strip() and not ln.startswith("#")]


def test_the_cache_key_follows_patch_content_order_and_flags(tmp_path):
    a, b = tmp_path / "0001-a.patch", tmp_path / "0002-b.patch"
    a.write_bytes(b"one\n")
    b.write_bytes(b"two\n")
    flags = wheel.build_flags(False, "native")
    key = wheel.cache_key([a, b], flags)
    assert re.fullmatch(r"[0-9a-f]{10}\.[0-9a-f]{6}", key) and key == wheel.cache_key([a, b], list(flags))
    assert wheel.cache_key([b, a], flags) != key
    other_flags = wheel.cache_key([a, b], flags + ["-DX=1"])
    assert other_flags != key and other_flags.split(".")[0] == key.split(".")[0] == patch_series.series_key([a, b])
    b.write_bytes(b"two, changed\n")
    assert wheel.cache_key([a, b], flags) != key and patch_series.series_key([a, b]) != key.split(".")[0]
    assert wheel.wheel_version(key) == f"0.3.36+laguna.{key}"


def _cuda_version() -> str:
    """A CUDA wheel's version for these patches (its flags stood in for: no toolkit probed here)."""
    return wheel.wheel_version(wheel.cache_key(patch_series.series(), [*wheel.build_flags(False, "90"), "-DGGML_CUDA=on"]))


def test_a_wheel_version_names_its_patch_series_whatever_its_flags():
    want = patch_series.this_series()
    assert patch_series.series_of(wheel.plan().version) == want
    assert patch_series.series_of(_cuda_version()) == want and _cuda_version() != wheel.plan().version
    # a stock wheel, ours from before versions named the series, anything else: no series
    for version in (None, "0.3.36", "0.3.36+laguna.d616464d41", f"0.3.37+laguna.{want}.ad3c87", "junk"):
        assert patch_series.series_of(version) is None


def test_the_runtime_refuses_a_wheel_of_other_patches_in_one_line(tmp_path):
    bindings.check_series(wheel.plan().version)
    bindings.check_series(_cuda_version())
    other = tmp_path / "0001-other.patch"
    other.write_bytes(b"other\n")
    stale = wheel.wheel_version(wheel.cache_key([other], wheel.build_flags(False, "native")))
    for version in (stale, "0.3.36+laguna.d616464d41", None):
        with pytest.raises(bindings.PatchedWheelMissing) as e:
            bindings.check_series(version)
        assert str(e.value) == (f"llama-cpp-python {version} is not built from this laguna-dflash's patches "
                                f"(series {patch_series.this_series()}); run `laguna-run setup` to build "
                                "and install it")


def test_an_install_without_its_patch_listing_is_refused_in_one_line(tmp_path, monkeypatch):
    version = wheel.plan().version
    monkeypatch.setattr(patch_series, "PATCH_DIR", tmp_path)
    with pytest.raises(patch_series.PatchSeriesError, match=rf"^{tmp_path / 'series'}: missing; it lists the patches"):
        bindings.check_series(version)


def test_laguna_run_under_a_stale_wheel_exits_2_and_setup_check_names_the_problem():
    """An install upgraded without setup: the same patched libraries, a version naming other patches."""
    stale = "import llama_cpp; llama_cpp.__version__ = '0.3.36+laguna.d616464d41'; "
    run = [sys.executable, "-c", stale + "import sys; from laguna_dflash.runtime.cli import main; "
           "sys.exit(main(['-p', 'x', '-n', '1']))"]
    r = subprocess.run(run, capture_output=True, text=True)
    why = ("llama-cpp-python 0.3.36+laguna.d616464d41 is not built from this laguna-dflash's patches "
           f"(series {patch_series.this_series()}); run `laguna-run setup` to build and install it")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"error: {why}"]
    check = [sys.executable, "-c", stale + "import sys; from laguna_dflash.runtime.cli import main; "
             "sys.exit(main(['setup', '--check']))"]
    r = subprocess.run(check, capture_output=True, text=True)
    assert r.returncode == 1
    assert f"problem: {why}" in r.stdout and "Laguna patches: present" not in r.stdout


def test_the_installed_wheel_is_this_trees_cpu_build():
    """make setup-test installed it through laguna-run setup: its version names the key of these patches."""
    assert wheel.installed_version() == wheel.plan().version


def test_cpu_features_are_read_from_llama_cpp_system_info():
    info = "CPU : SSE3 = 1 | AVX = 1 | AVX512 = 0 | OPENMP = 1 | "
    assert cores.cpu_features(info) == ["SSE3", "AVX", "OPENMP"]
    assert cores.cpu_features("no cpu section") == []


def test_check_reports_the_patched_build_its_backends_and_cpu_features(capsys):
    assert main(["setup", "--check"]) == 0
    out = capsys.readouterr().out
    assert f"llama-cpp-python: {wheel.plan().version}, the CPU build of this install's patches" in out
    assert "Laguna patches: present" in out
    assert re.search(r"^backends: .*\bCPU\b", out, re.MULTILINE)
    assert re.search(r"^CPU features: \w+", out, re.MULTILINE)


def test_check_says_what_is_missing_and_exits_1(monkeypatch, capsys):
    monkeypatch.setattr(wheel, "installed_version", lambda: None)
    assert main(["setup", "--check"]) == 1
    assert capsys.readouterr().out.strip() == "llama-cpp-python: not installed (run `laguna-run setup`)"


def test_setup_reuses_the_cached_wheel_and_installs_nothing_when_it_is_installed(monkeypatch, capsys):
    if wheel.plan().cached_wheel() is None:
        pytest.skip("no cached wheel (this test never compiles llama.cpp)")
    monkeypatch.setattr(wheel, "install", lambda path: pytest.fail("installed again"))
    monkeypatch.setattr(wheel, "build", lambda *a, **k: pytest.fail("compiled"))
    assert main(["setup", "--no-install"]) == 0
    assert "reusing cached" in capsys.readouterr().err


def test_without_llama_cpp_python_laguna_run_says_to_run_setup_in_one_line(tmp_path):
    # a llama_cpp that cannot be imported stands first on the path
    (tmp_path / "llama_cpp").mkdir()
    (tmp_path / "llama_cpp" / "__init__.py").write_text("raise ImportError('no llama_cpp here')\n")
    r = subprocess.run([sys.executable, "-c", "import sys; from laguna_dflash.runtime.cli import main; "
                        "sys.exit(main(['-p', 'x', '-n', '1']))"], capture_output=True, text=True,
                       env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["error: llama-cpp-python is not installed: run `laguna-run setup` to "
                                             "build (or reuse) and install the patched wheel"]


def test_no_message_names_the_build_script_or_make():
    """A pip user has neither scripts/ nor the Makefile: every message names laguna-run setup."""
    found = []
    for folder in ("runtime", "convert"):
        for f in (REPO / folder).rglob("*.py"):
            for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
                if re.search(r"build_wheel|make setup", line):
                    found.append(f"{f.relative_to(REPO)}:{n}")
    assert found == []


@pytest.mark.slow
def test_a_build_streams_its_step_counters_to_the_progress_and_keeps_its_log(tmp_path, monkeypatch):
    """The compile's own lines drive the progress display; a stand-in source tree prints ninja's
    counters instead of compiling llama.cpp."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\nbuild-backend = '
                                         '"setuptools.build_meta"\n[project]\nname = "standin"\nversion = "1"\n')
    (tree / "setup.py").write_text("import sys\nfor i in (1, 2, 3):\n    print(f'[{i}/3] Building CXX object', "
                                   "file=sys.stderr, flush=True)\nfrom setuptools import setup\nsetup(py_modules=[])\n")
    monkeypatch.setattr(wheel, "check_rpc_server", lambda path: None)
    monkeypatch.setattr(wheel, "log", lambda msg: None)
    seen = []
    built = wheel.build(tree, [], tmp_path / "wheels" / "k", cuda=False, progress=lambda d, t: seen.append((d, t)))
    assert built.name.startswith("standin-1-") and built.parent == tmp_path / "wheels" / "k"
    assert seen[-3:] == [(1, 3), (2, 3), (3, 3)]  # the last pass is the build (setuptools runs setup.py twice)
    assert "[3/3] Building CXX object" in (built.parent / "build.log").read_text()


@pytest.mark.slow
def test_a_failed_build_names_its_log_and_leaves_no_wheel(tmp_path, monkeypatch):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "setup.py").write_text("raise SystemExit('compiler exploded')\n")
    monkeypatch.setattr(wheel, "log", lambda msg: None)
    out = tmp_path / "wheels" / "k"
    with pytest.raises(wheel.BuildError, match=r"wheel build failed \(full log: .*build\.log\)"):
        wheel.build(tree, [], out, cuda=False)
    assert not out.exists()
