"""Agents against laguna-run serve on the bundled agent pair (laguna-tiny-agent, Laguna 2.1's
template in its GGUF), on 127.0.0.1, greedy, speculation on, F32 cache: the example agent
(``examples/agent.py``, the official ``openai`` client) solves the held-out tasks of
``tests/helpers/agent_tasks.py`` with its tools run for real; its whole transcript (reasoning,
tool calls, tool results, answers) is the same at ``n_max`` 0 and 4, streamed and not; and an
agent framework nobody here wrote (pydantic-ai, its own tool definitions and loop) solves them
too. One test scripts the target's replies (``tests/helpers/scripted_model.py``) so that the loop's
plumbing is checked whatever the trained pair writes."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from agent import numbered_ids, run_task  # noqa: E402  (examples/, on pytest's pythonpath)
from agent_tools import TOOLS, Workspace  # noqa: E402
from helpers.agent_tasks import held_out_tasks, score, well_formed  # noqa: E402
from helpers.scripted_model import scripted  # noqa: E402
from helpers.stdlib_corpus import stdlib_dir  # noqa: E402
from server_harness import LiveServer, make_pool, openai_client  # noqa: E402

MODEL = "laguna-tiny-agent"
MAX_TOKENS = 256
#: the held-out tasks the exactness test runs: two calls in one turn, two steps, a tool error
LOOP_TASKS = ("two_exprs", "def_lines", "missing")


@pytest.fixture(scope="module")
def srv(agent_pair):
    target, path, drafter = agent_pair
    # chat_template None: the GGUF's own tokenizer.chat_template
    with LiveServer(make_pool(target, path, drafter, n_ctx=4096), model_id=MODEL, chat_template=None,
                    chat_template_source=None) as s:
        yield s


@pytest.fixture(scope="module")
def tasks():
    return held_out_tasks(10)


@pytest.fixture(scope="module")
def workspace():
    return Workspace(stdlib_dir())


def client(s) -> "openai.OpenAI":
    return openai_client(s, timeout=600)  # an agent run is many turns


def laguna_reply(step, thinking: bool) -> str:
    """What Laguna writes for one step of a task after the generation prompt: reasoning up to
    ``</think>`` (thinking on), the content, then each call in 2.1's markup."""
    calls = "".join(
        f"<tool_call>{name}" + "".join(f"<arg_key>{k}</arg_key><arg_value>{v if isinstance(v, str) else json.dumps(v)}"
                                       f"</arg_value>" for k, v in args.items()) + "</tool_call>"
        for name, args in step.calls)
    return (f"{step.reasoning}</think>" if thinking else "") + step.content + calls


@pytest.mark.parametrize("thinking", [False, True], ids=["thinking-off", "thinking-on"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_loop_runs_each_call_in_the_workspace_and_sends_the_results_back(srv, agent_pair, tasks, workspace,
                                                                           thinking, stream):
    # two calls in one turn; a call that needs the last result
    for task in (next(t for t in tasks if t.family == f) for f in ("two_exprs", "def_lines")):
        with scripted(agent_pair[0]) as script:
            script.say(*(laguna_reply(step, thinking) for step in task.steps))
            run = run_task(client(srv), task.user, workspace, model=MODEL, n_max=4, thinking=thinking,
                           stream=stream, max_tokens=MAX_TOKENS)
        assert score(task, run.transcript) == (True, "solved")
        assert len(run.turns) == len(task.steps)
        for turn, step in zip(run.turns, task.steps):
            made = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                    for c in turn.message.get("tool_calls", [])]
            assert made == step.calls
            # each call answered by its own id, with what the tool returns
            assert [(r["tool_call_id"], r["content"]) for r in turn.results] == [
                (c["id"], workspace.call(name, args)) for c, (name, args) in zip(turn.message.get("tool_calls", []), made)]
            assert turn.message.get("reasoning_content") == (step.reasoning if thinking else None)
        assert run.answer == task.steps[-1].content
        assert [t.finish_reason for t in run.turns] == ["tool_calls"] * (len(run.turns) - 1) + ["stop"]
        # the server saw the transcript: each turn's prompt is the conversation up to it, results included
        history = [{"role": "user", "content": task.user}]
        for turn in run.turns:
            prompt = httpx.post(srv.url + "/apply-template", timeout=60, json={
                "messages": history, "tools": TOOLS, "chat_template_kwargs": {"enable_thinking": thinking}}).json()
            n_prompt = len(agent_pair[0].tokenize(prompt["prompt"], add_special=False, parse_special=True))
            assert turn.timings["cache_n"] + turn.timings["prompt_n"] == n_prompt
            history += [turn.message, *turn.results]
        assert sum(t.timings["draft_n"] for t in run.turns) > 0


def judged(tasks, transcripts) -> tuple[int, int, str]:
    """(solved count, well-formed count, what went wrong): solved is agent_tasks.score (the
    request's names and numbers in the calls, the tool results' facts in the answer), well-formed
    is agent_tasks.well_formed (the right tool, calls that parse, an answer)."""
    formed = [(t.family, *well_formed(t, tr)) for t, tr in zip(tasks, transcripts)]
    solved = [(t.family, *score(t, tr)) for t, tr in zip(tasks, transcripts)]
    why = "; ".join(f"{f}: {w}" for f, ok, w in solved if not ok)
    return sum(o[1] for o in solved), sum(o[1] for o in formed), why


@pytest.mark.parametrize("thinking", [False, True], ids=["thinking-off", "thinking-on"])
def test_the_agent_solves_8_of_10_held_out_tasks_with_well_formed_calls(srv, tasks, workspace, thinking):
    c = client(srv)
    transcripts = []
    for task in tasks:
        run = run_task(c, task.user, workspace, model=MODEL, n_max=4, thinking=thinking, max_tokens=MAX_TOKENS)
        transcripts.append(run.transcript)
        assert sum(t.timings["draft_n"] for t in run.turns) > 0  # speculation was on
    solved, formed, why = judged(tasks, transcripts)
    assert solved >= 8 and formed >= 8, f"solved {solved}/10, well-formed {formed}/10: {why}"


def test_the_whole_transcript_is_the_same_at_n_max_0_and_4_streamed_and_not(srv, tasks, workspace):
    c = client(srv)
    runs = {}
    for task in (next(t for t in tasks if t.family == f) for f in LOOP_TASKS):
        reference = run_task(c, task.user, workspace, model=MODEL, n_max=0, thinking=True, max_tokens=MAX_TOKENS)
        for n_max, stream in ((4, False), (4, True), (0, True)):
            run = run_task(c, task.user, workspace, model=MODEL, n_max=n_max, thinking=True, stream=stream,
                           max_tokens=MAX_TOKENS)
            assert numbered_ids(run.transcript) == numbered_ids(reference.transcript), (task.family, n_max, stream)
            drafted = sum(t.timings["draft_n"] for t in run.turns)
            assert drafted > 0 if n_max else drafted == 0
        runs[task.family] = reference
    # the loop was exercised: replies with reasoning, with tool calls, and more than one turn
    messages = [m for r in runs.values() for m in r.transcript if m["role"] == "assistant"]
    assert any(m.get("reasoning_content") for m in messages)
    assert any(m.get("tool_calls") for m in messages)
    assert any(len(r.turns) > 1 for r in runs.values())


def test_once_a_call_opens_only_a_declared_tool_and_valid_arguments_may_follow(agent_pair):
    from laguna_dflash.runtime.constraint import compile_constraint, declared_calls_constraint

    target = agent_pair[0]
    declared = [t for t in TOOLS if t["function"]["name"] in ("read_file", "list_dir")]
    matcher = compile_constraint(declared_calls_constraint(declared), target).matcher()

    def admitted(text: str) -> str:
        tokens = target.tokenize(text, add_special=False, parse_special=True)
        n = matcher.admissible(tokens)
        return b"".join(target.token_bytes(t, special=True) for t in tokens[:n]).decode("utf-8", "replace")

    free = "Let me look at the file first, <b>then</b> answer. "
    good = "<tool_call>read_file<arg_key>path</arg_key><arg_value>textwrap.py</arg_value></tool_call>"
    assert admitted(free + good) == free + good  # text is free; a declared call passes whole
    assert admitted(free + "<tool_call>grep<arg_key>") .startswith(free + "<tool_call>")
    assert "grep" not in admitted(free + "<tool_call>grep<arg_key>")
    bad_args = "<tool_call>read_file<arg_key>size</arg_key>"
    assert admitted(bad_args) != bad_args  # a parameter the schema does not have
    matcher.consume(target.tokenize(free + good, add_special=False, parse_special=True))
    assert matcher.accepting  # the turn may end after a call
    # thinking on: the reasoning runs free and may end the turn, as unconstrained; after </think>
    # the same rule
    thinking = compile_constraint(declared_calls_constraint(declared, after_reasoning=True), target).matcher()
    assert thinking.try_consume(target.tokenize("I should look.", add_special=False)) and thinking.accepting
    cut = target.tokenize("</think>OK<tool_call>grep", add_special=False, parse_special=True)
    assert thinking.admissible(cut) == len(cut) - 1


def test_calls_name_only_declared_tools_with_valid_arguments_exactly_under_speculation(srv, tasks):
    # the pair was trained on four tools; offered two, it is held to them once it opens a call
    jsonschema = pytest.importorskip("jsonschema")
    declared = [t for t in TOOLS if t["function"]["name"] in ("read_file", "list_dir")]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in declared}
    c = client(srv)
    n_calls = 0
    for task in tasks:
        replies = {}
        for n_max in (0, 4):
            r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": task.user}], tools=declared,
                                          temperature=0, max_tokens=MAX_TOKENS, extra_body={"n_max": n_max})
            replies[n_max] = r.choices[0].message
            for call in r.choices[0].message.tool_calls or ():
                assert call.function.name in schemas, (task.family, call.function.name)
                jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
                n_calls += 1
        assert replies[0].model_dump() == {**replies[4].model_dump(), "tool_calls": replies[0].model_dump()["tool_calls"]}
        assert [(t.function.name, t.function.arguments) for t in replies[0].tool_calls or ()] == \
            [(t.function.name, t.function.arguments) for t in replies[4].tool_calls or ()]
    assert n_calls > 0


# ---------------------------------------------------------------------------------------- the other APIs


def said(transcript: list[dict]) -> list[tuple]:
    """What each turn said and did, whatever the API: (content, reasoning, calls) per reply and
    each tool result."""
    out = []
    for m in transcript:
        if m["role"] == "assistant":
            out.append(((m.get("content") or "").strip(), m.get("reasoning_content") or "",
                        [(c["function"]["name"], parse(c["function"]["arguments"])) for c in m.get("tool_calls") or ()]))
        else:
            out.append(m["content"])
    return out


def parse(arguments):
    return json.loads(arguments) if isinstance(arguments, str) else arguments


def messages_run(s, task, workspace, *, thinking: bool, stream: bool) -> list[dict]:
    """One task through the official anthropic client: tool_use blocks run, tool_result blocks
    sent back, until a reply calls nothing; the transcript in OpenAI's shapes."""
    anthropic = pytest.importorskip("anthropic")
    c = anthropic.Anthropic(base_url=s.url, api_key="unused", max_retries=0, timeout=600)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    messages, transcript = [{"role": "user", "content": task.user}], []
    for _ in range(6):
        kw = dict(model=MODEL, max_tokens=MAX_TOKENS, messages=messages, tools=tools,
                  thinking={"type": "enabled", "budget_tokens": 1024} if thinking else {"type": "disabled"})
        if stream:
            with c.messages.stream(**kw) as events:
                reply = events.get_final_message()
        else:
            reply = c.messages.create(**kw)
        uses = [b for b in reply.content if b.type == "tool_use"]
        transcript.append({"role": "assistant", "content": "".join(b.text for b in reply.content if b.type == "text"),
                           "reasoning_content": "".join(b.thinking for b in reply.content if b.type == "thinking"),
                           "tool_calls": [{"id": u.id, "function": {"name": u.name, "arguments": u.input}}
                                          for u in uses]})
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        if not uses:
            assert reply.stop_reason in ("end_turn", "max_tokens")
            break
        assert reply.stop_reason == "tool_use"
        results = [{"type": "tool_result", "tool_use_id": u.id, "content": workspace.call(u.name, u.input)}
                   for u in uses]
        transcript += [{"role": "tool", "content": r["content"]} for r in results]
        messages.append({"role": "user", "content": results})
    return transcript


def responses_run(s, task, workspace, *, thinking: bool, stream: bool) -> list[dict]:
    """One task through the openai client's Responses API: function_call items run,
    function_call_output items sent back."""
    c = client(s)
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    items, transcript = [{"role": "user", "content": task.user}], []
    for _ in range(6):
        kw = dict(model=MODEL, input=items, tools=tools, max_output_tokens=MAX_TOKENS, temperature=0,
                  reasoning={"effort": "medium" if thinking else "none"})
        if stream:
            with c.responses.stream(**kw) as events:
                reply = events.get_final_response()
        else:
            reply = c.responses.create(**kw)
        calls = [i for i in reply.output if i.type == "function_call"]
        transcript.append({"role": "assistant", "content": reply.output_text,
                           "reasoning_content": "".join(p.text for i in reply.output if i.type == "reasoning"
                                                        for p in i.content or ()),
                           "tool_calls": [{"id": f.call_id, "function": {"name": f.name, "arguments": f.arguments}}
                                          for f in calls]})
        items += [i.model_dump(exclude_none=True) for i in reply.output]
        if not calls:
            break
        outputs = [{"type": "function_call_output", "call_id": f.call_id,
                    "output": workspace.call(f.name, json.loads(f.arguments))} for f in calls]
        transcript += [{"role": "tool", "content": o["output"]} for o in outputs]
        items += outputs
    return transcript


@pytest.mark.parametrize("thinking", [False, True], ids=["thinking-off", "thinking-on"])
def test_anthropic_and_responses_clients_run_the_same_agent_turns(srv, tasks, workspace, thinking):
    # the same prompt whatever the API, so the same greedy replies: calls, their results, answers
    c = client(srv)
    for task in (next(t for t in tasks if t.family == f) for f in LOOP_TASKS):
        reference = said(run_task(c, task.user, workspace, model=MODEL, n_max=4, thinking=thinking,
                                  max_tokens=MAX_TOKENS).transcript)
        assert any(isinstance(m, tuple) and m[2] for m in reference)  # a call, its result, an answer
        for stream in (False, True):
            assert said(messages_run(srv, task, workspace, thinking=thinking, stream=stream)) == reference, \
                (task.family, "messages", stream)
            assert said(responses_run(srv, task, workspace, thinking=thinking, stream=stream)) == reference, \
                (task.family, "responses", stream)


# ---------------------------------------------------------------------------------------- pydantic-ai


def test_pydantic_ai_runs_held_out_tasks_with_its_own_tools_and_loop(srv, tasks, workspace):
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent, Tool
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    def tool(spec: dict) -> Tool:
        name = spec["function"]["name"]
        return Tool.from_schema(lambda **arguments: workspace.call(name, arguments), name=name,
                                description=spec["function"]["description"],
                                json_schema=spec["function"]["parameters"])

    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=srv.url + "/v1", api_key="unused"))
    agent = Agent(model, tools=[tool(t) for t in TOOLS],
                  model_settings={"temperature": 0, "max_tokens": MAX_TOKENS, "extra_body": {"n_max": 4}})
    transcripts = []
    for task in tasks:
        result = agent.run_sync(task.user)
        # the framework's messages in OpenAI's shapes, for the same score as the example agent's
        transcript = []
        for message in result.all_messages()[1:]:
            if isinstance(message, ModelResponse):
                calls = [{"id": p.tool_call_id, "type": "function",
                          "function": {"name": p.tool_name, "arguments": p.args_as_json_str()}}
                         for p in message.parts if isinstance(p, ToolCallPart)]
                text = "".join(p.content for p in message.parts if isinstance(p, TextPart))
                transcript.append({"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})})
            else:
                transcript += [{"role": "tool", "tool_call_id": p.tool_call_id, "content": p.model_response_str()}
                               for p in message.parts if isinstance(p, ToolReturnPart)]
        assert result.output == transcript[-1]["content"]
        transcripts.append(transcript)
    solved, formed, why = judged(tasks, transcripts)
    assert solved >= 8 and formed >= 8, f"solved {solved}/10, well-formed {formed}/10: {why}"


# ---------------------------------------------------------------------------------------- the command line


def test_the_command_line_shows_each_step_acceptance_and_speedup(srv, agent_pair, tasks, capsys):
    from agent import main

    task = next(t for t in tasks if t.family == "evaluate")
    with scripted(agent_pair[0]) as script:
        # the speculative run, then the plain one: the same two replies each
        script.say(*(laguna_reply(step, False) for step in task.steps * 2))
        assert main(["--base-url", srv.url + "/v1", "--n-max", "4", task.user]) == 0
    out = capsys.readouterr().out
    expression = task.steps[0].calls[0][1]["code"]
    assert f"-> run_python(code={expression!r})" in out and f"<- {task.facts[0]}" in out
    assert f"answer: {task.steps[-1].content}" in out
    assert out.count("accepted/round") == 2 and out.count("tok/s plain: ") == 2
    assert "decode: " in out and "tok/s speculative vs " in out


@pytest.mark.parametrize("argv, words", [
    ([], "give a task, or --held-out"),
    (["--held-out", "question"], "give a task, or --held-out"),
    (["--workspace", "/no/such/dir", "question"], "--workspace: expected a directory"),
    (["--held-out", "--workspace", "."], "--workspace: the held-out tasks are about the standard library"),
    (["--n-max", "0", "question"], "--n-max: expected a draft depth >= 1"),
    (["--max-steps", "0", "question"], "--max-steps: expected at least 1"),
    (["--base-url", "http://127.0.0.1:9/v1", "question"], "--base-url: no OpenAI API answers at"),
])
def test_the_command_line_refuses_a_mistake_in_one_line(argv, words, capsys):
    from agent import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("agent.py: " + words) and err.count("\n") == 1


def test_the_command_line_says_what_the_server_refused_in_one_line(srv, capsys):
    from agent import main

    assert main(["--base-url", srv.url + "/v1", "--n-max", "99", "question"]) == 2  # beyond the drafter's block
    err = capsys.readouterr().err
    assert err.startswith(f"agent.py: the server at {srv.url}/v1 answered 400: ") and err.count("\n") == 1
