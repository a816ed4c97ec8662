"""Synthetic agent conversations over the standard library, with real tool outputs.

Each task is a user request an agent answers with the tools of ``examples/agent_tools.py``
(``list_dir``, ``read_file``, ``grep``, ``run_python``) run for real against a workspace (the
standard library's directory), so every tool result in the training data is what the demo's
tools return. A task knows the calls a correct agent makes and the facts its answer must
contain, which is how held-out tasks are scored (:func:`score`).

Families: where a function is defined (grep), what a module is for (read_file of its
docstring), what a package holds (list_dir), evaluating expressions (run_python; two calls in
one turn for two expressions), showing a definition's first lines (grep, then read_file: two
steps), a missing module (a tool error handled), a greeting (no tool), and repeating a phrase
(no tool: copying, which the others rely on). Subjects come from
the training modules; held-out tasks use the modules, packages and numbers the training never
saw (``stdlib_corpus.HELD_OUT``, ``HELD_OUT_PACKAGES``).

Answers come in two styles with the same facts: ``"plain"`` (the shipped pair's: "`f` is defined
in `a.py` at line 12", "2 * 3 = 6") and ``"quoted"``, where every fact in an answer is a verbatim
run of a tool result ("`f` is defined at `a.py:12`", "It prints 6.", the docstring's source line,
the listing as listed), so a model finds a fact by pointing at where it starts in the result and
copies the rest token by token, instead of composing it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

try:  # the tests: examples/ is on pytest's pythonpath
    from agent_tools import TOOLS, Workspace, parse_arguments
except ModuleNotFoundError:  # the lab (scripts/), run from the repository root
    from examples.agent_tools import TOOLS, Workspace, parse_arguments

from .stdlib_corpus import HELD_OUT, read, stdlib_dir

HELD_OUT_PACKAGES = ("html", "wsgiref", "xmlrpc", "urllib", "dbm")
#: modules whose import has side effects or needs a display: never a subject
SKIP_MODULES = {"antigravity", "this", "__hello__", "__phello__", "turtle", "idlelib", "tkinter", "__future__",
                "_pydecimal", "_pyio", "__main__"}


@dataclass
class Step:
    """One assistant message: optional reasoning, then tool calls or a final answer."""
    reasoning: str
    calls: list[tuple[str, dict]] = field(default_factory=list)
    content: str = ""


@dataclass
class Task:
    family: str
    user: str
    steps: list[Step]
    #: substrings the final answer must contain
    facts: list[str]
    #: (tool name, argument name, argument value) the first tool call must have; None for no tool
    first_call: tuple[str, str, Any] | None


@dataclass
class Subjects:
    functions: list[tuple[str, str, int]]  # (name, file, line) of a top-level def unique to one module
    docs: list[tuple[str, str]]  # (module, first docstring line), docstring on line 1
    packages: list[str]
    modules: list[str]


def subjects(root: Path, held_out: bool) -> Subjects:
    """Task subjects from the training modules (or only the held-out ones)."""
    files = sorted(p for p in root.glob("*.py") if p.stem not in SKIP_MODULES)
    defs: dict[str, list[tuple[str, int]]] = {}
    docs = []
    for p in files:
        text = read(p)
        for n, line in enumerate(text.splitlines(), 1):
            if line.startswith("def ") and "(" in line:
                defs.setdefault(line[4:line.index("(")], []).append((p.name, n))
        wanted = (p.name in HELD_OUT) == held_out
        if wanted and text.startswith('"""'):
            try:
                doc = ast.get_docstring(ast.parse(text))
            except SyntaxError:
                continue
            first = (doc or "").strip().splitlines()[0] if doc else ""
            if 8 < len(first) < 90 and text.splitlines()[0].startswith('"""' + first[:10]):
                docs.append((p.stem, first))
    functions = [(name, where[0][0], where[0][1]) for name, where in sorted(defs.items())
                 if len(where) == 1 and not name.startswith("_") and (where[0][0] in HELD_OUT) == held_out]
    packages = sorted(d.name for d in root.iterdir() if (d / "__init__.py").exists() and d.name not in SKIP_MODULES
                      and not d.name.startswith(("_", "test", "idle", "site-")))
    packages = [p for p in packages if (p in HELD_OUT_PACKAGES) == held_out]
    modules = [p.stem for p in files if (p.name in HELD_OUT) == held_out]
    return Subjects(functions, docs, packages, modules)


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _expression(rng, held_out: bool) -> str:
    lo, hi = (100, 1000) if held_out else (2, 100)
    a, b, c = (int(x) for x in rng.integers(lo, hi, 3))
    return _pick(rng, [f"{a} * {b}", f"{a} + {b} * {c}", f"{a} * {b} - {c}", f"({a} + {b}) * {c}",
                       f"{a} ** 2", f"sum(range({a}))", f"{a * b} // {c}", f"{a} % {c}"])


def _first_lines(result: str) -> tuple[str, int]:
    """(file, line) of the first ``file:line: text`` match."""
    where = result.splitlines()[0].split(":")
    return where[0], int(where[1])


ANSWER_STYLES = ("plain", "quoted")


def make_task(ws: Workspace, subj: Subjects, rng, held_out: bool, family: str | None = None,
              answers: str = "plain") -> Task:
    if answers not in ANSWER_STYLES:
        raise ValueError(f"answer style {answers!r}: expected one of {ANSWER_STYLES}")
    quoted = answers == "quoted"
    family = family or _pick(rng, ["find_def", "find_def", "module_doc", "list_pkg", "evaluate", "evaluate",
                                   "two_exprs", "def_lines", "def_lines", "missing", "hello", "repeat", "repeat"])
    if family == "find_def":
        name, file, line = _pick(rng, subj.functions)
        user = _pick(rng, [f"Where is the function `{name}` defined?", f"Which file defines `{name}`?",
                           f"Find the definition of `{name}`."])
        calls = [("grep", {"text": f"def {name}(", "path": "."})]
        return Task(family, user, [
            Step(f"To find where `{name}` is defined I will search the sources for `def {name}(`.", calls),
            Step(f"The search found one definition, at `{file}:{line}`." if quoted else
                 f"The search found one definition, in `{file}` at line {line}.",
                 content=f"`{name}` is defined at `{file}:{line}`." if quoted else
                 f"`{name}` is defined in `{file}` at line {line}.")],
            [file, str(line)], ("grep", "text", f"def {name}("))
    if family == "module_doc":
        mod, doc = _pick(rng, subj.docs)
        user = _pick(rng, [f"What is the module `{mod}` for?", f"What does `{mod}` do?",
                           f"Summarise the `{mod}` module in one line."])
        calls = [("read_file", {"path": f"{mod}.py", "start": 1, "lines": 5})]
        if quoted:  # the docstring's line as read_file shows it, after its line number
            answer = "Its docstring begins: " + ws.call("read_file", {"path": f"{mod}.py", "start": 1, "lines": 1}).split(": ", 1)[1]
        else:
            answer = f"According to its docstring, `{mod}` is: {doc}"
        return Task(family, user, [
            Step(f"The first lines of `{mod}.py` hold its docstring, which says what it is for.", calls),
            Step("The docstring's first line answers the question.", content=answer)],
            [doc[:24]], ("read_file", "path", f"{mod}.py"))
    if family == "list_pkg":
        pkg = _pick(rng, subj.packages)
        calls = [("list_dir", {"path": pkg})]
        listing = ws.call("list_dir", {"path": pkg}).splitlines()
        shown = [n for n in listing if not n.startswith("...")]
        user = _pick(rng, [f"What files are in the `{pkg}` package?", f"List the package `{pkg}`."])
        return Task(family, user, [
            Step(f"Listing the directory `{pkg}` shows its files.", calls),
            Step(f"The listing has {len(shown)} entries.",
                 content="The package contains:\n" + "\n".join(shown[:8]) + ("\n..." if len(shown) > 8 else "")
                 if quoted else
                 f"The `{pkg}` package contains: " + ", ".join(shown[:8]) + (", ..." if len(shown) > 8 else "."))],
            shown[:2], ("list_dir", "path", pkg))
    if family == "evaluate":
        expr = _expression(rng, held_out)
        value = ws.call("run_python", {"code": f"print({expr})"})
        user = _pick(rng, [f"What is {expr}?", f"Compute {expr}.", f"Evaluate `{expr}` in Python."])
        return Task(family, user, [
            Step(f"I will run `print({expr})` in Python to get the exact value.", [("run_python", {"code": f"print({expr})"})]),
            Step(f"Python printed {value}.", content=f"It prints {value}." if quoted else f"{expr} = {value}")],
            [value], ("run_python", "code", f"print({expr})"))
    if family == "two_exprs":
        e1, e2 = _expression(rng, held_out), _expression(rng, held_out)
        v1, v2 = (ws.call("run_python", {"code": f"print({e})"}) for e in (e1, e2))
        user = f"What are {e1} and {e2}?"
        return Task(family, user, [
            Step("Two independent values: I will run both in Python at once.",
                 [("run_python", {"code": f"print({e1})"}), ("run_python", {"code": f"print({e2})"})]),
            Step(f"The results are {v1} and {v2}.",
                 content=f"They print {v1} and {v2}." if quoted else f"{e1} = {v1} and {e2} = {v2}.")],
            [v1, v2], ("run_python", "code", f"print({e1})"))
    if family == "def_lines":
        name, file, line = _pick(rng, subj.functions)
        user = _pick(rng, [f"Show me the first lines of the function `{name}`.", f"How does `{name}` start?"])
        first = ws.call("read_file", {"path": file, "start": line, "lines": 4})
        return Task(family, user, [
            Step(f"First I need the file and line of `{name}`; a search for its definition gives both.",
                 [("grep", {"text": f"def {name}(", "path": "."})]),
            Step(f"It is in `{file}` at line {line}; I will read the lines from there.",
                 [("read_file", {"path": file, "start": line, "lines": 4})]),
            Step("These are the first lines of the function.",
                 content=f"In `{file}`:\n{first}" if quoted else
                 f"`{name}` starts at line {line} of `{file}`:\n\n" +
                 "\n".join(l.split(": ", 1)[1] if ": " in l else "" for l in first.splitlines()))],
            [file, f"def {name}("], ("grep", "text", f"def {name}("))
    if family == "missing":
        mod = _pick(rng, subj.modules) + _pick(rng, ["_utils", "lib", "_tools", "x"])
        user = f"What is the module `{mod}` for?"
        calls = [("read_file", {"path": f"{mod}.py", "start": 1, "lines": 5})]
        return Task(family, user, [
            Step(f"The first lines of `{mod}.py` would hold its docstring.", calls),
            Step(f"The file `{mod}.py` does not exist here.",
                 content=f"There is no module `{mod}` in this workspace: `{mod}.py` does not exist.")],
            ["no module"], ("read_file", "path", f"{mod}.py"))
    if family == "hello":
        user = _pick(rng, ["Hello!", "Hi, what can you do?", "Who are you?"])
        return Task(family, user, [Step("A greeting: no tool is needed.",
                                        content="Hello! I can list directories, read files, search the Python "
                                                "sources and run Python code in this workspace. What would you like to know?")],
                    ["Hello"], None)
    if family == "repeat":
        # copying text from the request is most of what the other families need (names into
        # tool arguments, values into answers); random phrases teach it without memorising
        words = [_pick(rng, subj.functions)[0] for _ in range(int(rng.integers(2, 6)))]
        words.insert(int(rng.integers(len(words) + 1)), str(int(rng.integers(10, 100000))))
        phrase = " ".join(words)
        user = _pick(rng, [f"Repeat exactly: {phrase}", f"Say back: {phrase}"])
        return Task(family, user, [Step("The user wants the words back unchanged.", content=phrase)], [phrase], None)
    raise ValueError(f"unknown task family {family!r}")


def messages_for(ws: Workspace, tasks: list[Task], thinking: bool) -> list[dict]:
    """The OpenAI-style conversation of an agent solving ``tasks`` one after the other."""
    msgs: list[dict] = []
    n = 0
    for task in tasks:
        msgs.append({"role": "user", "content": task.user})
        for step in task.steps:
            msg: dict[str, Any] = {"role": "assistant", "content": step.content}
            if thinking:
                msg["reasoning_content"] = step.reasoning
            if step.calls:
                msg["tool_calls"] = []
                for name, args in step.calls:
                    n += 1
                    msg["tool_calls"].append({"id": f"call_{n}", "type": "function",
                                              "function": {"name": name, "arguments": args}})
            msgs.append(msg)
            for call in msg.get("tool_calls", []):
                f = call["function"]
                msgs.append({"role": "tool", "tool_call_id": call["id"], "content": ws.call(f["name"], f["arguments"])})
    return msgs


def conversations(n: int, seed: int, held_out: bool = False, root: Path | None = None, answers: str = "plain"):
    """``n`` (messages, tasks) pairs: one to three tasks each, thinking on for half."""
    root = root or stdlib_dir()
    ws = Workspace(root)
    subj = subjects(root, held_out)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.choice([1, 1, 1, 2, 2, 3]))
        tasks = [make_task(ws, subj, rng, held_out, answers=answers) for _ in range(k)]
        out.append((messages_for(ws, tasks, thinking=bool(rng.integers(2))), tasks))
    return out


def held_out_tasks(n: int = 10, seed: int = 1234, root: Path | None = None, answers: str = "plain") -> list[Task]:
    """The evaluation tasks: held-out subjects, one of each family in turn."""
    root = root or stdlib_dir()
    ws = Workspace(root)
    subj = subjects(root, held_out=True)
    rng = np.random.default_rng(seed)
    families = ["find_def", "module_doc", "list_pkg", "evaluate", "two_exprs", "def_lines", "missing", "find_def",
                "evaluate", "module_doc"]
    return [make_task(ws, subj, rng, True, families[i % len(families)], answers) for i in range(n)]


def _calls(transcript: list[dict]) -> tuple[list[dict], str | None]:
    """The transcript's tool calls, and why one is malformed (a tool we do not have, arguments
    that are not a JSON object), or None."""
    calls = [c for m in transcript if m.get("role") == "assistant" for c in (m.get("tool_calls") or [])]
    names = {t["function"]["name"] for t in TOOLS}
    for c in calls:
        if c["function"]["name"] not in names or not isinstance(parse_arguments(c["function"]["arguments"]), dict):
            return calls, f"malformed tool call {c['function']}"
    return calls, None


def _final(transcript: list[dict]) -> dict:
    return transcript[-1] if transcript and transcript[-1].get("role") == "assistant" else {}


def well_formed(task: Task, transcript: list[dict]) -> tuple[bool, str]:
    """The weaker bar: every tool call names a known tool with a JSON-object argument, the first
    call uses the expected tool (whatever its arguments), and the agent ends with an answer."""
    calls, malformed = _calls(transcript)
    if malformed:
        return False, malformed
    expected = task.first_call[0] if task.first_call else None
    first = calls[0]["function"]["name"] if calls else None
    if first != expected:
        return False, f"first call {first}, expected {expected}"
    final = _final(transcript)
    if final.get("tool_calls") or not (final.get("content") or "").strip():
        return False, "no final answer"
    return True, "well-formed"


def first_call_right(task: Task, transcript: list[dict]) -> bool:
    """The first tool call is the task's own (tool and argument), or there is none where none is needed."""
    calls, _ = _calls(transcript)
    if task.first_call is None:
        return not calls
    if not calls:
        return False
    tool, arg, value = task.first_call
    arguments = parse_arguments(calls[0]["function"]["arguments"])
    return calls[0]["function"]["name"] == tool and isinstance(arguments, dict) and arguments.get(arg) == value


def score(task: Task, transcript: list[dict]) -> tuple[bool, str]:
    """Did an agent's transcript (OpenAI messages after the user's) solve ``task``?

    Solved: every tool call names a known tool with a JSON-object argument, the first call is
    the expected one (tool, argument), and the final answer contains every fact.
    """
    calls, malformed = _calls(transcript)
    if malformed:
        return False, malformed
    if task.first_call is None:
        if calls:
            return False, "called a tool where none was needed"
    else:
        if not calls:
            return False, "no tool call"
        tool, arg, value = task.first_call
        first = calls[0]["function"]
        got = parse_arguments(first["arguments"]).get(arg)
        if first["name"] != tool or got != value:
            return False, f"first call {first['name']}({arg}={got!r}), expected {tool}({arg}={value!r})"
    final = _final(transcript)
    answer = final.get("content") or ""
    missing = [f for f in task.facts if f not in answer]
    if final.get("tool_calls") or missing:
        return False, f"answer {answer[:80]!r} lacks {missing}"
    return True, "solved"
