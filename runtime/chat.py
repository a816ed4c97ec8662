"""Laguna's chat output in OpenAI's shapes: reasoning, answer and tool calls.

Laguna (2.1 and the older XS.2/M.1 layout) writes its chain of thought up to ``</think>``, then
its answer, then tool calls as XML-like blocks, with no JSON::

    <tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>

(2.1 writes the name and tags back to back; XS.2 puts a newline after the name and each tag;
both are read). String arguments are raw text, other arguments JSON. This module turns such
text into an OpenAI assistant message (:func:`parse_response`) or, fed piece by piece, into
OpenAI streaming deltas (:class:`ResponseParser`). Both are the same state machine, so the
deltas of any split of a text rebuild exactly the message of the whole text
(:func:`message_from_deltas`); it reads each character a bounded number of times, so its time
is linear in the text whatever the text is.

Whether the output starts inside reasoning depends on the prompt, not on a model constant:
Laguna's template ends the prompt with ``<assistant><think>`` (thinking on) or
``<assistant></think>`` (off), and its two releases default differently;
:func:`starts_in_reasoning` reads the rendered prompt (text or token ids) backwards to the
last ``<think>``, ``</think>`` or ``<assistant>``.

    parser = ResponseParser(tools=request_tools, reasoning=starts_in_reasoning(prompt))
    for piece in pieces:
        for delta in parser.feed(piece):
            send(delta)            # {"content": ...}, {"reasoning_content": ...} or {"tool_calls": [...]}
    for delta in parser.finish():
        send(delta)

Arguments are typed by the request's tool schema: a property whose type is ``"string"`` (or
``["string", "null"]``, or an enum of strings) keeps its text byte for byte; any other value is JSON (or a Python literal: ``True``, ``['a', 'b']``),
and a value that is neither stays the stripped text.

Where the published implementations disagree (reference §3.3, §4), this module chooses as
below. vLLM's ``poolside_v1`` parsers are the reference servers: "legacy" is its regex parser,
"engine" the declarative parser replacing it. A number refers to the reasons after the table.

==============================================  =========================================  ==============================
situation                                       here                                       vLLM
==============================================  =========================================  ==============================
a call to a tool the request did not list       returned (1)                               legacy: returned; engine: dropped
string-typed value (by the schema)              verbatim, whitespace kept                  same
value without a schema (no tools, unknown       JSON, else a Python literal, else the      legacy: same; engine: strings
tool or key)                                    stripped text (2)
schema types read as a string                   ``"string"``, ``["string", "null"]``,      ``"string"`` only
                                                an enum of strings (3)
text before the first call                      kept as written; whitespace only: null     same
text between and after calls                    dropped                                    dropped (legacy streams it)
a pair missing ``</arg_key>``/``<arg_value>``   skipped, the call keeps its other pairs    same
a block whose name is empty or is not           its text is content, up to its             skipped; no call at all: the
followed by ``<arg_key>``/``</tool_call>``      ``</tool_call>`` (4)                       whole output is content
a call cut by the end of the output             no call: its text is content, verbatim     legacy: same
                                                (5)
a value cut by ``</tool_call>``                 kept as far as it goes                     legacy: the pair is dropped
a repeated key                                  the first value                            last (legacy streaming: first)
``<tool_call>`` inside reasoning                ends the reasoning, starts the call (6)    legacy: reasoning; engine: as here
``</think>`` with reasoning off                 dropped (7)                                legacy: content (#49379)
``<think>`` in the answer                       reasoning again until ``</think>``         legacy: content; engine: as here
``<think>`` inside reasoning                    dropped                                    same
no ``</think>`` before the end                  all reasoning, content null                same
whitespace around reasoning                     verbatim                                   engine strips the trailing
the reasoning field                             ``reasoning_content`` (8)                  ``reasoning`` since PR #27752
==============================================  =========================================  ==============================

1. The client decides what an unknown call means; dropping it loses what the model did.
2. Most parsers decode (SGLang, MAX, hipEngine): ``<arg_value>2</arg_value>`` means 2.
3. Nullable strings are common in real schemas; their text is as exact as a plain string's.
4. Nothing the model wrote vanishes, and a stream can tell at once (the name and the tag after
   it decide), where vLLM's rule needs the whole output.
5. A call cut by max_tokens would run a truncated command (``{"city": "Par"}``); the finish
   reason ``length`` tells the client why no call came. So a stream sends each call whole, when
   its ``</tool_call>`` arrives, never part of one that might not be finished.
6. A model that forgets ``</think>`` still gets its call run (Ollama does the same).
7. ``</think>`` is markup, never part of an answer: the leak users report against vLLM.
8. The name llama-server, SGLang and Poolside's own API use; history accepts both.

Arguments are serialised as ``json.dumps(..., ensure_ascii=False)`` writes them (``", "`` and
``": "``), as vLLM does; call ids are ``call_`` and 24 random hex digits.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

THINK, END_THINK, ASSISTANT = "<think>", "</think>", "<assistant>"
#: the texts of the tokens that end an assistant turn in Laguna's template, besides what
#: llama.cpp marks end-of-generation in the GGUF (Laguna's generation_config: eos [2, 24])
END_OF_TURN = ("</assistant>", "〈|EOS|〉")
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
KEY_OPEN, KEY_CLOSE = "<arg_key>", "</arg_key>"
VALUE_OPEN, VALUE_CLOSE = "<arg_value>", "</arg_value>"


class ReasoningMarkers(NamedTuple):
    """The token ids of ``<think>``, ``</think>`` and ``<assistant>`` in a vocabulary (Laguna: 18, 19, 23)."""

    think: int
    end_think: int
    assistant: int


def starts_in_reasoning(prompt: str | Sequence[int], markers: ReasoningMarkers | None = None) -> bool:
    """Whether generation after ``prompt`` starts inside reasoning.

    Read backwards from the end: ``<think>`` first means inside, ``</think>`` means the answer,
    ``<assistant>`` (the start of the turn being generated) or the start of the prompt means no
    reasoning was opened. Stopping at ``<assistant>`` keeps a ``</think>`` from an earlier turn,
    a few-shot example or a tool description from deciding. ``prompt`` is the rendered text, or
    its token ids with the ``markers`` of that vocabulary.
    """
    if isinstance(prompt, str):
        last = max((prompt.rfind(THINK), THINK), (prompt.rfind(END_THINK), END_THINK),
                   (prompt.rfind(ASSISTANT), ASSISTANT))
        return last[0] >= 0 and last[1] == THINK
    if markers is None:
        raise TypeError("starts_in_reasoning: token ids need the vocabulary's ReasoningMarkers")
    for token in reversed(prompt):
        if token == markers.think:
            return True
        if token == markers.end_think or token == markers.assistant:
            return False
    return False


# ---------------------------------------------------------------------- argument typing


def _is_string_schema(schema: Any) -> bool:
    if not isinstance(schema, Mapping):
        return False
    kind = schema.get("type")
    if isinstance(kind, str):
        return kind == "string"
    if isinstance(kind, list):
        kinds = {k for k in kind if k != "null"}
        return kinds == {"string"}
    enum = schema.get("enum")
    return kind is None and isinstance(enum, list) and bool(enum) and all(isinstance(v, str) for v in enum)


def _string_keys(tools: Iterable[Mapping[str, Any]] | None) -> dict[str, frozenset[str]]:
    """Tool name -> the argument names its schema types as strings."""
    out: dict[str, frozenset[str]] = {}
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            continue
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
        keys = [k for k, s in properties.items() if _is_string_schema(s)] if isinstance(properties, Mapping) else []
        out.setdefault(function["name"], frozenset(keys))
    return out


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def decode_value(text: str) -> Any:
    """A value without a string schema: JSON, else a Python literal (``True``, ``['a', 'b']``),
    else the stripped text. Never raises."""
    stripped = text.strip()
    try:
        value = json.loads(stripped, parse_constant=_refuse_constant)
        _dumps(value)
        return value
    except Exception:  # not JSON (or JSON nested too deep): the next reading
        pass
    if stripped in ("True", "False", "None") or stripped[:1] in ("[", "{"):
        try:
            value = ast.literal_eval(stripped)
            _dumps(value)  # sets, bytes, complex numbers: not JSON, so not a value here
            return json.loads(_dumps(value))
        except Exception:  # literal_eval refuses (or fails on) anything but a literal
            pass
    return stripped


# ---------------------------------------------------------------------- the parser

_CONTENT, _REASONING, _NAME_START, _NAME, _AFTER_NAME, _BLOCK, _ARGS, _KEY, _AFTER_KEY, _VALUE = range(10)
_IN_CALL = frozenset((_ARGS, _KEY, _AFTER_KEY, _VALUE))

_TEXT_TAGS = (THINK, END_THINK, TOOL_OPEN)
_TEXT_TAGS_NO_CALLS = (THINK, END_THINK)
_KEY_TAGS = (KEY_CLOSE, TOOL_CLOSE)
_ARGS_TAGS = (KEY_OPEN, TOOL_CLOSE)
_VALUE_TAGS = (VALUE_CLOSE, TOOL_CLOSE)
_BLOCK_TAGS = (TOOL_CLOSE,)


def _pattern(tags: Sequence[str]) -> re.Pattern:
    return re.compile("|".join(re.escape(t) for t in tags))


_PATTERNS = {tags: _pattern(tags) for tags in (_TEXT_TAGS, _TEXT_TAGS_NO_CALLS, _KEY_TAGS, _ARGS_TAGS,
                                               _VALUE_TAGS, _BLOCK_TAGS)}
_NON_SPACE = re.compile(r"\S")
_NAME_END = re.compile(r"[\n<]")


def _held(text: str, start: int, tags: Sequence[str]) -> int:
    """Length of the longest end of ``text[start:]`` that could be the start of one of ``tags``."""
    n = len(text)
    for k in range(min(max(map(len, tags)) - 1, n - start), 0, -1):
        tail = text[n - k:]
        if any(t.startswith(tail) for t in tags):
            return k
    return 0


def _new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class _Deltas:
    """OpenAI delta dicts, neighbours of one kind merged (one delta per kind and call per step)."""

    def __init__(self) -> None:
        # [field, pieces] for text; ["tool_calls", index, header or None, pieces] for a call
        self._entries: list[list[Any]] = []

    def text(self, field: str, text: str) -> None:
        if not text:
            return
        last = self._entries[-1] if self._entries else None
        if last is not None and last[0] == field:
            last[1].append(text)
        else:
            self._entries.append([field, [text]])

    def call(self, index: int, call_id: str, name: str) -> None:
        self._entries.append(["tool_calls", index, {"id": call_id, "type": "function", "name": name}, []])

    def arguments(self, index: int, text: str) -> None:
        last = self._entries[-1] if self._entries else None
        if last is not None and last[0] == "tool_calls" and last[1] == index:
            last[3].append(text)
        else:
            self._entries.append(["tool_calls", index, None, [text]])

    def extend(self, other: "_Deltas") -> None:
        self._entries.extend(other._entries)

    @property
    def items(self) -> list[dict[str, Any]]:
        out = []
        for entry in self._entries:
            if entry[0] != "tool_calls":
                out.append({entry[0]: "".join(entry[1])})
                continue
            _, index, header, pieces = entry
            item: dict[str, Any] = {"index": index}
            if header is None:
                item["function"] = {"arguments": "".join(pieces)}
            else:
                item.update(id=header["id"], type="function",
                            function={"name": header["name"], "arguments": "".join(pieces)})
            out.append({"tool_calls": [item]})
        return out


class ResponseParser:
    """Generated text in, OpenAI chat-completion deltas out (see the module docstring).

    ``tools``: the request's OpenAI tool objects (their schemas type the arguments).
    ``reasoning``: the prompt left the output inside reasoning (:func:`starts_in_reasoning`).
    ``tool_calls=False`` reads ``<tool_call>`` as text (``tool_choice: "none"``);
    ``parallel_tool_calls=False`` keeps the first call and drops the others.
    """

    def __init__(self, tools: Iterable[Mapping[str, Any]] | None = None, reasoning: bool = False, *,
                 tool_calls: bool = True, parallel_tool_calls: bool = True) -> None:
        self._string_keys = _string_keys(tools)
        self._calls_allowed = tool_calls
        self._parallel = parallel_tool_calls
        self._state = _REASONING if reasoning else _CONTENT
        self._buf = ""
        self._pos = 0
        self.n_calls = 0  # complete calls (closed by </tool_call>)
        self._call: _Deltas | None = None  # the open call's deltas, sent when its </tool_call> comes
        self._content_started = False  # a non-whitespace character of content was sent
        self._space: list[str] = []  # whitespace-only content so far: null if a call follows
        self._raw: list[str] = []  # a block as written while it may still turn out not to be a call
        self._name: list[str] = []
        self._key: list[str] = []
        self._value: list[str] = []
        self._call_keys: frozenset[str] = frozenset()
        self._seen_keys: set[str] = set()
        self._has_args = False
        self._value_key: str | None = None  # None: the value is skipped (a repeated key)
        self._value_is_string = False
        self._finished = False

    # -------------------------------------------------------------- public

    def feed(self, text: str) -> list[dict[str, Any]]:
        """The deltas ``text`` completes; text that may be the start of a tag is held back."""
        if self._finished:
            raise RuntimeError("ResponseParser.feed after finish")
        self._buf = self._buf[self._pos:] + text
        self._pos = 0
        out = _Deltas()
        while self._recorded_step(out, final=False):
            pass
        self._buf = self._buf[self._pos:]
        self._pos = 0
        return out.items

    def finish(self) -> list[dict[str, Any]]:
        """The deltas of the held-back text, the end of an unterminated block closing it."""
        if self._finished:
            return []
        out = _Deltas()
        while self._recorded_step(out, final=True):
            pass
        state, rest = self._state, self._buf[self._pos:]
        self._buf, self._pos = "", 0
        if state == _CONTENT:
            self._content(out, rest)
        elif state == _REASONING:
            out.text("reasoning_content", rest)
        elif state in (_NAME_START, _NAME, _AFTER_NAME):  # never shown to be a call: it was text
            self._content(out, "".join(self._raw) + rest)
        elif state == _BLOCK:
            self._content(out, rest)
        else:  # a call never closed: no call, the text it was
            self._call = None
            self._content(out, "".join(self._raw) + rest)
        if not self.n_calls and self._space:
            out.text("content", "".join(self._space))
        self._space.clear()
        self._finished = True
        return out.items

    # -------------------------------------------------------------- text

    def _content(self, out: _Deltas, text: str) -> None:
        if not text or self.n_calls:  # text after a call is dropped
            return
        if not self._content_started:
            if text.isspace():
                self._space.append(text)
                return
            self._content_started = True
            text = "".join(self._space) + text
            self._space.clear()
        out.text("content", text)

    def _emit_text(self, out: _Deltas, text: str) -> None:
        if self._state == _REASONING:
            out.text("reasoning_content", text)
        else:
            self._content(out, text)

    def _scan(self, out: _Deltas, tags: tuple[str, ...], final: bool, emit) -> tuple[int, str] | None:
        """Find the next of ``tags``: text before it goes to ``emit``; None when it is not in
        the buffer (all but a possible tag start consumed)."""
        buf, pos = self._buf, self._pos
        m = _PATTERNS[tags].search(buf, pos)
        if m is None:
            keep = 0 if final else _held(buf, pos, tags)
            emit(out, buf[pos:len(buf) - keep])
            self._pos = len(buf) - keep
            return None
        emit(out, buf[pos:m.start()])
        self._pos = m.end()
        return m.start(), m.group()

    def _recorded_step(self, out: _Deltas, final: bool) -> bool:
        """One step; the text a call's arguments consume is kept as written, for when the call
        is never closed."""
        state, start = self._state, self._pos
        more = self._step(out, final)
        if state in _IN_CALL:
            self._raw.append(self._buf[start:self._pos])
        return more

    def _step(self, out: _Deltas, final: bool) -> bool:
        state = self._state
        if self._pos >= len(self._buf):
            return False
        if state in (_CONTENT, _REASONING):
            tags = _TEXT_TAGS if self._calls_allowed else _TEXT_TAGS_NO_CALLS
            found = self._scan(out, tags, final, self._emit_text)
            if found is None:
                return False
            tag = found[1]
            if tag == THINK:
                self._state = _REASONING
            elif tag == END_THINK:
                self._state = _CONTENT
            elif self.n_calls and not self._parallel:
                self._state = _BLOCK  # a second call: dropped as text after a call is
            else:
                self._state = _NAME_START
                self._raw = [TOOL_OPEN]
                self._name = []
            return True
        if state == _NAME_START:
            m = _NON_SPACE.search(self._buf, self._pos)
            end = m.start() if m else len(self._buf)
            self._raw.append(self._buf[self._pos:end])
            self._pos = end
            if m is None:
                return False
            self._state = _NAME if m.group() != "<" else _AFTER_NAME
            return True
        if state == _NAME:
            m = _NAME_END.search(self._buf, self._pos)
            end = m.start() if m else len(self._buf)
            self._name.append(self._buf[self._pos:end])
            self._raw.append(self._name[-1])
            self._pos = end
            if m is None:
                return False
            self._state = _AFTER_NAME
            return True
        if state == _AFTER_NAME:
            return self._after_name(out, final)
        if state == _BLOCK:
            found = self._scan(out, _BLOCK_TAGS, final, self._content)
            if found is None:
                return False
            self._content(out, TOOL_CLOSE)
            self._state = _CONTENT
            return True
        if state == _ARGS:
            found = self._scan(out, _ARGS_TAGS, final, lambda out, text: None)
            if found is None:
                return False
            if found[1] == KEY_OPEN:
                self._key = []
                self._state = _KEY
            else:
                self._end_call(out)
            return True
        if state == _KEY:
            found = self._scan(out, _KEY_TAGS, final, lambda out, text: self._key.append(text))
            if found is None:
                return False
            if found[1] == KEY_CLOSE:
                self._state = _AFTER_KEY
            else:
                self._end_call(out)
            return True
        if state == _AFTER_KEY:
            m = _NON_SPACE.search(self._buf, self._pos)
            if m is None:
                self._pos = len(self._buf)
                return False
            self._pos = m.start()
            if self._buf.startswith(VALUE_OPEN, self._pos):
                self._pos += len(VALUE_OPEN)
                self._start_value(out)
                self._state = _VALUE
                return True
            if not final and VALUE_OPEN.startswith(self._buf[self._pos:]):
                return False  # wait for the rest of the tag
            self._state = _ARGS  # a key with no value: skipped
            return True
        # _VALUE
        found = self._scan(out, _VALUE_TAGS, final, self._value_text)
        if found is None:
            return False
        self._end_value(out)
        if found[1] == VALUE_CLOSE:
            self._state = _ARGS
        else:
            self._end_call(out)
        return True

    # -------------------------------------------------------------- calls

    def _after_name(self, out: _Deltas, final: bool) -> bool:
        buf = self._buf
        m = _NON_SPACE.search(buf, self._pos)
        end = m.start() if m else len(buf)
        self._raw.append(buf[self._pos:end])
        self._pos = end
        if m is None:
            return False
        rest = buf[end:end + len(TOOL_CLOSE)]
        name = "".join(self._name).strip()
        opens_args = rest.startswith(KEY_OPEN)
        if name and (opens_args or rest.startswith(TOOL_CLOSE)):
            self._start_call(out, name)
            if opens_args:
                self._raw.append(KEY_OPEN)
                self._pos = end + len(KEY_OPEN)
                self._key = []
                self._state = _KEY
            else:
                self._pos = end + len(TOOL_CLOSE)
                self._end_call(out)
            return True
        if name and not final and len(rest) < len(TOOL_CLOSE) and (KEY_OPEN.startswith(rest)
                                                                   or TOOL_CLOSE.startswith(rest)):
            return False  # wait for the rest of the tag
        # not a call: the block is text, as written, up to its </tool_call>
        self._content(out, "".join(self._raw))
        self._state = _BLOCK
        return True

    def _start_call(self, out: _Deltas, name: str) -> None:
        self._call = _Deltas()
        self._call.call(self.n_calls, _new_call_id(), name)
        self._call_keys = self._string_keys.get(name, frozenset())
        self._seen_keys = set()
        self._has_args = False

    def _end_call(self, out: _Deltas) -> None:
        self._call.arguments(self.n_calls, "}" if self._has_args else "{}")
        out.extend(self._call)
        self._call = None
        self.n_calls += 1
        self._space.clear()  # whitespace-only content before a call is no content
        self._state = _CONTENT

    def _start_value(self, out: _Deltas) -> None:
        key = "".join(self._key).strip()
        self._value = []
        if key in self._seen_keys:
            self._value_key = None
            return
        self._seen_keys.add(key)
        self._value_key = key
        self._value_is_string = key in self._call_keys
        if self._value_is_string:
            self._call.arguments(self.n_calls, self._separator() + _dumps(key) + ': "')

    def _separator(self) -> str:
        separator = ", " if self._has_args else "{"
        self._has_args = True
        return separator

    def _value_text(self, out: _Deltas, text: str) -> None:
        if not text or self._value_key is None:
            return
        if self._value_is_string:
            self._call.arguments(self.n_calls, _dumps(text)[1:-1])
        else:
            self._value.append(text)

    def _end_value(self, out: _Deltas) -> None:
        if self._value_key is None:
            return
        if self._value_is_string:
            self._call.arguments(self.n_calls, '"')
        else:
            value = decode_value("".join(self._value))
            self._call.arguments(self.n_calls, self._separator() + _dumps(self._value_key) + ": " + _dumps(value))
        self._value_key = None
        self._value = []


def message_from_deltas(deltas: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The assistant message a sequence of deltas builds (as an OpenAI client accumulates them)."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, tuple[dict[str, Any], list[str], list[str]]] = {}  # index -> (call, name, arguments)
    for delta in deltas:
        if delta.get("content"):
            content.append(delta["content"])
        if delta.get("reasoning_content"):
            reasoning.append(delta["reasoning_content"])
        for item in delta.get("tool_calls") or ():
            call, name, arguments = calls.setdefault(item["index"], ({"id": None, "type": "function"}, [], []))
            if item.get("id"):
                call["id"] = item["id"]
            function = item.get("function") or {}
            name.append(function.get("name") or "")
            arguments.append(function.get("arguments") or "")
    tool_calls = [{**call, "function": {"name": "".join(name), "arguments": "".join(arguments)}}
                  for call, name, arguments in (calls[i] for i in sorted(calls))]
    return {"role": "assistant", "content": "".join(content) or None,
            "reasoning_content": "".join(reasoning) or None, "tool_calls": tool_calls}


def parse_response(text: str, *, tools: Iterable[Mapping[str, Any]] | None = None, reasoning: bool = False,
                   tool_calls: bool = True, parallel_tool_calls: bool = True) -> dict[str, Any]:
    """The OpenAI assistant message of a whole generated ``text``: ``content``,
    ``reasoning_content`` (None when absent) and ``tool_calls`` (``id``, ``type``,
    ``function.name``, ``function.arguments`` as JSON text; a list, empty when none).
    Arguments as :class:`ResponseParser` reads them."""
    parser = ResponseParser(tools, reasoning, tool_calls=tool_calls, parallel_tool_calls=parallel_tool_calls)
    return message_from_deltas(parser.feed(text) + parser.finish())
