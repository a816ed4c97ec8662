"""Score a trained agent target on the held-out tasks, as an agent uses it: ``laguna-run serve``
on the target GGUF alone (greedy decoding is the target's, with or without a drafter), and
``examples/agent.py``'s loop through the official ``openai`` client, the tools run for real,
thinking off and on. Used by ``train_agent_pair.py --evaluate`` to put the result in the card."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import agent_tasks as at

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))


def evaluate(gguf: Path, log=print, server_timeout: float = 300.0) -> dict:
    """{"thinking off": {...}, "thinking on": {...}}: solved, well-formed and first calls right of
    the 10 held-out tasks, and each task's verdict."""
    import openai
    from agent import run_task

    from .demo_pair import stdlib_dir

    with tempfile.TemporaryFile("w+") as err:
        server = subprocess.Popen([sys.executable, "-m", "laguna_dflash.runtime.cli", "serve", "--model", str(gguf),
                                   "--host", "127.0.0.1", "--port", "0"], stdout=err, stderr=err, text=True)
        try:
            url, deadline = None, time.monotonic() + server_timeout
            while url is None:
                if server.poll() is not None or time.monotonic() > deadline:
                    err.seek(0)
                    raise RuntimeError(f"laguna-run serve --model {gguf} did not start: {err.read()[-2000:]}")
                time.sleep(0.5)
                err.seek(0)
                found = re.search(r"listening on (http:\S+)", err.read())
                url = found and found.group(1)
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=3, timeout=600)
            model = client.models.list().data[0].id
            workspace = at.Workspace(stdlib_dir())
            result = {}
            for thinking in (False, True):
                verdicts = []
                for task in at.held_out_tasks(10):
                    transcript = run_task(client, task.user, workspace, model=model, thinking=thinking).transcript
                    solved, why = at.score(task, transcript)
                    verdicts.append({"family": task.family, "solved": solved, "why": why,
                                     "well_formed": at.well_formed(task, transcript)[0],
                                     "first_call_right": at.first_call_right(task, transcript)})
                    log(f"held out, thinking {'on' if thinking else 'off'}: {task.family}: {why}")
                result[f"thinking {'on' if thinking else 'off'}"] = {
                    key: sum(v[key] for v in verdicts) for key in ("solved", "well_formed", "first_call_right")
                } | {"tasks": verdicts}
            return result
        finally:
            server.terminate()
            server.wait(30)
