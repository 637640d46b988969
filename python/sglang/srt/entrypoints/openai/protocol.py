"""Pydantic models of the OpenAI-compatible wire format (requests, responses, stream chunks).

Field ranges are checked here so that a bad request is a 400 before anything is
queued. Fields we accept but do not serve yet (structured output) are declared so
that the serving layer can answer them with a clear error instead of ignoring them.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from sglang.srt.sampling.param_types import (
    MAX_OPENAI_TOP_LOGPROBS,
    Flag,
    GrammarText,
    InvalidParamError,
    LogitBias,
    MinP,
    NonNegInt,
    NullTakesTheDefault,
    NumSamples,
    Penalty,
    RepetitionPenalty,
    RequestId,
    Seed,
    StopStrings,
    Temperature,
    TokenIds,
    TopK,
    TopP,
    strict,
)

# --- shared pieces -------------------------------------------------------------------------


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class StreamOptions(NullTakesTheDefault):
    include_usage: Flag = False
    continuous_usage_stats: Flag = False


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: dict[str, Any] | None = None


_UNSUPPORTED_SGLANG_FIELDS = {
    "priority": "priority scheduling is not supported by this server (it has no "
    "--enable-priority-scheduling); send the request without a priority",
    "lora_path": "LoRA adapters are not supported by this server",
    "return_hidden_states": "return_hidden_states is not supported by this server",
    "custom_logit_processor": "custom logit processors are not supported by this server",
    "session_params": "sessions are not supported by this server",
    "stop_regex": "stop_regex is not supported by this server; stop on strings (stop) or "
    "token ids (stop_token_ids)",
}


ROUTING_REFUSED = (
    "routing a request to a chosen DP rank is not supported by this server "
    "(--load-balance-method picks the rank)"
)
# SGLang's per-request DP routing: the DP controller routes each request by
# --load-balance-method; with one DP rank the only rank, 0, is accepted (SGLang ignores it
# there too)
DP_RANK_FIELDS = ("routed_dp_rank", "data_parallel_rank")


class UnsupportedSGLangFields(BaseModel):
    """SGLang's request fields this server does not implement: refused naming the
    field on every route (/generate too), never ignored; a null or false is fine. The
    DP-rank routing fields depend on the server's ranks: `check_dp_routing`."""

    priority: Any = None
    lora_path: Any = None
    return_hidden_states: Any = None
    custom_logit_processor: Any = None
    session_params: Any = None
    stop_regex: Any = None
    routed_dp_rank: Any = None
    data_parallel_rank: Any = None

    def check_dp_routing(self, num_dp_ranks: int) -> None:
        """A 400 naming a routing field set to a rank: only rank 0 of a server with one
        DP rank is honoured (a chosen rank was ignored on the OpenAI routes: a 200 served
        wherever --load-balance-method sent it)."""
        for name in DP_RANK_FIELDS:
            value = getattr(self, name)
            if value is not None and not (num_dp_ranks == 1 and value == 0):
                raise InvalidParamError(f"{name}: {ROUTING_REFUSED}", name)

    @field_validator(*_UNSUPPORTED_SGLANG_FIELDS)
    @classmethod
    def _unsupported(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and value is not False:
            raise ValueError(_UNSUPPORTED_SGLANG_FIELDS[info.field_name])
        return value


class SamplingFields(NullTakesTheDefault, UnsupportedSGLangFields):
    """Sampling fields common to chat and completions, including SGLang's extras.

    Each field's type and range comes from `sampling.param_types`, the definition
    the native `sampling_params` uses too (strict types: no "5" for 5)."""

    model: strict(str)
    max_tokens: NonNegInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: NumSamples = 1
    stop: StopStrings = None
    seed: Seed | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logit_bias: LogitBias | None = None
    stream: Flag = False
    stream_options: StreamOptions | None = None
    user: strict(str) | None = None
    # SGLang extras.
    top_k: TopK = -1
    min_p: MinP = 0.0
    repetition_penalty: RepetitionPenalty = 1.0
    min_tokens: NonNegInt = 0
    ignore_eos: Flag = False
    skip_special_tokens: Flag = True
    stop_token_ids: TokenIds | None = None
    no_stop_trim: Flag = False
    include_stop_str_in_output: Flag = False  # vLLM's name for no_stop_trim
    rid: RequestId | None = None
    # Structured output: accepted, answered 400 until a grammar backend serves it.
    regex: GrammarText | None = None
    json_schema: GrammarText | None = None
    ebnf: GrammarText | None = None
    response_format: ResponseFormat | None = None

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and not info.data.get("stream"):  # OpenAI and vLLM refuse it
            raise ValueError("stream_options is only allowed when stream is true")
        return value


# --- logprobs ------------------------------------------------------------------------------


class CompletionLogProbs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogProbs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


# --- /v1/completions -----------------------------------------------------------------------

# A prompt: text, texts, token ids, or lists of token ids (strict: no "5" for 5).
PromptType = Union[strict(str), list[strict(str)], list[NonNegInt], list[list[NonNegInt]]]


class CompletionRequest(SamplingFields):
    model_config = ConfigDict(extra="ignore")
    prompt: PromptType
    echo: Flag = False
    logprobs: strict(int, ge=0, le=MAX_OPENAI_TOP_LOGPROBS) | None = None
    best_of: strict(int, ge=1) | None = None
    suffix: strict(str) | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    matched_stop: Union[int, str, None] = None
    # the output's token ids (vLLM's field), only from a server without a tokenizer
    # (--skip-tokenizer-init), whose `text` is empty
    token_ids: list[int] | None = Field(default=None, exclude_if=lambda ids: ids is None)


class CompletionResponse(BaseModel):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo


class CompletionStreamChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    matched_stop: Union[int, str, None] = None


class CompletionStreamResponse(BaseModel):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionStreamChoice]
    usage: UsageInfo | None = None


# --- /v1/chat/completions ------------------------------------------------------------------


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


# --- tools ---------------------------------------------------------------------------------


class FunctionDefinition(BaseModel):
    """A tool's function; `parameters` is a JSON schema (OpenAI's `strict` passes through)."""

    model_config = ConfigDict(extra="allow")
    name: strict(str, min_length=1)
    description: strict(str) | None = None
    parameters: dict[str, Any] | None = None


class Tool(NullTakesTheDefault):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionName(BaseModel):
    name: strict(str, min_length=1)


class NamedToolChoice(NullTakesTheDefault):
    type: Literal["function"] = "function"
    function: FunctionName


# "auto": parse what the model wrote; "required" / a named function: grammar-enforced calls.
ToolChoice = Union[Literal["none", "auto", "required"], NamedToolChoice]


class OmitsUnset(BaseModel):
    """Leaves out the fields named in `_omit_none` while they are None (OpenAI sends no
    `tool_calls` key on a message without calls, no `id` on an argument fragment)."""

    _omit_none: tuple[str, ...] = ()

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        return {k: v for k, v in data.items() if not (v is None and k in self._omit_none)}


class FunctionCall(OmitsUnset):
    _omit_none = ("name",)

    name: str | None = None
    arguments: str | None = None  # a JSON object as text (in a stream: a fragment of it)


class ToolCall(OmitsUnset):
    """A call in a response message, or a piece of one in a stream delta (by `index`)."""

    _omit_none = ("id", "type")

    id: str | None = None
    index: int | None = None
    type: Literal["function"] | None = None
    function: FunctionCall


class HistoryFunctionCall(BaseModel):
    name: strict(str)
    # OpenAI sends a JSON object's text; an object itself is taken too (as HF's
    # apply_chat_template renders it, and SGLang accepts it)
    arguments: Union[strict(str), dict[str, Any]]


class HistoryToolCall(NullTakesTheDefault):
    """An assistant message's earlier call, as the client sends it back."""

    model_config = ConfigDict(extra="allow")
    id: strict(str) | None = None
    type: Literal["function"] = "function"
    function: HistoryFunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    name: str | None = None
    tool_calls: list[HistoryToolCall] | None = None  # assistant
    tool_call_id: strict(str) | None = None  # tool
    reasoning_content: strict(str) | None = None  # assistant


class ChatCompletionRequest(SamplingFields):
    model_config = ConfigDict(extra="ignore")
    messages: list[ChatMessage] = Field(min_length=1)
    # a chat turn has no prompt to score (no echo): at least one token, as OpenAI and vLLM
    max_tokens: strict(int, ge=1) | None = None
    max_completion_tokens: strict(int, ge=1) | None = None
    logprobs: Flag = False
    top_logprobs: strict(int, ge=0, le=MAX_OPENAI_TOP_LOGPROBS) | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None  # default: "auto" with tools, else "none"
    parallel_tool_calls: Flag = True  # false: at most one call per choice
    chat_template_kwargs: dict[str, Any] | None = None
    # OpenAI's; rendered as the template variable `reasoning_effort` (as vLLM), which
    # templates with an effort setting read and the others ignore
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    continue_final_message: Flag = False
    # vLLM's: open the assistant's turn in the prompt (default: unless continuing one)
    add_generation_prompt: Flag | None = None
    # SGLang extras: with a reasoning parser, split the <think> part into
    # `reasoning_content` (and stream it as it comes, unless stream_reasoning is off).
    separate_reasoning: Flag = True
    stream_reasoning: Flag = True
    # OpenAI fields whose answer this server cannot give: refused, not ignored
    functions: Any = None  # legacy function calling
    function_call: Any = None
    modalities: Any = None  # ["text"] only
    audio: Any = None

    @field_validator("functions", "function_call")
    @classmethod
    def _legacy_functions(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            raise ValueError(
                f"the legacy {info.field_name} is not supported: send the functions as "
                "tools (and function_call as tool_choice)"
            )
        return value

    @field_validator("modalities", "audio")
    @classmethod
    def _text_only(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name == "modalities" and value in (None, ["text"]):
            return value
        if info.field_name == "audio" and value is None:
            return value
        raise ValueError("this server answers with text only (modalities [\"text\"]); no audio")

    @model_validator(mode="after")
    def _continue_or_open_a_turn(self) -> ChatCompletionRequest:
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError(
                "continue_final_message and add_generation_prompt cannot both be true "
                "(continue the last assistant message, or open a new turn)"
            )
        return self

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _named_choice_shape(cls, value: Any) -> Any:
        if isinstance(value, dict):
            function = value.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            if value.get("type", "function") != "function" or not isinstance(name, str):
                raise ValueError(
                    'a named tool_choice is {"type": "function", "function": {"name": "<tool>"}}'
                )
        return value


class ChatMessageOut(OmitsUnset):
    _omit_none = ("reasoning_content", "tool_calls")
    role: str = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatCompletionChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: ChatLogProbs | None = None
    finish_reason: str | None = None
    matched_stop: Union[int, str, None] = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: str = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo


class DeltaMessage(OmitsUnset):
    _omit_none = ("reasoning_content", "tool_calls")
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatCompletionStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogProbs | None = None
    finish_reason: str | None = None
    matched_stop: Union[int, str, None] = None


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: str = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: UsageInfo | None = None


# --- /v1/embeddings ------------------------------------------------------------------------

# OpenAI's input: a text, texts, token ids, or lists of token ids (strict: no "5" for 5).
EmbeddingInput = Union[
    strict(str, min_length=1),
    list[strict(str, min_length=1)],
    list[NonNegInt],
    list[list[NonNegInt]],
]


class EmbeddingRequest(NullTakesTheDefault, UnsupportedSGLangFields):
    model_config = ConfigDict(extra="ignore")
    model: strict(str)
    input: EmbeddingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: strict(int, ge=1) | None = None
    user: strict(str) | None = None
    rid: RequestId | None = None  # SGLang extra: the request id (one input), or its base


class EmbeddingObject(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # base64: the float32 little-endian bytes


class EmbeddingUsage(BaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingObject]
    model: str
    usage: EmbeddingUsage


# --- /v1/tokenize, /v1/detokenize (SGLang's, and vLLM's, helper routes) --------------------

class TokenizeRequest(NullTakesTheDefault):
    model_config = ConfigDict(extra="ignore")
    model: strict(str) = "default"
    prompt: strict(str) | list[strict(str)] = Field(union_mode="left_to_right")
    add_special_tokens: Flag = True


class TokenizeResponse(BaseModel):
    tokens: list[int] | list[list[int]]
    count: int | list[int]
    max_model_len: int  # the served context length


class DetokenizeRequest(NullTakesTheDefault):
    model_config = ConfigDict(extra="ignore")
    model: strict(str) = "default"
    tokens: list[NonNegInt] | list[list[NonNegInt]] = Field(union_mode="left_to_right")
    skip_special_tokens: Flag = True


class DetokenizeResponse(BaseModel):
    text: str | list[str]


# --- /v1/models ----------------------------------------------------------------------------


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "sglang"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)
