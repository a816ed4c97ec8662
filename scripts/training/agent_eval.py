"""Score a trained agent target on the held-out tasks, as an agent uses it: ``laguna-run serve``
on the target GGUF alone (greedy decoding is the target's, with or without a drafter), and
``examples/agent.py``'s loop through the official ``openai`` client, the tools run for real,
thinking off and on. Used by ``train_agent_pair.py --evaluate`` to put the result in the card."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import agent_tasks as at


def evaluate(gguf: Path, log=print, n: int = 10, seed: int = 1234) -> dict:
    """{"thinking off": {...}, "thinking on": {...}}: solved, well-formed and first calls right of
    the held-out tasks (``agent_tasks.held_out_tasks(n, seed)``; the defaults are the 10 every run
    is scored on), and each task's verdict."""
    import openai
    from examples.agent import run_task
    from scripts.bench.bench_server import ServeProcess, stop

    from tests.helpers.stdlib_corpus import stdlib_dir

    server = ServeProcess("--model", str(gguf), "--host", "127.0.0.1")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=3, timeout=600)
        model = client.models.list().data[0].id
        workspace = at.Workspace(stdlib_dir())
        result = {}
        for thinking in (False, True):
            verdicts = []
            for task in at.held_out_tasks(n, seed):
                transcript = run_task(client, task.user, workspace, model=model, thinking=thinking).transcript
                solved, why = at.score(task, transcript)
                verdicts.append({"family": task.family, "user": task.user, "solved": solved, "why": why,
                                 "well_formed": at.well_formed(task, transcript)[0],
                                 "first_call_right": at.first_call_right(task, transcript)})
                log(f"held out, thinking {'on' if thinking else 'off'}: {task.family}: {why}")
            result[f"thinking {'on' if thinking else 'off'}"] = {
                key: sum(v[key] for v in verdicts) for key in ("solved", "well_formed", "first_call_right")
            } | {"tasks": verdicts}
        return result
    finally:
        stop(server.proc)
