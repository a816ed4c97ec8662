"""The Lark grammar of Laguna's tool calls over a request's tools: forced (``required``, a
named function) or held to the tools once opened (``auto``)."""

from __future__ import annotations

from collections.abc import Sequence

from ..chat import END_OF_TURN, END_THINK, THINK
from .lark import inline_json, lark_literal, special_token, closed_objects
from .spec import ConstraintError


def tool_call_grammar(tools: Sequence[dict], choice: str | dict, tok, field_name: str = "tools",
                      parallel: bool = True) -> str:
    """The Lark grammar of Laguna tool calls (reference: laguna-chat-tools-reasoning §3.1, the
    2.1 family's tight form): ``<tool_call>`` and ``</tool_call>`` as their special tokens when
    the vocabulary has them, as text otherwise; arguments in the schema's order, required ones
    present, optional ones optional; a string-typed value raw up to ``</arg_value>``, any other
    value JSON valid under its schema."""
    if not isinstance(tools, (list, tuple)) or not tools:
        raise ConstraintError(field_name, "a non-empty list of tools", tools)
    functions: dict[str, dict] = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name.strip() or any(ch in name for ch in "<>\n"):
            raise ConstraintError(f"{field_name}[{i}].function.name", "a name without <, > or newlines", name)
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ConstraintError(f"{field_name}[{i}].function.parameters", "a JSON schema object", params)
        functions[name] = params
    if choice in ("required", "auto"):
        names, repeat = list(functions), ("+" if parallel else "")
    else:
        wanted = choice
        if isinstance(choice, dict):
            wanted = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
        if not isinstance(wanted, str) or wanted not in functions:
            raise ConstraintError("tool_choice", f"'required' or a function among {sorted(functions)}", choice)
        names, repeat = [wanted], ""
    open_tag = special_token(tok, "<tool_call>") or lark_literal("<tool_call>")
    close_tag = special_token(tok, "</tool_call>") or lark_literal("</tool_call>")
    calls = f"({' | '.join(f'call_{i}' for i in range(len(names)))})"
    if choice == "auto":
        # free text (and the markup tokens a reply may hold: Laguna's think tags), then calls or
        # none, then the end of the turn: a call, once its <tool_call> token is written, is
        # held to the tools as a forced one is
        markup = [t for t in (special_token(tok, THINK), special_token(tok, END_THINK)) if t]
        ends = [special_token(tok, text) for text in END_OF_TURN
                if text in tok.special and tok.special[text] not in tok.eog]
        text = "/(?s:.*)/" + (f" (({' | '.join(markup)}) /(?s:.*)/)*" if markup else "")
        start = f"start: {text} {calls}{'*' if parallel else '?'}" + (f" ({' | '.join(ends)})?" if ends else "")
    else:
        start = f"start: {calls}{repeat}"
    rules = [start, 'raw_value[lazy]: /(?s:.*)<\\/arg_value>/']
    for i, name in enumerate(names):
        params = functions[name]
        props = params.get("properties") or {}
        if not isinstance(props, dict):
            raise ConstraintError(f"{field_name}.{name}.parameters.properties", "an object", props)
        required = set(params.get("required") or ())
        parts = []
        for j, (key, sub) in enumerate(props.items()):
            if any(ch in key for ch in "<>"):
                raise ConstraintError(f"{field_name}.{name}.parameters.properties", "keys without < or >", key)
            if not isinstance(sub, dict):
                sub = {}
            if sub.get("type") == "string":
                value = _raw_string_rule(sub, f"raw_{i}_{j}", rules)
            else:
                rules.append(f"value_{i}_{j}: {inline_json(closed_objects(sub), True)}")
                value = f'value_{i}_{j} "</arg_value>"'
            arg = f'"<arg_key>" {lark_literal(key)} "</arg_key><arg_value>" {value}'
            parts.append(f"({arg})" if key in required else f"({arg})?")
        rules.append(f"call_{i}: {open_tag} {lark_literal(name)} {' '.join(parts)} {close_tag}")
    return "\n".join(rules) + "\n"


def _raw_string_rule(schema: dict, name: str, rules: list[str]) -> str:
    """A string-typed argument: its raw text, then ``</arg_value>``. ``enum`` and ``maxLength``
    are enforced (a bound also keeps a model from writing one value forever), and ``minLength``
    beside a ``maxLength``; ``format`` and ``pattern`` are not (they are hints in most tool
    schemas).

    A bounded value is one lazy lexeme that holds its closing tag, as the unbounded
    ``raw_value``: it ends at the first ``</arg_value>`` after at least ``minLength`` characters
    (an earlier one stays in the value), whatever pieces the tokenizer cuts the tag into. A
    value lexeme of its own, without the tag, followed by the tag, took the tag's first pieces
    into the value and refused its ``>``, and the intersection that kept the tag out of it
    outgrew llguidance's lexer limits from about 256 characters (docs/agents.md, "Claude Code's
    400s")."""
    if isinstance(schema.get("enum"), list) and all(isinstance(v, str) for v in schema["enum"]) and schema["enum"]:
        return "(" + " | ".join(lark_literal(v) for v in schema["enum"]) + ') "</arg_value>"'
    lo, hi = schema.get("minLength", 0), schema.get("maxLength")
    if not isinstance(lo, int) or isinstance(lo, bool) or lo < 0:
        lo = 0
    if hi is None or not isinstance(hi, int) or isinstance(hi, bool) or hi < lo:
        return "raw_value"
    rules.append(f"{name}[lazy]: /(?s:.){{{lo},{hi}}}<\\/arg_value>/")
    return name
