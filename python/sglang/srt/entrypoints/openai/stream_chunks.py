"""Streamed chunks as plain dicts, shaped exactly as the protocol models dump them.

Every streamed token becomes one chunk that is built, dumped and serialized once. Built
as `CompletionStreamResponse` / `ChatCompletionStreamResponse`, pydantic's validation
and `model_dump` cost ~20 us per chunk, the largest share of the HTTP process's Python
per token; the same keys in the same order as a dict, serialized by orjson, cost ~3 us.
The models stay the schema (and the OpenAPI docs): `test_stream_chunks` pins each builder
to the dump of the model it stands for.
"""

from __future__ import annotations

import time
from typing import Any

from sglang.srt.entrypoints.openai.protocol import (
    ChatLogProbs,
    CompletionLogProbs,
    DeltaMessage,
    UsageInfo,
)

COMPLETION_CHUNK_OBJECT = "text_completion"
CHAT_CHUNK_OBJECT = "chat.completion.chunk"


def completion_chunk(
    request_id: str,
    model: str,
    index: int,
    text: str,
    logprobs: CompletionLogProbs | None = None,
    finish_reason: str | None = None,
    matched_stop: int | str | None = None,
    token_ids: list[int] | None = None,
) -> dict[str, Any]:
    """`CompletionStreamResponse(choices=[CompletionStreamChoice(...)]).model_dump()`;
    `token_ids` (the new ones) only from a server without a tokenizer."""
    choice = {
        "index": index,
        "text": text,
        "logprobs": None if logprobs is None else logprobs.model_dump(),
        "finish_reason": finish_reason,
        "matched_stop": matched_stop,
    }
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return _chunk(request_id, COMPLETION_CHUNK_OBJECT, model, choice)


def chat_chunk(
    request_id: str,
    model: str,
    index: int,
    delta: DeltaMessage,
    logprobs: ChatLogProbs | None = None,
    finish_reason: str | None = None,
    matched_stop: int | str | None = None,
) -> dict[str, Any]:
    """`ChatCompletionStreamResponse(choices=[ChatCompletionStreamChoice(...)]).model_dump()`."""
    choice = {
        "index": index,
        "delta": delta_dict(delta),
        "logprobs": None if logprobs is None else logprobs.model_dump(),
        "finish_reason": finish_reason,
        "matched_stop": matched_stop,
    }
    return _chunk(request_id, CHAT_CHUNK_OBJECT, model, choice)


def delta_dict(delta: DeltaMessage) -> dict[str, Any]:
    """`delta.model_dump()`; a text or role delta (nearly every chunk) without pydantic."""
    if delta.reasoning_content is None and delta.tool_calls is None:
        return {"role": delta.role, "content": delta.content}  # both omitted-when-None keys unset
    return delta.model_dump()


def stamp_usage(chunk: dict[str, Any], usage: UsageInfo) -> dict[str, Any]:
    chunk["usage"] = usage.model_dump()
    return chunk


def _chunk(request_id: str, obj: str, model: str, choice: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": None,
    }
