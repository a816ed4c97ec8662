"""laguna-run as a new user meets it: the help lists the commands, flags look like flags, and
the prompt can come from standard input."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from laguna_dflash.runtime.cli import main

REPO = Path(__file__).resolve().parents[1]


def help_of(capsys, *command: str) -> str:
    assert main([*command, "--help"]) == 0
    return capsys.readouterr().out


def test_top_level_help_lists_every_command(capsys):
    out = help_of(capsys)
    for command in ("run", "bench", "serve"):
        assert re.search(rf"^\s*{command}\s", out, re.M), f"{command} missing from laguna-run --help"


@pytest.mark.parametrize("command", [(), ("run",), ("bench",), ("serve",)])
def test_boolean_flags_take_no_value_in_the_help(capsys, command):
    out = help_of(capsys, *command)
    assert "--verbose" in out and "--force-placement" in out
    assert "<bool>" not in out and "BOOLEAN" not in out


@pytest.mark.parametrize("command", [("bench",), ("serve",)])
def test_shared_flags_are_the_same_in_every_command(capsys, command):
    run_help, other = help_of(capsys), help_of(capsys, *command)
    for flag in ("--ctx-size", "--batch-size", "--ubatch-size", "--n-gpu-layers-draft", "--device",
                 "--draft-device", "--cache-type", "--rpc", "--tensor-split", "--draft-rpc", "--rpc-timeout"):
        assert flag in run_help and flag in other, flag


@pytest.mark.parametrize("path", ["-", "/dev/stdin"])
def test_prompt_from_standard_input(path):
    run = [sys.executable, "-m", "laguna_dflash.runtime.cli", "-n", "8", "-t", "1", "--json"]
    by_flag = subprocess.run([*run, "-p", "def add(a, b):"], capture_output=True, text=True, timeout=300, cwd=REPO)
    piped = subprocess.run([*run, "-f", path], input="def add(a, b):", capture_output=True, text=True, timeout=300,
                           cwd=REPO)
    assert piped.returncode == 0 and "no such prompt file" not in piped.stderr, piped.stderr
    assert json.loads(piped.stdout)["tokens"] == json.loads(by_flag.stdout)["tokens"]
