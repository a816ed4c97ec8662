"""Every command's --help, as a user reads it: no value type on a flag that takes none (typer's
``<bool>``), a help line for every option and argument, and no reference to a document the user
does not have (the project's internal SPEC); nor does any message the product prints cite it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import typer

from laguna_dflash.convert import cli as gguf_cli
from laguna_dflash.runtime import rpc_server
from laguna_dflash.runtime.cli import main as run_main

REPO = Path(__file__).resolve().parents[1]


def laguna_run_apps() -> dict:
    from laguna_dflash.runtime.cli.bench import bench_app
    from laguna_dflash.runtime.cli.run import run_app
    from laguna_dflash.runtime.cli.serve import serve_app
    from laguna_dflash.runtime.cli.setup import setup_app

    return {(): run_app, ("bench",): bench_app, ("serve",): serve_app, ("setup",): setup_app}


def every_command():
    """(program, arguments before --help, click command) for each command and subcommand."""
    found = [("laguna-run", words, typer.main.get_command(app)) for words, app in laguna_run_apps().items()]
    found.append(("laguna-run", ("chat",), typer.main.get_command(laguna_run_apps()[()])))
    group = typer.main.get_command(gguf_cli.app)
    found.append(("laguna-gguf", (), group))
    found += [("laguna-gguf", (name,), command) for name, command in group.commands.items()]
    found.append(("laguna-rpc-server", (), typer.main.get_command(rpc_server.app)))
    return found


MAINS = {"laguna-run": run_main, "laguna-gguf": gguf_cli.main, "laguna-rpc-server": rpc_server.main}
COMMANDS = every_command()


@pytest.mark.parametrize("program,words,command", COMMANDS, ids=[" ".join([p, *w]) for p, w, _ in COMMANDS])
def test_the_help_shows_no_bool_type_and_cites_no_spec(capsys, program, words, command):
    assert MAINS[program]([*words, "--help"]) == 0
    out = capsys.readouterr().out
    assert "--help" in out
    for word in ("<bool>", "BOOLEAN", "SPEC"):
        assert word not in out, f"{program} {' '.join(words)} --help shows {word}"


@pytest.mark.parametrize("program,words,command", COMMANDS, ids=[" ".join([p, *w]) for p, w, _ in COMMANDS])
def test_every_option_has_a_help_line(program, words, command):
    missing = [p.name for p in command.params if not getattr(p, "hidden", False) and not (p.help or "").strip()]
    assert missing == [], f"{program} {' '.join(words)}: no help for {missing}"


def test_the_walk_sees_every_command():
    names = {" ".join([p, *w]) for p, w, _ in COMMANDS}
    assert {"laguna-run", "laguna-run bench", "laguna-run serve", "laguna-run setup", "laguna-gguf convert", "laguna-gguf inspect",
            "laguna-rpc-server"} <= names
    assert any(p.name == "top_k" for _, w, c in COMMANDS if w == () for p in c.params)


def _messages(path: Path):
    """The string literals of a module that are not docstrings (what it may print)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_no_message_of_the_product_cites_the_spec():
    from test_structure import package_modules

    citing = [f for f in package_modules().values() if "SPEC §" in f.read_text(encoding="utf-8")]
    assert citing, "no module cites SPEC even in a comment or docstring: the scan reads nothing"
    found = [f"{f.relative_to(REPO)}:{line}" for f in citing for line, text in _messages(f) if "SPEC §" in text]
    assert found == []


def test_the_serve_help_names_every_api_it_serves():
    from laguna_dflash.runtime.server import anthropic, responses

    served = {"/v1/chat/completions", "/v1/completions", "/v1/models", responses.PATH, anthropic.PATH,
              anthropic.PATH + "/count_tokens"}
    text = typer.main.get_command(laguna_run_apps()[("serve",)]).help
    assert not {path for path in served if path not in text.split()
                and path + "," not in text.split()}, text
