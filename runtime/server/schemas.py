"""Request bodies of the OpenAI-compatible endpoints (pydantic v2, strict JSON types).

An unknown field is refused (400, naming it), as the OpenAI API does, rather than ignored: a
client that sends ``logprobs`` must learn that it is not served. Fields the OpenAI API has and
this server serves:

- ``max_tokens`` (chat also ``max_completion_tokens``), ``temperature``, ``top_p``, ``seed``,
  ``stop`` (a string or up to 16), ``stream``, ``stream_options.include_usage``, ``n`` (1),
  ``user`` (ignored), ``model`` (any value; the served model answers);
- chat: ``messages`` (roles ``system``, ``developer``, ``user``, ``assistant`` with
  ``tool_calls``, ``tool``), ``tools``, ``tool_choice`` (``auto``, ``none``, and ``required``
  or a named function, which constrain the output to Laguna's calls), ``parallel_tool_calls``;
- ``frequency_penalty`` / ``presence_penalty``: only 0 — OpenAI's additive penalties have no
  exact counterpart in llama.cpp's multiplicative ``repeat_penalty``, which is served instead.

Structured output: ``response_format`` (``text``, ``json_object``, ``json_schema`` with ``schema``
and ``strict``) and llama-server's ``grammar`` (GBNF) and ``json_schema``; checked and compiled by
runtime/constraint/, a bad one a 400 naming the field.

Extensions (llama-server's and vLLM's names): ``top_k``, ``min_p``, ``repeat_penalty``,
``repeat_last_n``, ``chat_template_kwargs`` (template variables such as ``enable_thinking``),
``reasoning_content`` on assistant messages (also vLLM's ``reasoning``), and ``n_max``, the
draft depth of this request (0..block_size-1 or ``"auto"``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field



class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(Strict):
    include_usage: bool = False


class TextPart(Strict):
    type: Literal["text"]
    text: str


class FunctionCall(Strict):
    name: str
    arguments: str | dict[str, Any] = "{}"  # JSON text, as OpenAI clients send it, or an object


class ToolCall(Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Strict):
    """One message; what each role needs (text content but for an assistant calling tools) is
    checked where the conversation is rendered, with the field's name."""

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None  # vLLM's name for reasoning_content
    refusal: str | None = None  # echoed back by clients that resend a response's message

    def template_fields(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True, exclude={"refusal"})


class FunctionDefinition(Strict):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDefinition

    def template_fields(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class NamedFunction(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class GenerationFields(Strict):
    model: str | None = None
    max_tokens: int | None = None  # its range: runtime/params.py's MAX_TOKENS
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
    # structured output (runtime/constraint/ reads them, naming each field in its errors)
    response_format: dict[str, Any] | None = None
    grammar: str | None = None
    json_schema: dict[str, Any] | bool | None = None


class CompletionRequest(GenerationFields):
    prompt: str | list[int] | list[str]


class ChatCompletionRequest(GenerationFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class ApplyTemplateRequest(ChatCompletionRequest):
    """llama-server's ``POST /apply-template``: a chat request's body, rendered and not run."""

    add_generation_prompt: bool = True


class TokenizeRequest(Strict):
    """llama-server's ``POST /tokenize``."""

    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(Strict):
    """llama-server's ``POST /detokenize``."""

    tokens: list[int]
