"""The agent pair's tasks (tests/helpers/agent_tasks.py): the quoted answers keep the tasks and
their facts and take every fact verbatim from a tool result; the answer style changes the answers
and nothing else; a first call is right only with the task's own tool and argument."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import agent_tasks
from helpers.stdlib_corpus import stdlib_dir

FAMILIES_WITH_TOOLS = ("find_def", "module_doc", "list_pkg", "evaluate", "two_exprs", "def_lines")


@pytest.fixture(scope="module")
def workspace():
    return agent_tasks.Workspace(stdlib_dir())


@pytest.mark.parametrize("held_out", [False, True], ids=["training", "held-out"])
def test_quoted_answers_take_every_fact_verbatim_from_a_tool_result(workspace, held_out):
    subj = agent_tasks.subjects(workspace.root, held_out)
    for family in FAMILIES_WITH_TOOLS:
        for seed in range(8):
            task = agent_tasks.make_task(workspace, subj, np.random.default_rng(seed), held_out, family, "quoted")
            results = [m["content"] for m in agent_tasks.messages_for(workspace, [task], thinking=False)
                       if m["role"] == "tool"]
            answer = task.steps[-1].content
            for fact in task.facts:
                assert fact in answer, (family, fact, answer)
                assert any(fact in r for r in results), (family, fact, results)


def test_the_answer_style_changes_the_answers_and_nothing_else():
    plain, quoted = agent_tasks.held_out_tasks(10), agent_tasks.held_out_tasks(10, answers="quoted")
    assert [(t.family, t.user, t.facts, t.first_call, [s.calls for s in t.steps]) for t in plain] == \
        [(t.family, t.user, t.facts, t.first_call, [s.calls for s in t.steps]) for t in quoted]
    changed = [p.family for p, q in zip(plain, quoted) if p.steps[-1].content != q.steps[-1].content]
    assert set(changed) == set(FAMILIES_WITH_TOOLS)
    with pytest.raises(ValueError, match="answer style 'fancy'"):
        agent_tasks.held_out_tasks(1, answers="fancy")


def test_first_call_right_wants_the_tasks_own_tool_and_argument():
    task = next(t for t in agent_tasks.held_out_tasks(10) if t.family == "evaluate")
    tool, arg, value = task.first_call

    def said(name, arguments):
        return [{"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}]}]

    assert agent_tasks.first_call_right(task, said(tool, {arg: value}))
    assert not agent_tasks.first_call_right(task, said(tool, {arg: value + " "}))
    assert not agent_tasks.first_call_right(task, said("grep", {arg: value}))
    assert not agent_tasks.first_call_right(task, said(tool, "[1, 2]"))  # JSON, not an object
    assert not agent_tasks.first_call_right(task, [{"role": "assistant", "content": "no call"}])
    hello = agent_tasks.make_task(agent_tasks.Workspace(stdlib_dir()), None, np.random.default_rng(0),
                                  True, "hello")
    assert agent_tasks.first_call_right(hello, [{"role": "assistant", "content": "Hello!"}])
