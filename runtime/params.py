"""Every tunable of laguna-run, declared once: its flag, its request field, its JSON name, its
range, its help line and its default.

    SAMPLING["top_p"].check(1.5)            # RequestError("top_p", "a number in (0, 1] (1: off)", 1.5)
    SAMPLING["top_p"].flag                  # "--top-p": what the CLI calls it in an error
    SAMPLING["top_p"].option()              # the typer option of run's --top-p

The groups: :data:`SAMPLING` (how tokens are drawn: the CLI's flags, the server's request
fields, :class:`~runtime.sampling.SamplingParams`), :data:`REQUEST` (what else one generation
takes), :data:`PAIR` (the models, the context and their placement: run, bench, serve),
:data:`SERVER` (serve's own) and :data:`RPC_SERVER` (laguna-rpc-server's). The CLI builds its
options from them (runtime/cli/options.py), SamplingParams and GenerateOptions check their values
with them, and the server names a value's JSON parameter by them, so a range, and its wording in
an error, exists in one place.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from numbers import Integral, Real
from pathlib import Path
from typing import Annotated, Any, Optional

from ..convert.errors import UserError

from .assets import BUNDLED
from .cores import MAX_THREADS
from .errors import RequestError

#: llama.cpp keeps sizes in 32-bit integers
MAX_SIZE = (1 << 31) - 1
#: llama.cpp's LLAMA_MAX_SEQ (llama-cparams.h): the sequences one context holds, so the most slots a
#: server has (each is a sequence of one target context: runtime/batch.py)
MAX_SEQ = 256
#: stop strings per request (OpenAI allows 4; llama-server any number)
MAX_STOPS = 16


@dataclass(frozen=True)
class Param:
    """One tunable. ``field`` is its name in Python (PairFlags, GenerateOptions, SamplingParams)
    and in a RequestError; ``json`` the server's name for it when that differs (None: the same)."""

    field: str
    flags: tuple[str, ...]
    help: str
    kind: type = int  # int, float, str, bool, Path
    default: Any = None
    lo: float | None = None
    hi: float | None = None
    above: bool = False  # lo itself is out of range
    finite: bool = False  # floats: inf is out of range
    note: str = ""  # what a special value means, after the range: "(0: off)"
    also: tuple = ()  # (value, meaning): a value outside the range that is accepted
    choices: tuple[str, ...] = ()
    words: tuple[str, ...] = ()  # text accepted besides the number ('auto')
    unit: str = ""  # the noun of a float's range ("seconds")
    json: str | None = None
    many: bool = False  # a repeatable flag (a list)
    option_kw: dict = field(default_factory=dict, compare=False)

    # ------------------------------------------------------------------ names

    @property
    def flag(self) -> str:
        """The flag as an error names it: the first name, and the long one after a short one
        (-n/--n-predict, --seed); aliases after those are left out."""
        first = self.flags[0]
        return "/".join(self.flags[:2]) if not first.startswith("--") and len(self.flags) > 1 else first

    @property
    def param(self) -> str:
        """The server's JSON name."""
        return self.json or self.field

    # ------------------------------------------------------------------ the range

    def expected(self, hi: float | None = None, found: object = None) -> str:
        """What the range accepts, in words (``hi``: an upper bound known only at check time)."""
        hi = self.hi if hi is None else hi
        if self.choices:
            text = "one of " + ", ".join(self.choices)
        elif self.kind is float:
            text = self._float_range(hi)
        else:
            # a size's 32-bit ceiling is only worth saying to a value above it
            below = isinstance(found, Real) and self.lo is not None and found < self.lo
            if hi is None or (hi == MAX_SIZE and below):
                text = f"an integer >= {_num(self.lo)}"
            else:
                text = f"{_num(self.lo)}..{_num(hi)}"
        if self.also:
            text += f" or {self.also[0]} ({self.also[1]})"
        if self.note:
            text += f" {self.note}"
        if self.words:
            text += " or " + " or ".join(repr(w) for w in self.words)
        return text

    def _float_range(self, hi: float | None) -> str:
        if hi is not None:
            return (f"{self.unit or 'a number'} in {'(' if self.above else '['}{_num(self.lo)}, {_num(hi)}]")
        noun = self.unit or ("a finite number" if self.finite else "a number")
        return f"{noun} {'>' if self.above else '>='} {_num(self.lo)}"

    def check(self, value: Any, hi: float | None = None) -> Any:
        """``value`` if the range takes it (an int from text for a number with ``words``, as a
        flag gives it), else RequestError naming ``field``."""
        if value is None and self.default is None:
            return None
        if self.choices:
            if value not in self.choices:
                raise RequestError(self.field, self.expected(), value)
            return value
        if self.also and value == self.also[0] and not isinstance(value, bool):
            return value
        if self.words:
            if isinstance(value, str):
                if value.strip() in self.words:
                    return value.strip()
                try:
                    value = int(value.strip())
                except ValueError:
                    raise RequestError(self.field, self.expected(hi), value) from None
        if self.kind not in (int, float):
            return value
        hi = self.hi if hi is None else hi
        wanted = Integral if self.kind is int else Real
        ok = not isinstance(value, bool) and isinstance(value, wanted)
        if ok and self.kind is float:
            ok = not math.isnan(value) and not (self.finite and math.isinf(value))
        if ok and self.lo is not None:
            ok = value > self.lo if self.above else value >= self.lo
        if ok and hi is not None:
            ok = value <= hi
        if not ok:
            raise RequestError(self.field, self.expected(hi, value), value)
        return int(value) if self.kind is int else value

    def check_flag(self, value: Any, hi: float | None = None) -> Any:
        """:meth:`check` for the command line: the error names the flag (UserError, exit code 2)."""
        try:
            return self.check(value, hi)
        except RequestError as e:
            raise UserError(e.render(self.flag)) from None

    def out_of_range(self) -> list:
        """Values just outside the range, from its bounds (what a test of every front end sends)."""
        step = 1 if self.kind is int else 0.5
        found = []
        if self.lo is not None:
            below = self.lo if self.above else self.lo - step
            if self.also and below == self.also[0]:
                below -= step
            found.append(below)
        if self.hi is not None:
            found.append(self.hi + step)
        return found

    # ------------------------------------------------------------------ the CLI

    def option(self, **over: Any) -> Any:
        """The typer option of this flag; ``over`` replaces its help or adds typer's keywords."""
        from ..convert.command_line import flag, switch

        kw = {"help": self.help, **self.option_kw, **over}
        if self.kind is bool:
            return switch(*self.flags, **kw)
        if self.default is None:
            kw.setdefault("show_default", False)
        return flag(*self.flags, **kw)

    def annotated(self, **over: Any) -> Any:
        """``Annotated[type, option]``: a command's parameter for this flag."""
        kind = str if self.words else self.kind  # a number or a word comes as text
        kind = list[kind] if self.many else kind
        return Annotated[Optional[kind] if self.default is None else kind, self.option(**over)]

    def but(self, **changes: Any) -> "Param":
        """This tunable with another default or help (one command's variant of a shared flag)."""
        return replace(self, **changes)


def _num(v: float | None) -> str:
    return "?" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


class Group(Sequence):
    """Params by field name, in declaration order."""

    def __init__(self, *params: Param) -> None:
        self._params = {p.field: p for p in params}

    def __getitem__(self, key):  # type: ignore[override]
        return self._params[key] if isinstance(key, str) else list(self._params.values())[key]

    def __len__(self) -> int:
        return len(self._params)

    def __iter__(self) -> Iterator[Param]:
        return iter(self._params.values())

    def __contains__(self, key: object) -> bool:
        return key in self._params

    def fields(self) -> tuple[str, ...]:
        return tuple(self._params)

    def check_flags(self, values: dict) -> None:
        """Every flag of the group against its range (``values``: by field name)."""
        for p in self:
            p.check_flag(values[p.field])


SAMPLING = Group(
    Param("temperature", ("--temp",), "Temperature; 0 = greedy (exact: same tokens as plain decoding).",
          float, 0.0, lo=0, finite=True, note="(0: greedy)"),
    Param("top_k", ("--top-k",), "Sample among the k most likely tokens only (0: all of them).",
          int, 40, lo=0, note="(0: off)"),
    Param("top_p", ("--top-p",), "Sample among the most likely tokens whose probabilities add up to p (1: all).",
          float, 0.95, lo=0, hi=1, above=True, note="(1: off)"),
    Param("min_p", ("--min-p",), "Drop the tokens less likely than min-p times the most likely one (0: off).",
          float, 0.05, lo=0, hi=1, note="(0: off)"),
    Param("repeat_penalty", ("--repeat-penalty",), "Divide the logits of recent tokens by this (1: off).",
          float, 1.0, lo=0, above=True, finite=True, note="(1: off)"),
    Param("repeat_last_n", ("--repeat-last-n",), "How many recent tokens --repeat-penalty looks at "
          "(-1: all, 0: off).", int, 64, lo=-1, note="(-1: all, 0: off)"),
    Param("seed", ("--seed", "-s"), "RNG seed for sampling (-1: a random one).", int, None, lo=0,
          also=(-1, "a random one")),
)

REQUEST = Group(
    Param("n_predict", ("-n", "--n-predict"), "Tokens to generate.", int, 128, lo=0, json="max_tokens"),
    Param("n_max", ("--n-max", "--draft-max"), "Draft depth per round: 0 = no speculation, 1..15, or 'auto' "
          "(tuned online). Default: 4 with a drafter, 0 without.", int, None, lo=0, words=("auto",)),
    Param("stop", ("--stop",), f"Stop string (repeatable; at most {MAX_STOPS}).", str, None, many=True,
          option_kw={"metavar": "TEXT"}),
    Param("prompt", ("-p", "--prompt"), "Prompt text.", str, None),
)

#: the server's token budget (OpenAI's max_tokens and max_completion_tokens): a request for none is
#: refused, as OpenAI refuses it
MAX_TOKENS = REQUEST["n_predict"].but(lo=1)

PAIR = Group(
    Param("model", ("-m", "--model"), "Target GGUF (a Laguna model). Default: the bundled laguna-tiny pair.",
          Path, None),
    Param("model_draft", ("-md", "--model-draft"), "Drafter GGUF written by [bold]laguna-gguf convert[/bold] "
          "(or Poolside's own). Without it: plain decoding.", Path, None),
    Param("bundled", ("--bundled",), "The bundled pair that runs without -m: code (laguna-tiny: completes "
          "Python) or agent (laguna-tiny-agent: Laguna 2.1's chat format, calls tools).", str, "code",
          choices=tuple(BUNDLED)),
    Param("ctx_size", ("-c", "--ctx-size"), "Context size (tokens) of both contexts.", int, 4096,
          lo=1, hi=MAX_SIZE),
    # a verify pass that does not fit is the request's depth at fault: the server names n_max
    Param("batch_size", ("-b", "--batch-size"), "Prompt chunk size (n_batch).", int, 512, lo=1, hi=MAX_SIZE,
          json="n_max"),
    Param("ubatch_size", ("-ub", "--ubatch-size"), "Microbatch size (n_ubatch); 0: the largest that keeps the "
          "target's sliding-window KV cache smallest.", int, 0, lo=0, hi=MAX_SIZE, note="(0: fit the sliding window)"),
    Param("threads", ("-t", "--threads"), "CPU threads (0: the cores no other process keeps busy when the run "
          "starts).", int, 0, lo=0, hi=MAX_THREADS, note="(0: the free cores)"),
    Param("n_gpu_layers", ("-ngl", "--n-gpu-layers"), "Target layers on the GPU (default: all on cuda, 0 on cpu).",
          int, None),
    Param("n_gpu_layers_draft", ("-ngld", "--n-gpu-layers-draft"), "Drafter layers on the GPU.", int, None),
    Param("device", ("--device",), "auto | cpu | cuda. auto: CUDA when this wheel has it and a GPU is present.",
          str, "auto"),
    Param("draft_device", ("--draft-device",), "Drafter device (default: the target's).", str, None),
    Param("force_placement", ("--force-placement",), "Allow a CPU drafter next to a GPU target (it loses at "
          "every measured depth).", bool, False),
    Param("cache_type", ("--cache-type",), "KV cache type of both contexts: f16, or f32 for bit-exact greedy "
          "comparisons with plain decoding.", str, "f16", choices=("f16", "f32")),
    Param("verbose", ("--verbose", "-v"), "Show llama.cpp's log.", bool, False),
    Param("rpc", ("--rpc",), "Comma-separated rpc-servers HOST:PORT (laguna-rpc-server on each): the target's "
          "layers go there, the drafter stays here.", str, None),
    Param("tensor_split", ("--tensor-split", "-ts"), "Proportions of the offloaded layers per device, in --rpc "
          "order (then this machine's GPU), e.g. 3,1. Default: by free memory.", str, None),
    Param("draft_rpc", ("--draft-rpc",), "Put the drafter's layers on the --rpc servers too.", bool, False),
    Param("rpc_timeout", ("--rpc-timeout",), "Seconds an RPC server may stay silent before it counts as lost "
          "(0: forever).", float, 60.0, lo=0, unit="seconds", note="(0: forever)"),
)

SERVER = Group(
    Param("host", ("--host",), "Address to listen on (127.0.0.1: this machine only).", str, "127.0.0.1"),
    Param("port", ("--port",), "TCP port (0: any free one, printed at start).", int, 8080, lo=0, hi=65535),
    Param("parallel", ("--parallel", "-np"), "Slots: requests generated at once, each with its own KV cache "
          "of -c tokens, decoded together in one target pass per round.", int, 1, lo=1, hi=MAX_SEQ),
    Param("lanes", ("--lanes",), "Split the slots into this many lanes, each with its own target context and "
          "an equal share of -t threads, whose passes run at the same time. For a small target (the bundled "
          "pairs) whose one pass cannot keep two threads busy; a real Laguna target's pass can, and keeps 1. "
          "Default: 1 with the target on the CPU, one lane per slot with it on a GPU (where a pass is "
          "launched by one host thread).",
          int, None, lo=1, hi=MAX_SEQ),
    Param("max_queue", ("--max-queue",), "Requests that may wait for a slot (first in, first out); one more "
          "gets 503.", int, 16, lo=0, hi=MAX_SIZE),
    Param("max_body_bytes", ("--max-body-bytes",), "Largest request body in bytes; a larger one is answered 413 "
          "before it is parsed. Default: 1 MiB + 64 bytes per context token.", int, None, lo=1024, hi=MAX_SIZE),
    Param("shutdown_timeout", ("--shutdown-timeout",), "On SIGTERM/SIGINT, seconds running requests may take to "
          "finish; then they are cut (a stream ends with a finish reason and an error event). A second signal "
          "exits at once.", float, 30.0, lo=0, hi=24 * 3600, unit="seconds"),
    Param("expose", ("--expose",), "Allow a non-loopback --host without an API key (anyone who can reach the "
          "port can use the model).", bool, False),
    Param("no_prompt_cache", ("--no-prompt-cache",), "Prefill every prompt from scratch (no reuse of the last "
          "sequence's caches).", bool, False),
    REQUEST["n_predict"].but(help="The most tokens a request may generate: a larger max_tokens is cut to it (the "
                             "reply then ends with finish reason length), and a request without one generates at "
                             "most this many (llama-server's -n). Default: up to the end of the context.",
                             default=-1, lo=1, hi=MAX_SIZE, also=(-1, "up to the end of the context"), json=None),
    Param("ctx_checkpoints", ("--ctx-checkpoints",), "Context checkpoints per slot: copies of the sliding-window "
          "layers' cells taken after each prompt, from which a prompt that departs from the cached sequence "
          "more than a window before its end restarts, instead of from 0. Each holds one window's cells.",
          int, 8, lo=0, hi=MAX_SIZE, note="(0: off)"),
)

#: laguna-rpc-server's (llama.cpp's rpc-server behind it takes no port 0)
RPC_SERVER = Group(
    Param("host", ("--host", "-H"), "IPv4 address to bind (127.0.0.1: this machine only).", str, "127.0.0.1"),
    Param("port", ("--port", "-p"), "TCP port.", int, 50052, lo=1, hi=65535),
    Param("threads", ("--threads", "-t"), "CPU threads of the CPU device (0: half the cores, rpc-server's default).",
          int, 0, lo=0, hi=MAX_THREADS, note="(0: rpc-server's default)"),
    Param("mem", ("--mem", "-m"), "Memory to offer, in MiB (0: what the device reports). Clients split layers by "
          "it; buffers beyond it are refused.", int, 0, lo=0, hi=MAX_SIZE, note="(0: what the device reports)"),
    Param("device", ("--device", "-d"), "Comma-separated ggml devices to serve (default: the GPUs, else the CPU).",
          str, ""),
    Param("cache", ("--cache", "-c"), "Keep received tensors in a local file cache (~/.cache/llama.cpp/rpc): a "
          "model loaded again is not sent again.", bool, False),
    Param("expose", ("--expose",), "Allow a --host other than loopback (no authentication, no encryption).",
          bool, False),
)

GROUPS = (SAMPLING, REQUEST, PAIR, SERVER, RPC_SERVER)


def find(field: str) -> Param | None:
    """The param of a field a RequestError names (None when no group declares it): a request's
    own, or the pair's (a verify pass that does not fit the batch)."""
    return next((g[field] for g in (SAMPLING, REQUEST, PAIR) if field in g), None)


def flag_of(field: str) -> str:
    """The flag an error on ``field`` names on the command line."""
    p = find(field)
    return p.flag if p is not None and p.flags else field


def json_of(field: str) -> str:
    """The JSON parameter an error on ``field`` names in a server response."""
    p = find(field)
    return p.param if p is not None else field
