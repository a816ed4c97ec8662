"""Request bodies of the OpenAI-compatible endpoints (pydantic v2, strict JSON types).

An unknown field is refused (400, naming it), as the OpenAI API does, rather than ignored: a
client that sends ``logprobs`` or ``tools`` must learn that they are not served. Fields the
OpenAI API has and this server serves:

- ``max_tokens`` (chat also ``max_completion_tokens``), ``temperature``, ``top_p``, ``seed``,
  ``stop`` (a string or up to 16), ``stream``, ``stream_options.include_usage``, ``n`` (1),
  ``user`` (ignored), ``model`` (any value; the served model answers);
- ``frequency_penalty`` / ``presence_penalty``: only 0 — OpenAI's additive penalties have no
  exact counterpart in llama.cpp's multiplicative ``repeat_penalty``, which is served instead.

Extensions (llama-server's names): ``top_k``, ``min_p``, ``repeat_penalty``, ``repeat_last_n``,
and ``n_max``, the draft depth of this request (0..block_size-1 or ``"auto"``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field



class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(Strict):
    include_usage: bool = False


class TextPart(Strict):
    type: Literal["text"]
    text: str


class ChatMessage(Strict):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class GenerationFields(Strict):
    model: str | None = None
    max_tokens: int | None = Field(None, ge=0)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    user: str | None = None
    n_max: int | Literal["auto"] | None = None


class CompletionRequest(GenerationFields):
    prompt: str | list[int] | list[str]


class ChatCompletionRequest(GenerationFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0)
