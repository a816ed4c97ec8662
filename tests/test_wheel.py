"""The project's wheel, as `pip install <clone>` builds it: no packaging warning, exactly the files
intended (the package's code, the bundled pairs and prompts, the patch series that `laguna-run
setup` applies, its metadata) and nothing else, and no dependency on llama-cpp-python (pip would
compile the stock sdist, which setup then replaces). In a fresh virtual environment (no extras), with the
patched wheel that `laguna-run setup` finds in the cache, ``laguna-run`` runs the bundled pair from
a directory outside the repository: nothing may come from the source tree.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from laguna_dflash.runtime.setup import wheel as patched_wheel

REPO = Path(__file__).resolve().parents[1]
#: pip's complaint about this machine's package index configuration, not about the package
INDEX_NOISE = re.compile(r"WARNING: Location '.*' is ignored")


def _run(cmd: list, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return r


def source_files() -> list[str]:
    """What git would hand a user: tracked files and new ones it does not ignore."""
    listed = _run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO).stdout.split("\n")
    return [f for f in listed if f and (REPO / f).is_file()]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str, list[str]]:
    """The wheel pip builds from a copy of the source (an in-tree build leaves build/ behind, whose
    stale files a later wheel would carry), its build output, and the copied files."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    files = source_files()
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, src / f)
    dist = tmp / "dist"
    # with build isolation and -v, as `pip install <clone>` builds it, the backend's warnings shown
    r = _run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--disable-pip-version-check",
              "-w", dist, src])
    (ours,) = dist.glob("laguna_dflash-*.whl")
    return ours, r.stdout + r.stderr, files


def intended(files: list[str]) -> set[str]:
    """Each source file that belongs in the wheel, under its installed name."""
    names = set()
    for f in files:
        top, _, rest = f.partition("/")
        if top in ("convert", "runtime") and (f.endswith(".py") or rest.startswith("data/")):
            names.add(f"laguna_dflash/{f}")
        elif top == "patches" and (f.endswith(".patch") or rest == "series"):
            names.add(f"laguna_dflash/{f}")
    return names


@pytest.mark.slow
def test_building_the_wheel_prints_no_packaging_warning(built):
    _, output, _ = built
    warnings = [ln.strip() for ln in output.splitlines()
                if re.search(r"\w+Warning\b|is absent from|WARNING:", ln) and not INDEX_NOISE.search(ln)]
    assert warnings == []


@pytest.mark.slow
def test_the_wheel_holds_the_package_its_data_and_the_patches_and_nothing_else(built):
    ours, _, files = built
    with zipfile.ZipFile(ours) as z:
        names = {n for n in z.namelist() if not n.endswith("/")}
    meta = {n for n in names if n.split("/")[0].endswith(".dist-info")}
    assert names - meta == intended(files)
    assert {"laguna_dflash/patches/series", "laguna_dflash/runtime/data/laguna-tiny/Laguna-Tiny-target-Q8_0.gguf",
            "laguna_dflash/runtime/setup/wheel.py"} <= names
    assert not [n for n in names if n.startswith(("tests/", "scripts/", "docs/")) or "__pycache__" in n]


@pytest.mark.slow
def test_the_wheel_does_not_depend_on_llama_cpp_python(built):
    ours, _, _ = built
    with zipfile.ZipFile(ours) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [ln for ln in z.read(meta).decode().splitlines() if ln.startswith("Requires-Dist:")]
    assert requires and not [r for r in requires if re.search(r"llama[-_]cpp[-_]python", r, re.IGNORECASE)]


@pytest.mark.slow
def test_a_wheel_of_the_repository_runs_the_bundled_pair_in_a_fresh_venv(built, tmp_path):
    cached = patched_wheel.plan().cached_wheel()
    if cached is None:
        pytest.skip("no patched llama-cpp-python in the cache: run laguna-run setup")
    ours, _, _ = built
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # a cache of its own (the demo drafter is converted afresh) whose wheels are the real cache's
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "wheels").symlink_to(patched_wheel.cache_root() / "wheels")
    clean["LAGUNA_DFLASH_CACHE"] = str(cache)
    _run([bin_dir / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", ours], env=clean)

    work = tmp_path / "elsewhere"
    work.mkdir()
    before = subprocess.run([bin_dir / "laguna-run", "-p", "x", "-n", "1"], cwd=work, env=clean,
                            capture_output=True, text=True)
    assert before.returncode == 2 and before.stderr.strip().splitlines() == [
        "error: llama-cpp-python is not installed: run `laguna-run setup` to build (or reuse) and install the "
        "patched wheel"]
    # a plain install has no server extra: serve's help still shows, and serve says what to install
    assert "--parallel" in _run([bin_dir / "laguna-run", "serve", "--help"], cwd=work, env=clean).stdout
    serve = subprocess.run([bin_dir / "laguna-run", "serve"], cwd=work, env=clean, capture_output=True, text=True)
    assert serve.returncode == 2 and len(serve.stderr.strip().splitlines()) == 1 and "[server]" in serve.stderr
    setup = _run([bin_dir / "laguna-run", "setup"], cwd=work, env=clean)
    assert "reusing cached" in setup.stderr and "the CPU build of this install's patches" in setup.stdout

    where = _run([bin_dir / "python", "-c", "import laguna_dflash.runtime.assets as a, laguna_dflash.convert as c;"
                  "print(a.TINY_TARGET); print(a.CODE_PROMPTS); print(c.__file__)"], cwd=work, env=clean)
    for line in where.stdout.split():
        path = Path(line)
        assert path.exists() and env_dir in path.parents, line

    out = _run([bin_dir / "laguna-run", "-p", "def fibonacci(n):", "-n", "24", "--n-max", "3", "--json"],
               cwd=work, env=clean)
    res = json.loads(out.stdout)
    assert len(res["tokens"]) > 0 and res["stats"]["rounds"] >= 1
    assert res["stats"]["accepted"] > 0  # the bundled drafter, converted from the wheel's data, drafts
