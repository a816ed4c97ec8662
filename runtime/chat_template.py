"""Chat templates from a GGUF (``tokenizer.chat_template``), rendered in a sandbox.

A template is code shipped inside a downloaded file: it is rendered in Jinja's immutable
sandbox, which refuses attribute access to internals (``__class__``, ``__globals__``...) and
calls that mutate objects, so a template cannot reach ``os`` or change the caller's data. The
helpers Hugging Face templates rely on are provided (``raise_exception``, ``strftime_now``, a
``tojson`` that leaves non-ASCII and HTML characters alone, ``break``/``continue``, and the
``{% generation %}`` block transformers uses to mark assistant tokens, rendered as its body),
so a template written for ``transformers`` renders the same text here.

What reaches a template is plain JSON data, checked and normalised first (one place for the
OpenAI-to-template rules, :func:`chat_messages`):

- roles ``system``, ``user``, ``assistant``, ``tool`` and ``developer``; a ``developer``
  message is rendered as ``system`` (OpenAI's newer name for the same instructions; a template
  that does not know ``developer``, Laguna's among them, would otherwise drop it silently);
- ``content`` a string or a list of text parts, joined into one string (templates index
  strings; Laguna's renders a list as nothing); an assistant message may have none;
- an assistant's ``tool_calls``: ``function.arguments`` as OpenAI clients send it (a JSON
  text) or as an object, always handed to the template as a mapping (templates iterate
  ``arguments.items()``); ``reasoning_content`` / ``reasoning`` passed through as text;
- ``tools`` (OpenAI tool objects) and ``chat_template_kwargs`` (``enable_thinking``,
  ``preserve_thinking`` or anything else the template reads), which may not rename what the
  renderer itself supplies (:data:`RESERVED`).

Every failure (a malformed message, syntax, a refused operation, the template's own
``raise_exception``, any other render error) is a one-line :class:`convert.errors.UserError`
naming the field, or the file and the key.

    template = ChatTemplate(open_gguf_template_text, source="model.gguf")
    prompt = template.render([{"role": "user", "content": "hi"}], bos_token="<s>",
                             template_kwargs={"enable_thinking": True})
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from ..convert.errors import UserError
from ..convert.gguf import keys as K

TEMPLATE_KEY = K.CHAT_TEMPLATE
ROLES = ("system", "user", "assistant", "tool", "developer")
#: names the renderer supplies itself: chat_template_kwargs may not replace them
RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


class TemplateRaised(Exception):
    """What a template's ``raise_exception(msg)`` raises: it refuses the conversation."""


def _raise_exception(message: Any = "") -> None:
    raise TemplateRaised(str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(str(fmt))


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Sequence[str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML and writes non-ASCII as \u escapes;
    # Hugging Face templates expect plain JSON text, as json.dumps writes it.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=tuple(separators) if separators is not None else None,
                      sort_keys=sort_keys)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _generation_extension():
    from jinja2.ext import Extension

    class GenerationBlock(Extension):
        """``{% generation %}...{% endgeneration %}``: transformers records which characters the
        body wrote (the assistant mask for training); rendering is the body, unchanged."""

        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    return GenerationBlock


def _environment():
    from jinja2.ext import loopcontrols

    from .template_limits import BoundedSandbox

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _generation_extension()])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


# ---------------------------------------------------------------------- what a template is given


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _json_data(value: Any, where: str, depth: int = 0) -> Any:
    """A copy of ``value`` made of JSON types only: a template never sees a caller's objects."""
    if depth > 64:
        raise UserError(f"{where}: expected JSON data nested at most 64 deep, found deeper")
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise UserError(f"{where}: expected string keys, found {_type_name(k)} {k!r}")
            out[k] = _json_data(v, f"{where}.{k}", depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [_json_data(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    raise UserError(f"{where}: expected JSON data, found {_type_name(value)}")


def _text(content: Any, where: str) -> str:
    """A message's content as one string; OpenAI's list of text parts is joined as written."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
        pieces = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                found = part.get("type") if isinstance(part, Mapping) else _type_name(part)
                raise UserError(f"{where}[{j}]: expected a text part {{\"type\": \"text\", \"text\": ...}} "
                                f"(this model reads text only), found {found!r}")
            pieces.append(part["text"])
        return "".join(pieces)
    raise UserError(f"{where}: expected a string or a list of text parts, found {_type_name(content)}")


def _arguments(arguments: Any, where: str) -> dict[str, Any]:
    if arguments is None:
        return {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            raise UserError(f"{where}: expected a JSON object (as text or as an object), found text that is not "
                            f"JSON: {_one_line(arguments)[:60]!r}") from None
    if not isinstance(arguments, Mapping):
        raise UserError(f"{where}: expected a JSON object (as text or as an object), found {_type_name(arguments)}")
    return _json_data(arguments, where)


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, Sequence) or isinstance(calls, (str, bytes)):
        raise UserError(f"{where}: expected a list of tool calls, found {_type_name(calls)}")
    out = []
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
            raise UserError(f"{at}: expected {{\"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}, "
                            f"found {_type_name(call) if not isinstance(call, Mapping) else 'no function object'}")
        if call.get("type", "function") != "function":
            raise UserError(f"{at}.type: expected 'function', found {call.get('type')!r}")
        function = call["function"]
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise UserError(f"{at}.function.name: expected a function name, found {function.get('name')!r}")
        copy = _json_data({k: v for k, v in call.items() if k != "function"}, at)
        copy["type"] = "function"
        copy["function"] = {**_json_data({k: v for k, v in function.items() if k != "arguments"}, f"{at}.function"),
                            "arguments": _arguments(function.get("arguments"), f"{at}.function.arguments")}
        out.append(copy)
    return out


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """The messages a template is given: JSON copies, normalised as the module docstring says;
    a malformed one is refused with the field that is wrong."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise UserError(f"messages: expected a list of {{role, content}} objects, found {_type_name(messages)}")
    out = []
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        if not isinstance(m, Mapping):
            raise UserError(f"{at}: expected a {{role, content}} object, found {_type_name(m)}")
        role = m.get("role")
        if role not in ROLES:
            raise UserError(f"{at}.role: expected one of {', '.join(ROLES)}, found {role!r}")
        msg = _json_data({k: v for k, v in m.items() if k not in ("content", "tool_calls")}, at)
        msg["role"] = "system" if role == "developer" else role
        content = m.get("content")
        if role == "assistant" and content is None:
            msg["content"] = None  # Hugging Face passes it on as it is; templates test for a string
        else:
            msg["content"] = _text(content, f"{at}.content")
        for key in ("reasoning_content", "reasoning"):
            if m.get(key) is not None and not isinstance(m[key], str):
                raise UserError(f"{at}.{key}: expected a string, found {_type_name(m[key])}")
        if m.get("tool_calls") is not None:
            if role != "assistant":
                raise UserError(f"{at}.tool_calls: only an assistant message calls tools, found one on a {role} "
                                "message")
            msg["tool_calls"] = _tool_calls(m["tool_calls"], f"{at}.tool_calls")
        out.append(msg)
    return out


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """OpenAI tool objects as JSON copies, in the caller's key order (the prompt shows them as
    JSON); ``None`` when there are none."""
    if tools is None:
        return None
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
        raise UserError(f"tools: expected a list of tool objects, found {_type_name(tools)}")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or tool.get("type", "function") != "function":
            raise UserError(f"tools[{i}]: expected {{\"type\": \"function\", \"function\": {{\"name\", ...}}}}, "
                            f"found {_one_line(json.dumps(tool, default=str))[:60]}")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise UserError(f"tools[{i}].function.name: expected a function name, found {function.get('name')!r}")
    return _json_data(list(tools), "tools") or None


def check_template_kwargs(kwargs: Mapping[str, Any] | None, where: str = "chat_template_kwargs") -> dict[str, Any]:
    """Extra template variables as JSON copies; one that would replace a renderer-supplied name
    (the conversation itself, the tools, the BOS) is refused."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise UserError(f"{where}: expected an object of template variables, found {_type_name(kwargs)}")
    clash = sorted(RESERVED.intersection(kwargs))
    if clash:
        raise UserError(f"{where}.{clash[0]}: expected a template variable of its own, found one the renderer "
                        f"sets (give {clash[0]} as a request field, not a template variable)")
    return _json_data(kwargs, where)


class ChatTemplate:
    """A compiled chat template; ``source`` (the GGUF's path) names it in every error."""

    def __init__(self, text: str, source: str | Path) -> None:
        from jinja2 import TemplateSyntaxError

        self.source = str(source)
        self.text = text
        try:
            self._template = _environment().from_string(text)
        except TemplateSyntaxError as e:
            raise self._error(f"template syntax error at line {e.lineno}: {e.message}") from None
        except Exception as e:  # the compiler's other refusals (e.g. a nesting too deep)
            raise self._error(f"could not compile the template: {e.__class__.__name__}: {e}") from None

    def _error(self, what: str) -> UserError:
        return UserError(_one_line(f"{self.source}: {TEMPLATE_KEY}: {what}"))

    def render(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None,
               add_generation_prompt: bool = True, bos_token: str = "", eos_token: str = "",
               template_kwargs: Mapping[str, Any] | None = None) -> str:
        """The prompt text; the one place a template runs."""
        from jinja2.sandbox import SecurityError

        from .template_limits import TemplateLimitExceeded, render_bounded

        context = {**check_template_kwargs(template_kwargs), "messages": chat_messages(messages),
                   "tools": chat_tools(tools), "add_generation_prompt": bool(add_generation_prompt),
                   "bos_token": bos_token, "eos_token": eos_token}
        try:
            return render_bounded(self._template, context)
        except TemplateLimitExceeded as e:
            raise self._error(f"{e} (refused)") from None
        except TemplateRaised as e:
            raise self._error(f"the template refused the conversation: {e}") from None
        except SecurityError as e:
            raise self._error(f"the template attempted an unsafe operation (refused): {e}") from None
        except RecursionError:
            raise self._error("the template recursed too deeply") from None
        except Exception as e:  # an untrusted template may fail in any way: never a traceback
            raise self._error(f"the template failed to render: {e.__class__.__name__}: {e}") from None



def render_chat(text: str, messages: Sequence[Mapping[str, Any]], *, source: str | Path,
                tools: Sequence[Mapping[str, Any]] | None = None, add_generation_prompt: bool = True,
                bos_token: str = "", eos_token: str = "", template_kwargs: Mapping[str, Any] | None = None) -> str:
    """Compile and render in one call (the CLI renders one conversation per process)."""
    return ChatTemplate(text, source).render(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                             bos_token=bos_token, eos_token=eos_token,
                                             template_kwargs=template_kwargs)
