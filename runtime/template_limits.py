"""Time and size bounds for a chat template's rendering, enforced inside Jinja's sandbox.

A chat template is code from a downloaded file. The sandbox stops it reaching internals; this
module stops it taking the process's time or memory: nested ``range(100000)`` loops, a string
doubled forty times, ``"x" * 300000000``, ``"{:>999999999}".format(1)``.

- **Time.** Every loop iteration, call, filter, attribute or item access checks a deadline
  (:data:`RENDER_SECONDS` after the render began); past it the render stops with
  :class:`TemplateTooSlow`. The check is a clock read, so a template that behaves pays nothing
  visible.
- **Size.** Every string or sequence a template builds (operators, ``~``, calls, filters) and the
  rendered text itself are bounded by :data:`RENDER_MAX_CHARS`; what can be sized before it is
  built (``*``, padding widths, format widths, ``indent``) is refused before it is built
  (:class:`TemplateTooLarge`).

The bounds hold per render and per thread (a server renders in several threads at once).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import re
import time
from collections.abc import Iterable, Iterator
from typing import Any

from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

#: the longest a render may take (seconds): real templates render a conversation in milliseconds
RENDER_SECONDS = 2.0
#: the most characters a render may build, in any one value or in its output, when the caller
#: does not size it for its context (:func:`chars_for_context`): a million tokens of text is
#: about 4-5 million characters
RENDER_MAX_CHARS = 1 << 24
#: characters per context token a render may build: a token is a few characters of text on
#: average; this leaves room for long ones and for text the template drops
RENDER_CHARS_PER_TOKEN = 64
#: the largest width, count or repeat a filter or string method may be given
MAX_WIDTH = 1 << 20

_GUARD_FILTER = "__laguna_bounded_iteration"
_BINOPS = frozenset({"+", "*", "%", "**"})
#: str methods whose first argument is the width of the result
_WIDTH_METHODS = frozenset({"center", "ljust", "rjust", "zfill"})
#: numbers in a format string (a width or precision could be any of them)
_NUMBERS = re.compile(r"\d+")


class TemplateLimitExceeded(Exception):
    """A template went past a bound; the renderer turns it into one line naming the template."""


class TemplateTooSlow(TemplateLimitExceeded):
    pass


class TemplateTooLarge(TemplateLimitExceeded):
    pass


class _Budget:
    __slots__ = ("deadline", "seconds", "max_chars")

    def __init__(self, seconds: float, max_chars: int) -> None:
        self.seconds, self.max_chars = seconds, max_chars
        self.deadline = time.monotonic() + seconds


_budget: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("laguna_template_budget", default=None)


@contextlib.contextmanager
def bounded(seconds: float | None = None, max_chars: int | None = None) -> Iterator[_Budget]:
    """The bounds of the renders inside the block (in this thread, or this asyncio task); None:
    the enclosing block's, else the module's. A caller that knows its context size sets
    ``max_chars=chars_for_context(n_ctx)`` around a render."""
    outer = _budget.get()
    if seconds is None:
        seconds = outer.seconds if outer is not None else RENDER_SECONDS
    if max_chars is None:
        max_chars = outer.max_chars if outer is not None else RENDER_MAX_CHARS
    token = _budget.set(_Budget(seconds, max_chars))
    try:
        yield _budget.get()
    finally:
        _budget.reset(token)


def chars_for_context(n_ctx: int) -> int:
    """The size bound of a render for a context of ``n_ctx`` tokens (at least 1 Mi characters)."""
    return min(RENDER_MAX_CHARS, max(1 << 20, RENDER_CHARS_PER_TOKEN * n_ctx))


def tick() -> None:
    budget = _budget.get()
    if budget is not None and time.monotonic() > budget.deadline:
        raise TemplateTooSlow(f"the template ran longer than {budget.seconds:g} s")


def _max_chars() -> int:
    budget = _budget.get()
    return budget.max_chars if budget is not None else RENDER_MAX_CHARS


def too_large(what: str, n: int) -> TemplateTooLarge:
    return TemplateTooLarge(f"the template built {what} of {n} characters or items, more than {_max_chars()}")


#: integers beyond this many bits are refused (arithmetic on them alone can take seconds)
MAX_INT_BITS = 1 << 16


def check_size(value: Any) -> Any:
    """``value`` when its length is within the bound (values without a length pass)."""
    if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)):
        n = len(value)
        if n > _max_chars():
            raise too_large("a value", n)
    elif isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise TemplateTooLarge(f"the template built an integer of {value.bit_length()} bits, more than {MAX_INT_BITS}")
    return value


def _check_width(n: Any) -> None:
    if isinstance(n, int) and not isinstance(n, bool) and n > MAX_WIDTH:
        raise TemplateTooLarge(f"the template asked for a width or count of {n}, more than {MAX_WIDTH}")


def _check_format_string(fmt: Any) -> None:
    if isinstance(fmt, str):
        for m in _NUMBERS.finditer(fmt):
            if len(m.group()) > 18 or int(m.group()) > _max_chars():
                raise too_large("a formatted value (a width in the format string)", int(m.group()))


def _bounded_iteration(iterable: Iterable) -> Iterator:
    for item in iterable:
        tick()
        yield item


def _bounded_filter(f):
    """A filter that checks the deadline first and the size of what it made after; the
    arguments that size its result are checked before it runs."""
    if getattr(f, "_laguna_bounded", False):
        return f

    @functools.wraps(f)  # keeps jinja_pass_arg (pass_context, pass_environment...)
    def bounded_filter(*args: Any, **kwargs: Any) -> Any:
        tick()
        for a in list(args[1:]) + list(kwargs.values()):
            _check_width(a)
        return check_size(f(*args, **kwargs))

    bounded_filter._laguna_bounded = True
    return bounded_filter


def _indent_bound(f):
    wrapped = _bounded_filter(f)

    @functools.wraps(wrapped)
    def indent(s: Any, width: Any = 4, *args: Any, **kwargs: Any) -> Any:
        if isinstance(s, str) and isinstance(width, int):
            n = len(s) + width * (s.count("\n") + 1)
            if n > _max_chars():
                raise too_large("an indented value", n)
        return wrapped(s, width, *args, **kwargs)

    return indent


def _format_bound(f):
    wrapped = _bounded_filter(f)

    @functools.wraps(wrapped)
    def format_filter(value: Any, *args: Any, **kwargs: Any) -> Any:
        _check_format_string(value)
        return wrapped(value, *args, **kwargs)

    return format_filter


_SPECIAL_FILTERS = {"indent": _indent_bound, "format": _format_bound}


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox with the time and size bounds of the module docstring, active
    inside :func:`bounded` (outside it, only the default size bound applies)."""

    intercepted_binops = _BINOPS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # lipsum(n) writes n paragraphs in one call, beyond any bound checked between calls
        self.globals.pop("lipsum", None)

    def _parse(self, source, name, filename):
        tree = super()._parse(source, name, filename)
        self._bound_filters()  # here, not in __init__: filters added after construction count too
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Filter(loop.iter, _GUARD_FILTER, [], [], None, None, lineno=loop.lineno)
        for concat in list(tree.find_all(nodes.Concat)):
            concat.nodes = [nodes.Filter(n, "__laguna_sized", [], [], None, None, lineno=n.lineno)
                            for n in concat.nodes]
        return tree

    def _bound_filters(self) -> None:
        for key, f in list(self.filters.items()):
            if key in (_GUARD_FILTER, "__laguna_sized") or getattr(f, "_laguna_bounded", False):
                continue
            self.filters[key] = _SPECIAL_FILTERS.get(key, _bounded_filter)(f)
        self.filters[_GUARD_FILTER] = _bounded_iteration
        self.filters["__laguna_sized"] = check_size

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        tick()
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int) and len(seq) * n > _max_chars():
                    raise too_large("a repeated value", len(seq) * n)
        elif operator == "%":
            _check_format_string(left)
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 \
                and max(left.bit_length(), 1) * right > MAX_INT_BITS:
            raise TemplateTooLarge(f"the template computed a power of more than {MAX_INT_BITS} bits")
        return check_size(super().call_binop(context, operator, left, right))

    def call(__self, __context, __obj, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (Jinja's signature)
        tick()
        name = getattr(__obj, "__name__", "")
        owner = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
        if isinstance(owner, str):
            if name in _WIDTH_METHODS and args:
                _check_width(args[0])
            elif name in ("format", "format_map"):
                _check_format_string(owner)
            elif name == "expandtabs":
                n = len(owner) * (args[0] if args and isinstance(args[0], int) else 8)
                if n > _max_chars():
                    raise too_large("an expanded value", n)
        return check_size(super().call(__context, __obj, *args, **kwargs))

    def getattr(self, obj: Any, attribute: str) -> Any:
        tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        tick()
        return super().getitem(obj, argument)


def render_bounded(template, variables: dict, *, seconds: float | None = None,
                   max_chars: int | None = None) -> str:
    """Render a template compiled by a :class:`BoundedSandbox`, within the bounds; the output is
    counted as it is generated, so a template cannot hand back more than ``max_chars``."""
    with bounded(seconds, max_chars) as budget:
        parts, n = [], 0
        for piece in template.generate(**variables):
            n += len(piece)
            if n > budget.max_chars:
                raise too_large("a rendered prompt", n)
            parts.append(piece)
        return "".join(parts)
