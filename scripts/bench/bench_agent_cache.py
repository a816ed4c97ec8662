"""How much of an agent loop's prompt the prompt cache holds, turn by turn.

    python -m scripts.bench.bench_agent_cache --json docs/results/server/agent-cache.json

An OpenAI-style agent loop re-sends the whole conversation each turn: the server renders it
again with the chat template, so turn k's prompt is turn k-1's prompt, its reply as the
template writes it back, and the tool's result. Whatever of that the engine's prompt cache
still holds is not prefilled again. This script plays a four-turn coding-agent conversation
(read a file, write it back fixed, run the tests, answer) through exactly what a server slot
runs (runtime.conversation.ChatTurn: render, read the reply; an Engine with its prompt cache),
with Laguna 2.1's template (tests/fixtures) on the bundled pair, at depth 4, and prints per
turn: prompt tokens, cached tokens, tokens prefilled, and the most the cache could hold (the
previous prompt plus the previous reply's tokens).

The replies are scripted (tests/helpers/scripted_model.py: the bundled target does not write tool
calls); the engine, drafter and cache run as always. Token counts do not depend on timing, so
one run is the measurement. Three client behaviours:

- ``thinking, reasoning resent``: enable_thinking, the client sends ``reasoning_content`` back;
- ``thinking, reasoning dropped``: enable_thinking, the client drops it (past turns render as
  ``<think></think>``, so the cache breaks at the previous reply's reasoning);
- ``no thinking``: enable_thinking false.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scripts.recorded import command_line, write_json
from tests.helpers.scripted_model import scripted

ROOT = Path(__file__).resolve().parents[2]

TEMPLATE = ROOT / "tests" / "fixtures" / "laguna-2.1-chat-template.jinja"

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {"name": "write_file", "description": "Write a file.", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"]}}},
    {"type": "function", "function": {"name": "run_tests", "description": "Run the test suite.",
                                      "parameters": {"type": "object", "properties": {}}}},
]
BUGGY = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
FIXED = BUGGY.replace("a - b", "a + b")


def call(name: str, **args: str) -> str:
    return f"<tool_call>{name}" + "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>"
                                          for k, v in args.items()) + "</tool_call>"


#: (reasoning, the reply after it, the tool's answer to it or None at the end)
TURNS = [
    ("The user reports a bug in calc.py; read it first.", call("read_file", path="calc.py"), BUGGY),
    ("add subtracts: fix it.", call("write_file", path="calc.py", content=FIXED), "wrote 62 bytes"),
    ("Check the fix with the tests.", call("run_tests"), "3 passed in 0.02s"),
    ("All green.", "Fixed `add` in calc.py (it subtracted); the 3 tests pass.", None),
]
MODES = {"thinking, reasoning resent": (True, True), "thinking, reasoning dropped": (True, False),
         "no thinking": (False, True)}


def play(engine, template, thinking: bool, resend_reasoning: bool) -> list[dict]:
    from laguna_dflash.runtime.conversation import ChatTurn, end_of_turn_tokens
    from laguna_dflash.runtime.engine import GenerateOptions

    target = engine.target
    bos = target.special_text("bos")
    messages = [{"role": "system", "content": "You are a coding agent. Use the tools."},
                {"role": "user", "content": "The tests of calc.py fail. Fix it."}]
    options = GenerateOptions(n_predict=256, n_max=4, end_tokens=end_of_turn_tokens(target), special_text=True)
    rows, ideal = [], None
    engine.reset()
    with scripted(target) as script:
        for reasoning, reply, result in TURNS:
            script.say((reasoning + "</think>" if thinking else "") + reply)
            turn = ChatTurn.render(template, messages, tools=TOOLS, template_kwargs={"enable_thinking": thinking},
                                   bos_token=bos)
            prompt = target.tokenize(turn.prompt, add_special=not turn.prompt.startswith(bos), parse_special=True)
            out = engine.generate(prompt, options)
            message = turn.message(out.text)
            stats = out.stats
            rows.append({"prompt_tokens": stats.n_prompt, "cached_tokens": stats.n_cached,
                         "prefilled_tokens": stats.n_prompt - stats.n_cached, "reply_tokens": len(out.tokens),
                         "most_cacheable": ideal, "finish": out.stop_reason, "drafted": stats.drafted})
            ideal = stats.n_prompt + len(out.tokens)
            back = {"role": "assistant", "content": message["content"] or ""}
            if message["tool_calls"]:
                back["tool_calls"] = message["tool_calls"]
            if resend_reasoning and message["reasoning_content"]:
                back["reasoning_content"] = message["reasoning_content"]
            messages.append(back)
            if result is not None:
                messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": result})
    return rows


def main() -> int:
    from laguna_dflash.runtime.drafter_cache import native_drafter_path
    from laguna_dflash.runtime import assets
    from laguna_dflash.runtime.chat_template import ChatTemplate
    from laguna_dflash.runtime.engine import Engine, EngineConfig
    from laguna_dflash.runtime.llama import Model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the table here")
    args = ap.parse_args()
    template = ChatTemplate(TEMPLATE.read_text(encoding="utf-8"), TEMPLATE.name)
    results = {}
    with Model(assets.TINY_TARGET) as target:
        drafter = native_drafter_path(assets.converted_tiny_drafter(), target.path)
        with Engine(target, drafter, EngineConfig(n_ctx=4096, n_threads=1)) as engine:
            for mode, (thinking, resend) in MODES.items():
                results[mode] = play(engine, template, thinking, resend)
    for mode, rows in results.items():
        print(f"\n{mode}\n\n| turn | prompt | cached | prefilled | most cacheable | reply |\n|---|---|---|---|---|---|")
        for i, r in enumerate(rows, 1):
            print(f"| {i} | {r['prompt_tokens']} | {r['cached_tokens']} | {r['prefilled_tokens']} | "
                  f"{r['most_cacheable'] or '-'} | {r['reply_tokens']} |")
    if args.json:
        write_json(args.json, {"command": command_line(__file__), "turns": results}, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
