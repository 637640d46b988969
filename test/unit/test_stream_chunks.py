"""Streamed chunks built as dicts serialize exactly as the protocol models they stand for."""

from __future__ import annotations

import orjson
import pytest

from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    ChatLogProbs,
    ChatTokenLogprob,
    CompletionLogProbs,
    CompletionStreamChoice,
    CompletionStreamResponse,
    DeltaMessage,
    FunctionCall,
    PromptTokensDetails,
    ToolCall,
    TopLogprob,
    UsageInfo,
)
from sglang.srt.entrypoints.openai.stream_chunks import chat_chunk, completion_chunk, stamp_usage


def same_json(built: dict, model) -> None:
    """Same bytes on the wire (key order included), `created` aside."""
    expected = model.model_dump()
    assert abs(built["created"] - expected["created"]) <= 1
    built = {**built, "created": expected["created"]}
    assert orjson.dumps(built) == orjson.dumps(expected)


COMPLETION_LOGPROBS = CompletionLogProbs(
    text_offset=[0], token_logprobs=[-0.5], tokens=[" a"], top_logprobs=[{" a": -0.5}]
)


@pytest.mark.parametrize(
    "kw",
    [
        {"text": " hello"},
        {"text": "", "finish_reason": "length"},
        {"text": "x", "finish_reason": "stop", "matched_stop": "END"},
        {"text": "x", "finish_reason": "stop", "matched_stop": 2},
        {"text": " a", "logprobs": COMPLETION_LOGPROBS},
    ],
)
def test_completion_chunk_is_the_models_dump(kw):
    model = CompletionStreamResponse(
        id="cmpl-1", model="m", choices=[CompletionStreamChoice(index=3, **kw)]
    )
    built = completion_chunk(
        "cmpl-1", "m", 3, kw["text"], kw.get("logprobs"), kw.get("finish_reason"),
        kw.get("matched_stop"),
    )  # fmt: skip
    same_json(built, model)


CHAT_LOGPROBS = ChatLogProbs(
    content=[
        ChatTokenLogprob(
            token="a", logprob=-0.1, bytes=[97], top_logprobs=[TopLogprob(token="a", logprob=-0.1)]
        )
    ]
)


@pytest.mark.parametrize(
    "delta, logprobs, finish_reason, matched_stop",
    [
        (DeltaMessage(role="assistant", content=""), None, None, None),
        (DeltaMessage(content=" hi"), None, None, None),
        (DeltaMessage(content=" hi"), CHAT_LOGPROBS, None, None),
        (DeltaMessage(), None, "stop", "</s>"),
        (DeltaMessage(reasoning_content="think"), None, None, None),
        (
            DeltaMessage(
                tool_calls=[
                    ToolCall(index=0, id="call_1", type="function",
                             function=FunctionCall(name="f", arguments=""))  # fmt: skip
                ]
            ),
            None,
            None,
            None,
        ),
        (
            DeltaMessage(tool_calls=[ToolCall(index=0, function=FunctionCall(arguments='{"a'))]),
            None,
            None,
            None,
        ),
        (DeltaMessage(), None, "tool_calls", None),
    ],
)
def test_chat_chunk_is_the_models_dump(delta, logprobs, finish_reason, matched_stop):
    choice = ChatCompletionStreamChoice(
        index=1, delta=delta, logprobs=logprobs, finish_reason=finish_reason,
        matched_stop=matched_stop,
    )  # fmt: skip
    model = ChatCompletionStreamResponse(id="chatcmpl-1", model="m", choices=[choice])
    built = chat_chunk("chatcmpl-1", "m", 1, delta, logprobs, finish_reason, matched_stop)
    same_json(built, model)


def test_stamped_usage_is_the_models_dump():
    usage = UsageInfo(
        prompt_tokens=3, completion_tokens=2, total_tokens=5,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=1),
    )  # fmt: skip
    model = CompletionStreamResponse(
        id="cmpl-1", model="m", choices=[CompletionStreamChoice(index=0, text="x")], usage=usage
    )
    same_json(stamp_usage(completion_chunk("cmpl-1", "m", 0, "x"), usage), model)
