"""The package's shape: no import cycle among laguna_dflash's modules, imports only across the
lines docs/architecture.md's layer table draws (the GGUF contract imports nothing above it), one
place that rewrites a Poolside-layout drafter, laguna-run's command module split by command,
patch headers that name only paths that exist, and the product apart from the lab: no test
imports a module of scripts/, and nothing in the product or the tests edits the interpreter's
module path."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"convert": "laguna_dflash.convert", "runtime": "laguna_dflash.runtime"}


def package_modules() -> dict[str, Path]:
    """Module name -> file, for every .py file of the installed package (convert/, runtime/)."""
    modules = {}
    for folder, prefix in ROOTS.items():
        for f in sorted((REPO / folder).rglob("*.py")):
            rel = f.relative_to(REPO / folder).with_suffix("")
            if folder == "runtime" and rel.parts[0] == "data":  # the bundled pairs and prompt files, not code
                continue
            parts = [p for p in rel.parts if p != "__init__"]
            modules[".".join([prefix, *parts])] = f
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports, anywhere in the file (a function-level import
    closes a cycle as surely as a top-level one, only later)."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # "from X import name": the submodule X.name when there is one, else X itself
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                cycle = visit(m)
                if cycle:
                    return cycle
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            cycle = visit(n)
            if cycle:
                return cycle
    return None


def test_the_import_graph_finder_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_import_graph_sees_relative_and_lazy_imports():
    modules = package_modules()
    graph = {n: imports_of(n, p, modules) for n, p in modules.items()}
    assert "laguna_dflash.runtime.rpc" in graph["laguna_dflash.runtime.llama"]  # inside functions
    assert "laguna_dflash.runtime.cli.serve" in graph["laguna_dflash.runtime.cli.main"]
    assert "laguna_dflash.runtime.drafter_cache" in graph["laguna_dflash.runtime.open_pair"]


def test_no_import_cycle_in_the_package():
    modules = package_modules()
    graph = {n: imports_of(n, p, modules) for n, p in modules.items()}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_one_call_site_rewrites_a_poolside_drafter():
    calls = []
    for name, path in package_modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                if getattr(f, "id", None) == "native_drafter_path" or getattr(f, "attr", None) == "native_drafter_path":
                    calls.append(name)
    assert calls == ["laguna_dflash.runtime.open_pair"]


def test_laguna_run_is_split_by_command():
    assert not (REPO / "runtime" / "cli.py").exists()
    for f in (REPO / "runtime" / "cli").glob("*.py"):
        assert len(f.read_text(encoding="utf-8").splitlines()) < 300, f


def test_the_engine_asks_the_drafter_only_what_the_proposer_protocol_lists():
    from laguna_dflash.runtime.drafter import Drafter
    from laguna_dflash.runtime.proposer import Proposer

    allowed = {n for n in vars(Proposer) if not n.startswith("_")} | set(Proposer.__annotations__)
    used = set()
    for f in ("engine.py", "prompt_cache.py"):
        for node in ast.walk(ast.parse((REPO / "runtime" / f).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute):
                owner = node.value
                name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", None)
                if name in ("drafter", "proposer"):
                    used.add(node.attr)
    assert used and used <= allowed, used - allowed
    assert all(callable(getattr(Drafter, n)) for n in allowed - set(Proposer.__annotations__))  # methods


def test_every_repository_path_a_patch_header_names_exists():
    """A patch's header says why and how it was measured, naming the scripts and docs to rerun;
    a script moved since must not leave the header pointing nowhere."""
    import re

    named = {}
    for patch in sorted((REPO / "patches").glob("*.patch")):
        header = patch.read_text(encoding="utf-8").split("\ndiff ", 1)[0]
        for path in re.findall(r"\b(?:scripts|docs|tests|runtime|convert)/[\w./-]*\w", header):
            named.setdefault(path, []).append(patch.name)
    assert named, "no patch header names a repository path: the pattern is wrong"
    assert [(p, by) for p, by in named.items() if not (REPO / p).exists()] == []


# ---------------------------------------------------------------------- the layers of docs/architecture.md

ARCHITECTURE = REPO / "docs" / "architecture.md"


def layer_table() -> dict[str, tuple[str, set[str]]]:
    """docs/architecture.md's table: layer -> (its folder, the layers it may import)."""
    rows, in_table = {}, False
    for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells == ["layer", "folder", "may import"]:
            in_table = True
        elif in_table and cells is None:
            break
        elif in_table and not set(cells[0]) <= {"-"}:
            allowed = {a.strip() for a in cells[2].split(",")} - {"—", ""}
            rows[cells[0]] = (cells[1].strip("`").rstrip("/"), allowed)
    return rows


def layer_of(path: Path, table: dict[str, tuple[str, set[str]]]) -> str | None:
    rel = path.relative_to(REPO).as_posix()
    holding = [(len(folder), name) for name, (folder, _) in table.items() if rel.startswith(folder + "/")]
    return max(holding)[1] if holding else None


def test_the_layer_table_is_read():
    table = layer_table()
    assert {"gguf", "convert", "runtime", "server", "cli"} <= set(table)
    assert table["gguf"] == ("convert/gguf", set())
    assert "gguf" in table["convert"][1] and "cli" not in table["runtime"][1]
    assert layer_of(REPO / "runtime" / "server" / "app.py", table) == "server"
    assert layer_of(REPO / "convert" / "gguf" / "keys.py", table) == "gguf"


def test_every_import_crosses_only_the_lines_the_architecture_page_draws():
    table = layer_table()
    for name, (folder, allowed) in table.items():
        assert (REPO / folder).is_dir(), f"{folder}: in docs/architecture.md's table, not in the tree"
        assert allowed <= set(table), f"{name} may import {allowed - set(table)}: no such layer"
    modules = package_modules()
    layers = {name: layer_of(path, table) for name, path in modules.items()}
    assert [n for n, layer in layers.items() if layer is None] == [], "modules in no layer of the table"
    crossing = []
    for name, path in modules.items():
        for target in imports_of(name, path, modules):
            mine, theirs = layers[name], layers[target]
            if theirs != mine and theirs not in table[mine][1]:
                crossing.append(f"{name} ({mine}) imports {target} ({theirs})")
    assert crossing == []


def test_the_gguf_contract_imports_nothing_above_it():
    """Named on its own because both halves stand on it (the table's first row)."""
    modules = package_modules()
    for name, path in modules.items():
        if name.startswith("laguna_dflash.convert.gguf"):
            above = {t for t in imports_of(name, path, modules) if not t.startswith("laguna_dflash.convert.gguf")}
            assert above == set(), f"{name} imports {above}"


def test_what_the_architecture_page_names_exists():
    """Its paths, and each Class.member it names along a request's path."""
    import re

    text = ARCHITECTURE.read_text(encoding="utf-8")
    paths = set(re.findall(r"`((?:convert|runtime|tests|docs)/[\w./]*)`", text))
    assert len(paths) > 10 and [p for p in sorted(paths) if not (REPO / p).exists()] == []
    members = {}
    for path in package_modules().values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                members.setdefault(node.name, set()).update(
                    n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    named = set(re.findall(r"`([A-Z]\w*)\.(\w+)`", text))
    assert len(named) >= 5
    assert [f"{c}.{m}" for c, m in sorted(named) if m not in members.get(c, ())] == []


#: the interpreter's module path, written so that a search for it finds only real uses
MODULE_PATH = re.compile(r"\bsys\s*\.\s*path\b")


def lab_names() -> set[str]:
    """The top-level names that reach scripts/: the package itself, and the modules and folders a
    script run as a file (or a test with scripts/ on its path) would import bare."""
    lab = REPO / "scripts"
    return {"scripts"} | {p.stem for p in lab.glob("*.py")} | {p.name for p in lab.iterdir() if (p / "__init__.py").exists()}


def lab_imports(source: str, lab: set[str]) -> list[tuple[int, str]]:
    """(line, module) of every absolute import of a name in ``lab``, at any depth of the file."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        found += [(node.lineno, n) for n in names if n.split(".")[0] in lab]
    return found


def test_the_lab_import_finder_sees_every_form():
    source = ("import scripts.bench.bench_peer\nfrom training.demo_pair import x\n"
              "def g():\n    import recorded as r\nfrom . import training\nimport trainingset\n")
    assert lab_imports(source, {"scripts", "training", "recorded"}) == [
        (1, "scripts.bench.bench_peer"), (2, "training.demo_pair"), (4, "recorded")]
    assert {"scripts", "recorded", "bench", "training"} <= lab_names()


def test_no_test_imports_a_module_of_the_lab():
    """Tests import the installed package and their own helpers (tests/helpers/); what they share
    with the lab lives there, and a lab script a test exercises runs as a process."""
    lab = lab_names()
    found = [f"{f.relative_to(REPO)}:{line} {mod}" for f in sorted((REPO / "tests").rglob("*.py"))
             for line, mod in lab_imports(f.read_text(encoding="utf-8"), lab)]
    assert found == []


def test_nothing_in_the_product_or_the_tests_edits_the_module_path():
    """Imports resolve the same way everywhere: the package as installed, the tests' helpers through
    pytest's pythonpath; the lab's scripts run from the repository root as ``python -m scripts...``."""
    assert MODULE_PATH.search("sys" + ".path.insert(0, here)") and not MODULE_PATH.search("sys" + ".pathname")
    found = [f"{f.relative_to(REPO)}:{n}" for folder in ("convert", "runtime", "tests", "scripts")
             for f in sorted((REPO / folder).rglob("*.py"))
             for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1) if MODULE_PATH.search(line)]
    assert found == []


def test_every_gguf_key_is_spelled_once():
    """A metadata key the product reads or writes is gguf-py's constant or convert/gguf/keys.py's,
    never a string literal of its own elsewhere (tensor names are mapping's and each layout's)."""
    import gguf

    from laguna_dflash.convert.gguf import keys

    known = {v for group in vars(gguf.Keys).values() if isinstance(group, type)
             for v in vars(group).values() if isinstance(v, str) and "." in v}
    known |= {v for n, v in vars(keys).items() if n.isupper() and isinstance(v, str) and "." in v
              and not v.endswith((".weight", ".bias"))}
    assert "tokenizer.ggml.tokens" in known and keys.BLOCK_COUNT in known
    spelled = []
    for name, path in package_modules().items():
        if name == "laguna_dflash.convert.gguf.keys":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        spelled += [f"{path.relative_to(REPO)}:{node.lineno} {node.value}" for node in ast.walk(tree)
                    if isinstance(node, ast.Constant) and node.value in known and id(node) not in docstrings]
    assert spelled == []
