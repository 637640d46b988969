"""Pydantic models of the OpenAI-compatible wire format (requests, responses, stream chunks).

Field ranges are checked here so that a bad request is a 400 before anything is
queued. Fields we accept but do not serve yet (structured output) are declared so
that the serving layer can answer them with a clear error instead of ignoring them.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from sglang.srt.sampling.param_types import (
    MAX_OPENAI_TOP_LOGPROBS,
    Flag,
    GrammarText,
    LogitBias,
    MinP,
    NonNegInt,
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


class StreamOptions(BaseModel):
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


class SamplingFields(BaseModel):
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
    rid: RequestId | None = None
    # Structured output: accepted, answered 400 until a grammar backend serves it.
    regex: GrammarText | None = None
    json_schema: GrammarText | None = None
    ebnf: GrammarText | None = None
    response_format: ResponseFormat | None = None


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


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    name: str | None = None


class ChatCompletionRequest(SamplingFields):
    model_config = ConfigDict(extra="ignore")
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: strict(int, ge=1) | None = None
    logprobs: Flag = False
    top_logprobs: strict(int, ge=0, le=MAX_OPENAI_TOP_LOGPROBS) | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    chat_template_kwargs: dict[str, Any] | None = None
    continue_final_message: Flag = False


class ChatMessageOut(BaseModel):
    role: str = "assistant"
    content: str | None = None


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


class DeltaMessage(BaseModel):
    role: str | None = None
    content: str | None = None


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
