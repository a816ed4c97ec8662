"""A wheel built from the repository is a working install on its own: package data, names, entry points.

The wheel goes into a fresh virtual environment next to the patched llama-cpp-python wheel that
``make setup`` cached (its other dependencies come from the package index, or pip's cache), and
``laguna-run`` runs the bundled pair from a directory outside the repository: nothing may come
from the source tree.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return r


@pytest.mark.slow
def test_a_wheel_of_the_repository_runs_the_bundled_pair_in_a_fresh_venv(tmp_path):
    # built from a copy: an in-tree build leaves build/ behind, whose stale files a later wheel would carry
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info",
                                                              "__pycache__", ".pytest_cache", ".cache", ".gpu"))
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", src, "--no-deps", "--no-build-isolation", "-q", "-w", dist])
    (ours,) = dist.glob("laguna_dflash-*.whl")
    llama = Path(_run([sys.executable, REPO / "scripts" / "build_wheel.py", "--wheel-path"]).stdout.split()[-1])
    assert llama.is_file()

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    clean["LAGUNA_DFLASH_CACHE"] = str(tmp_path / "cache")  # the demo drafter is converted afresh
    _run([bin_dir / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", llama, ours], env=clean)

    work = tmp_path / "elsewhere"
    work.mkdir()
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
