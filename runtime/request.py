"""What one generation takes, normalised and checked in one place.

    opts = GenerateOptions(n_predict=128, n_max="auto", stop=("\\n\\n",))   # field rules, at once
    opts.check_limits(engine.limits)                                       # rules that need the pair
    check_context(len(prompt_tokens), opts.n_predict, engine.limits.n_ctx)

Every rule has one validator here; each raises :class:`RequestError` naming the request field.
A field's range is declared with its flag and JSON name in runtime/params.py.
Front ends name the field their own way: the CLI by its flag (one line, exit code 2), the
server by its JSON parameter (a 400 with ``param`` and ``code``). The engine calls the same
validators on what it is given, so the Python API gets the same errors. A new request field
(chat tools, an output constraint, a limit) is a field of :class:`GenerateOptions` and one
validator below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Integral

from .errors import RequestError
from .params import MAX_STOPS, REQUEST
from .sampling import SamplingParams
from .tuner import DepthPolicy

#: a prompt plus its n_predict must leave this many cells of the context free
CONTEXT_MARGIN = 16


@dataclass(frozen=True)
class PairLimits:
    """What an opened pair allows a request: known from the flags and the GGUF headers before
    any model loads (the CLI), or read off a loaded engine (``Engine.limits``)."""

    n_ctx: int
    n_batch: int
    max_draft: int = 0  # the drafter's block_size - 1; 0 without a drafter
    has_drafter: bool = False


# ---------------------------------------------------------------------- one validator per field


def check_n_predict(value: object) -> int:
    return REQUEST["n_predict"].check(value)


def parse_n_max(value: object) -> int | str | DepthPolicy:
    """The depth's form: an integer >= 0 (also as text, as a flag gives it), 'auto', or a policy."""
    if isinstance(value, DepthPolicy):
        return value
    return REQUEST["n_max"].check(value)


def verify_rows(depth: int | str, max_draft: int) -> int:
    """Rows of the largest verify pass a depth makes: the bonus token and the drafts."""
    return (max_draft if depth == "auto" else int(depth)) + 1


def check_n_max(depth: int | str | DepthPolicy, limits: PairLimits) -> None:
    """The depth against the drafter's block and the batch a verify pass must fit in."""
    if isinstance(depth, DepthPolicy):
        return
    if depth != "auto":
        if not limits.has_drafter and depth > 0:
            raise RequestError("n_max", "0 or 'auto' (no drafter was given)", depth)
        if limits.has_drafter:
            REQUEST["n_max"].but(note="(the drafter's block_size - 1)").check(depth, hi=limits.max_draft)
    if not limits.has_drafter:
        return
    rows = verify_rows(depth, limits.max_draft)
    if limits.n_batch < rows:
        # -b is the pair's setting, not the request's: the CLI names its flag, the server n_max
        raise RequestError("batch_size", f">= {rows} (a verify pass at depth {depth} is {rows} rows: the bonus "
                                      f"token and up to {rows - 1} drafts)", limits.n_batch)


def check_stop(value: object) -> tuple[str, ...]:
    """One string or several; each non-empty (an empty one would match before the first token)."""
    stops = (value,) if isinstance(value, str) else tuple(value or ())
    if len(stops) > MAX_STOPS:
        raise RequestError("stop", f"at most {MAX_STOPS} strings", len(stops))
    for s in stops:
        if not isinstance(s, str):
            raise RequestError("stop", "strings", s)
        if not s:
            raise RequestError("stop", "a non-empty string", s)
    return stops


def check_end_tokens(value: object) -> tuple[int, ...]:
    """Token ids (the vocabulary's range is checked where the model is: Engine)"""
    tokens = tuple(value or ())
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, Integral) or t < 0:
            raise RequestError("end_tokens", "token ids (integers >= 0)", t)
    return tuple(int(t) for t in tokens)


def check_constraint(value: object):
    """A runtime.constraint.Constraint, or one compiled for the target (compile_constraint), by
    their marker: this module sits below runtime/constraint/, which builds on RequestError."""
    if value is None:
        return None
    if not getattr(value, "is_output_constraint", False):
        raise RequestError("constraint", "a runtime.constraint.Constraint", type(value).__name__)
    return value


def context_room(n_prompt: int, n_ctx: int) -> int:
    """The most tokens a prompt of ``n_prompt`` tokens leaves to generate (negative: none)."""
    return n_ctx - n_prompt - CONTEXT_MARGIN


def check_context(n_prompt: int, n_predict: int, n_ctx: int) -> None:
    if n_prompt < 1:
        raise RequestError("prompt", "at least one token", "an empty prompt")
    if n_predict > context_room(n_prompt, n_ctx):
        raise RequestError("n_predict", f"at most {max(0, context_room(n_prompt, n_ctx))}: the context is "
                                        f"{n_ctx} tokens, the prompt has {n_prompt} and {CONTEXT_MARGIN} are "
                                        "kept free (raise -c, shorten the prompt or ask for fewer)",
                           n_predict, code="context_length_exceeded")


def fit_to_context(n_prompt: int, n_predict: int, n_ctx: int) -> int:
    """A server's budget: ``n_predict`` cut to what the context leaves, so that generation ends
    with "length" when the context is full (llama-server's rule; agents send budgets such as
    32000 whatever the context). A prompt that leaves no room at all is refused."""
    if n_prompt < 1:
        raise RequestError("prompt", "at least one token", "an empty prompt")
    room = context_room(n_prompt, n_ctx)
    if room < 1:
        raise RequestError("prompt", f"at most {max(1, n_ctx - CONTEXT_MARGIN - 1)} tokens: the context is {n_ctx} "
                                     f"tokens and {CONTEXT_MARGIN} are kept free (raise -c or shorten it)",
                           f"{n_prompt} tokens", code="context_length_exceeded")
    return min(n_predict, room)


# ---------------------------------------------------------------------- the request


@dataclass
class GenerateOptions:
    """Everything one generation takes. The fields are normalised and checked when the object
    is made (RequestError); :meth:`check_limits` adds the rules that need the opened pair."""

    n_predict: int = 256
    n_max: int | str | DepthPolicy = 4  # draft depth; 0 = plain decoding; "auto" = tuned online
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()  # generation ends at the first occurrence of any, which is not emitted
    add_bos: bool = True
    trace: Callable[[dict], None] | None = None  # called with one dict per round
    # asked once per round; True ends generation there with stop reason "interrupted" (Ctrl-C,
    # a client gone), its stats complete up to that round
    should_stop: Callable[[], bool] | None = None
    # tokens that end generation as the GGUF's end-of-generation tokens do (a chat template's end
    # of turn that llama.cpp does not mark), dropped from the output as those are
    end_tokens: tuple[int, ...] = ()
    # special tokens written as their text (chat: the reply parser reads <think>, <tool_call>)
    special_text: bool = False
    # structured output (runtime/constraint/): a Constraint, or one compiled for the target;
    # the output then matches it, and generation ends ("eog") when it is complete
    constraint: object | None = None

    def __post_init__(self) -> None:
        self.n_predict = check_n_predict(self.n_predict)
        self.end_tokens = check_end_tokens(self.end_tokens)
        self.n_max = parse_n_max(self.n_max)
        self.stop = check_stop(self.stop)
        self.constraint = check_constraint(self.constraint)
        if not isinstance(self.sampling, SamplingParams):
            raise RequestError("sampling", "a SamplingParams", self.sampling)

    def check_limits(self, limits: PairLimits) -> "GenerateOptions":
        check_n_max(self.n_max, limits)
        return self
