"""Chat templates from a GGUF (``tokenizer.chat_template``), rendered in a sandbox.

A template is code shipped inside a downloaded file: it is rendered in Jinja's immutable
sandbox, which refuses attribute access to internals (``__class__``, ``__globals__``...) and
calls that mutate objects, so a template cannot reach ``os`` or change the caller's data. The
helpers Hugging Face templates rely on are provided (``raise_exception``, ``strftime_now``, a
``tojson`` that leaves non-ASCII and HTML characters alone, ``break``/``continue``), so a
template written for ``transformers`` renders the same text here.

Every failure (syntax, a refused operation, the template's own ``raise_exception``, any other
render error) is a one-line :class:`convert.errors.UserError` naming the file and the key.

    template = ChatTemplate(open_gguf_template_text, source="model.gguf")
    prompt = template.render([{"role": "user", "content": "hi"}], bos_token="<s>")
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from ..convert.errors import UserError

TEMPLATE_KEY = "tokenizer.chat_template"
ROLES = ("system", "user", "assistant")


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


def _environment():
    from jinja2.ext import loopcontrols

    from .template_limits import BoundedSandbox

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def check_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Plain-dict copies of ``messages``; a message without a known role or a text content is refused."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise UserError(f"messages: expected a list of {{role, content}} objects, found {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise UserError(f"messages[{i}]: expected a {{role, content}} object, found {type(m).__name__}")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise UserError(f"messages[{i}].role: expected one of {', '.join(ROLES)}, found {role!r}")
        if not isinstance(content, str):
            raise UserError(f"messages[{i}].content: expected a string, found {type(content).__name__}")
        out.append(dict(m))
    return out


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

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
               bos_token: str = "", eos_token: str = "", **variables: Any) -> str:
        from jinja2.sandbox import SecurityError

        from .template_limits import TemplateLimitExceeded, render_bounded

        msgs = check_messages(messages)
        try:
            return render_bounded(self._template, dict(messages=msgs, add_generation_prompt=add_generation_prompt,
                                                       bos_token=bos_token, eos_token=eos_token, **variables))
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
                add_generation_prompt: bool = True, bos_token: str = "", eos_token: str = "") -> str:
    """Compile and render in one call (the CLI renders one conversation per process)."""
    return ChatTemplate(text, source).render(messages, add_generation_prompt=add_generation_prompt,
                                             bos_token=bos_token, eos_token=eos_token)
