"""A scripted stand-in for the target's choices, for chat plumbing tests and the agent-loop
prompt-cache measurement: the bundled target never writes a tool call or a ``</think>``, but an
agent turn needs one.

The engine runs as it always does (prefill, drafter proposals, verify passes, roll-back, stop
checks, the prompt cache): only the sampler is replaced, and it picks the script's next token
instead of the target's, accepting a draft exactly when it equals the script. After the
script it picks the end-of-turn token. So every server and CLI code path is the real one,
speculation included (few drafts are accepted: the drafter predicts the real target).

    with scripted(target) as script:
        script.say("Need the weather.</think><tool_call>get_weather<arg_key>city</arg_key>...")
        ... a request to the server or a CLI run ...

Under an output constraint (``tool_choice: "required"``, a JSON schema) the script leads and
the target follows: each scripted token must be one the constraint allows (else ValueError),
and after the script the turn ends where the constraint allows it to (``tool_choice: "auto"``
holds calls to the tools but lets text end), else the target's own choices continue under the
constraint, so a script of reasoning up to ``</think>`` shows what the target writes where a
forced call takes over.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque

from laguna_dflash.runtime import constraint as constraint_module
from laguna_dflash.runtime import rounds as rounds_module
from laguna_dflash.runtime.conversation import end_of_turn_tokens


class Script:
    def __init__(self, target) -> None:
        self.target = target
        self.end = end_of_turn_tokens(target)[0]
        self._turns: deque[list[int]] = deque()
        self._lock = threading.Lock()

    def say(self, *texts: str) -> None:
        """Queue one turn per text: each generation takes the next."""
        with self._lock:
            for text in texts:
                self._turns.append(self.target.tokenize(text, add_special=False, parse_special=True))

    def next_turn(self) -> list[int]:
        with self._lock:
            return self._turns.popleft() if self._turns else []


class ScriptedSampler:
    history_len = 0

    def __init__(self, script: Script) -> None:
        self._script = script
        self._queued: deque[int] | None = None  # the turn, taken at the first token (the engine
        # builds a plain sampler before it knows whether a constraint replaces it)

    @property
    def _tokens(self) -> deque[int]:
        if self._queued is None:
            self._queued = deque(self._script.next_turn())
        return self._queued

    def _next(self) -> int:
        return self._tokens.popleft() if self._tokens else self._script.end

    def sample(self, logits, history=()) -> int:
        return self._next()

    def accept(self, logits, drafts, history=()) -> tuple[int, int]:
        n = 0
        while n < len(drafts) and n < len(self._tokens) and drafts[n] == self._tokens[n]:
            n += 1
        for _ in range(n):
            self._tokens.popleft()
        return n, self._next()


class ScriptedConstrainedSampler(constraint_module.ConstrainedSampler):
    """The script's tokens, each consumed by the constraint's matcher, then the end of the turn
    where the constraint allows it, else the target's own constrained choices."""

    def __init__(self, params, matcher, script: Script) -> None:
        super().__init__(params, matcher)
        self._tokens = deque(script.next_turn())
        self._end = script.end

    def _ends(self) -> bool:
        """The script is over and the constraint lets the turn end here (tool_choice auto): the
        end token, consumed. Else the target writes on under it (a forced call after scripted
        reasoning)."""
        return (not self._tokens and self.matcher.accepting and not self.matcher.ended
                and self.matcher.try_consume([self._end]) == 1)

    def sample(self, logits, history=()) -> int:
        if self._ends():
            return self._end
        if not self._tokens:
            return super().sample(logits, history)
        token = self._tokens.popleft()
        self.matcher.consume([token])
        return token

    def accept(self, logits, drafts, history=()) -> tuple[int, int]:
        if self._ends():
            return 0, self._end
        if not self._tokens:
            return super().accept(logits, drafts, history)
        n = 0
        while n < len(drafts) and n < len(self._tokens) and drafts[n] == self._tokens[n]:
            n += 1
        for _ in range(n):
            self.matcher.consume([self._tokens.popleft()])
        return n, self.sample(logits[n], history)


@contextlib.contextmanager
def scripted(target):
    """Inside the block, every generation's tokens are the next queued turn's (under a
    constraint: its first tokens, the target writing on)."""
    script = Script(target)
    real, real_constrained = rounds_module.Sampler, constraint_module.ConstrainedSampler
    rounds_module.Sampler = lambda params: ScriptedSampler(script)
    constraint_module.ConstrainedSampler = lambda params, matcher: ScriptedConstrainedSampler(params, matcher, script)
    try:
        yield script
    finally:
        rounds_module.Sampler, constraint_module.ConstrainedSampler = real, real_constrained
