"""/v1/chat/completions: render the chat template, generate, shape the answer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from sglang.srt.entrypoints.openai.errors import APIError
from sglang.srt.entrypoints.openai.fanout import ChoiceFanout
from sglang.srt.entrypoints.openai.logprobs import chat_logprobs, output_slices
from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    ChatLogProbs,
    ChatMessageOut,
    DeltaMessage,
)
from sglang.srt.entrypoints.openai.sampling import (
    check_min_le_max,
    check_vocab_ids,
    for_choice,
    sampling_params,
)
from sglang.srt.entrypoints.openai.serving_base import (
    ChoiceStream,
    OpenAIServingBase,
    Prepared,
    StreamUsage,
    choice_rids,
    new_request_id,
)
from sglang.srt.entrypoints.openai.usage import finish_reason_of, usage_of
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.parser.chat_template import ChatTemplateError, render_chat

if TYPE_CHECKING:
    from sglang.srt.observability.metrics import ServerMetrics


class OpenAIServingChat(OpenAIServingBase):
    def __init__(
        self,
        tokenizer_manager: Any,
        metrics: ServerMetrics | None = None,
        chat_template: str | None = None,
    ) -> None:
        super().__init__(tokenizer_manager, metrics)
        self.chat_template = chat_template

    def prepare(self, request: ChatCompletionRequest) -> Prepared:
        input_ids = self._prompt_ids(request)
        max_new_tokens = self._max_new_tokens(request, len(input_ids))
        check_min_le_max(request, max_new_tokens)
        check_vocab_ids(request, getattr(self.tokenizer_manager.model_config, "vocab_size", None))
        params = sampling_params(request, max_new_tokens)
        request_id = new_request_id("chatcmpl")
        rids = choice_rids(request_id, request.rid, request.n)
        objs = [self._generate_input(request, input_ids, for_choice(params, j), rid)
                for j, rid in enumerate(rids)]  # fmt: skip
        return Prepared(request_id=request_id, objs=objs, n=request.n)

    def _prompt_ids(self, request: ChatCompletionRequest) -> list[int]:
        messages = [m.model_dump(exclude_none=True) for m in request.messages]
        try:
            text = render_chat(
                self.tokenizer,
                messages,
                self.chat_template,
                continue_final_message=request.continue_final_message,
                tools=request.tools,
                extra_kwargs=request.chat_template_kwargs,
            )
        except ChatTemplateError as exc:
            raise APIError(str(exc), param="messages") from exc
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _max_new_tokens(self, request: ChatCompletionRequest, prompt_len: int) -> int:
        context_len = self.tokenizer_manager.context_len
        asked = request.max_completion_tokens or request.max_tokens
        if prompt_len >= context_len or (asked is not None and prompt_len + asked > context_len):
            raise APIError(
                f"This model's maximum context length is {context_len} tokens; the messages "
                f"have {prompt_len} tokens and {asked or 0} more were requested.",
                param="messages",
                code="context_length_exceeded",
            )
        return asked if asked is not None else context_len - prompt_len

    @staticmethod
    def _generate_input(
        request: ChatCompletionRequest, input_ids: list[int], params: dict[str, Any], rid: str
    ) -> GenerateReqInput:
        return GenerateReqInput(
            input_ids=list(input_ids),
            sampling_params=params,
            rid=rid,
            stream=True,
            return_logprob=request.logprobs,
            top_logprobs_num=(request.top_logprobs or 0) if request.logprobs else 0,
            return_text_in_logprobs=True,
        )

    def build_response(
        self, request: ChatCompletionRequest, prepared: Prepared, outputs: list[dict[str, Any]]
    ) -> ChatCompletionResponse:
        choices = [self._choice(request, i, out) for i, out in enumerate(outputs)]
        return ChatCompletionResponse(
            id=prepared.request_id,
            model=request.model,
            choices=choices,
            usage=usage_of([out["meta_info"] for out in outputs], prepared.n),
        )

    def _choice(
        self, request: ChatCompletionRequest, index: int, output: dict[str, Any]
    ) -> ChatCompletionChoice:
        meta = output["meta_info"]
        finish_reason, matched = finish_reason_of(meta)
        return ChatCompletionChoice(
            index=index,
            message=ChatMessageOut(content=output["text"]),
            logprobs=self._logprobs(request, meta, 0),
            finish_reason=finish_reason,
            matched_stop=matched,
        )

    def _logprobs(
        self, request: ChatCompletionRequest, meta: dict[str, Any], start: int
    ) -> ChatLogProbs | None:
        if not request.logprobs:
            return None
        tokens, tops = output_slices(meta, start)
        return chat_logprobs(tokens, tops if request.top_logprobs else None, self.tokenizer)

    async def stream_chunks(
        self, request: ChatCompletionRequest, prepared: Prepared, fanout: ChoiceFanout
    ) -> AsyncIterator[ChatCompletionStreamResponse]:
        states = [ChoiceStream() for _ in prepared.objs]
        usage = StreamUsage(request, prepared)
        async for event in fanout.events():
            state = states[event.index]
            usage.note(event.index, event.output["meta_info"])
            if not state.started:
                state.started = True
                role = DeltaMessage(role="assistant", content="")
                yield usage.stamp(self._chunk(prepared, request, event.index, role))
            for chunk in self._delta_chunks(request, prepared, event.index, state, event.output):
                yield usage.stamp(chunk)
        if usage.final:
            yield ChatCompletionStreamResponse(
                id=prepared.request_id, model=request.model, choices=[], usage=usage.usage()
            )

    def _delta_chunks(
        self,
        request: ChatCompletionRequest,
        prepared: Prepared,
        index: int,
        state: ChoiceStream,
        output: dict[str, Any],
    ) -> Iterator[ChatCompletionStreamResponse]:
        meta = output["meta_info"]
        delta = state.take_text(output["text"])
        logprobs = self._logprobs(request, meta, state.take_logprob_start(meta))
        if delta or (logprobs is not None and logprobs.content):
            yield self._chunk(prepared, request, index, DeltaMessage(content=delta), logprobs)
        finish_reason, matched = finish_reason_of(meta)
        if finish_reason is not None:
            chunk = self._chunk(prepared, request, index, DeltaMessage())
            chunk.choices[0].finish_reason = finish_reason
            chunk.choices[0].matched_stop = matched
            yield chunk

    @staticmethod
    def _chunk(
        prepared: Prepared,
        request: ChatCompletionRequest,
        index: int,
        delta: DeltaMessage,
        logprobs: ChatLogProbs | None = None,
    ) -> ChatCompletionStreamResponse:
        choice = ChatCompletionStreamChoice(index=index, delta=delta, logprobs=logprobs)
        return ChatCompletionStreamResponse(
            id=prepared.request_id, model=request.model, choices=[choice]
        )
