"""/v1/chat/completions: render the chat template, generate, shape the answer.

Tools and reasoning: the parsers in effect are the TokenizerManager's (a flag, or
detected from the chat template at launch); `chat_outputs` reads each choice's
text into reasoning_content, content and tool_calls. `tool_choice` "required" or a
named function puts the calls' JSON schema into the sampling params
(`json_schema`), so the grammar backend enforces well-formed calls; under "auto",
`strict: true` tools hold the calls the model starts to their schemas
(`structural_tag`, strict_calls.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sglang.srt.entrypoints.openai.chat_outputs import (
    ChatOutputPlan,
    ChoiceOutputStream,
    call_schema,
    check_tools,
    plan_output,
    strict_calls_tag,
    template_tools,
    tool_mode,
)
from sglang.srt.entrypoints.openai.errors import APIError
from sglang.srt.entrypoints.openai.logprobs import chat_logprobs, output_slices
from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
    ChatLogProbs,
    DeltaMessage,
)
from sglang.srt.entrypoints.openai.serving_base import (
    ChoiceStream,
    OpenAIServingBase,
    Prepared,
    mark_samples,
    new_request_id,
    plan_choices,
)
from sglang.srt.entrypoints.openai.stream_chunks import chat_chunk
from sglang.srt.entrypoints.openai.usage import finish_reason_of
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.parser.chat_template import ChatTemplateError, render_chat

if TYPE_CHECKING:
    from sglang.srt.observability.metrics import ServerMetrics


@dataclass
class ChatPrepared(Prepared):
    plan: ChatOutputPlan = field(default_factory=ChatOutputPlan)
    streams: list[ChoiceOutputStream] = field(default_factory=list)  # per choice


def keeps_call_markers(request: ChatCompletionRequest, tool_call_parser: str | None) -> bool:
    """Whether the decode must keep special tokens for the tool-call parser: a call
    marker may be one (Mistral's `[TOOL_CALLS]`, Llama 3.1's `<|python_tag|>`), which
    skip_special_tokens drops before the parser sees it (the calls came back as content).
    As SGLang and vLLM do, unless the request sets skip_special_tokens itself."""
    return (
        tool_call_parser is not None
        and tool_mode(request) == "auto"
        and request.tools is not None
        and "skip_special_tokens" not in request.model_fields_set
    )


class OpenAIServingChat(OpenAIServingBase):
    response_cls = ChatCompletionResponse
    chunk_cls = ChatCompletionStreamResponse

    def __init__(
        self,
        tokenizer_manager: Any,
        metrics: ServerMetrics | None = None,
        chat_template: str | None = None,
    ) -> None:
        super().__init__(tokenizer_manager, metrics)
        self.chat_template = chat_template

    def prepare(self, request: ChatCompletionRequest) -> ChatPrepared:
        check_tools(request)
        if request.top_logprobs and not request.logprobs:  # as OpenAI and vLLM refuse it
            raise APIError("top_logprobs needs logprobs set to true", param="top_logprobs")
        prompt, input_ids = self._prompt(request)
        max_new_tokens = self._max_new_tokens(request, len(input_ids))
        params = self._choice_params(request, max_new_tokens)
        schema = call_schema(request)
        if schema is not None:
            params = {**params, "json_schema": json.dumps(schema)}
        parser = self.tokenizer_manager.config_value("tool_call_parser")
        tag = strict_calls_tag(request, parser)
        if tag is not None:
            params = {**params, "structural_tag": json.dumps(tag)}
        if keeps_call_markers(request, parser):
            params = {**params, "skip_special_tokens": False}
        request_id = new_request_id("chatcmpl")
        choices = plan_choices(request_id, request.rid, params, 1, request.n)
        plan = self._output_plan(request, prompt, parser)
        objs = [self._generate_input(request, plan, input_ids, p, rid) for _, p, rid in choices]
        mark_samples(objs, request_id, request.rid)
        streams = [ChoiceOutputStream(plan) for _ in objs] if request.stream else []
        return ChatPrepared(
            request_id=request_id, objs=objs, n=request.n, plan=plan, streams=streams
        )

    def prompt_chars(self, request: ChatCompletionRequest) -> int:
        """The messages' characters: prepare renders and tokenizes them."""
        return sum(len(str(m.content or "")) for m in request.messages)

    def _output_plan(
        self, request: ChatCompletionRequest, prompt: str, tool_call_parser: str | None
    ) -> ChatOutputPlan:
        """Read per request: the parsers in effect are this engine's, not the process's."""
        tm = self.tokenizer_manager
        reasoning_parser = tm.config_value("reasoning_parser")
        return plan_output(
            request,
            tool_call_parser,
            reasoning_parser,
            end_is_one_token=tm.reasoning_end_token_id(reasoning_parser) is not None,
            prompt=prompt,
        )

    def _prompt(self, request: ChatCompletionRequest) -> tuple[str, list[int]]:
        """The rendered prompt and its token ids."""
        if self.tokenizer is None:  # the template renders text, which only a tokenizer reads
            raise APIError(
                "chat needs a tokenizer; this server runs without one (--skip-tokenizer-init): "
                "send token ids to /v1/completions or /generate",
                param="messages",
            )
        messages = [m.model_dump(exclude_none=True) for m in request.messages]
        try:
            text = render_chat(
                self.tokenizer,
                messages,
                self.chat_template,
                continue_final_message=request.continue_final_message,
                add_generation_prompt=request.add_generation_prompt,
                tools=template_tools(request),
                extra_kwargs=template_kwargs(request),
            )
        except ChatTemplateError as exc:
            raise APIError(str(exc), param=exc.param, code=exc.code) from exc
        try:
            text = self.tokenizer_manager.text_to_encode(text, "messages")
        except ValueError as exc:
            raise APIError(str(exc), param="messages", code="context_length_exceeded") from None
        return text, self.tokenizer.encode(text, add_special_tokens=False)

    def _max_new_tokens(self, request: ChatCompletionRequest, prompt_len: int) -> int:
        context_len = self.tokenizer_manager.context_len
        asked = request.max_completion_tokens or request.max_tokens
        if self.tokenizer_manager.allow_auto_truncate:
            # the TokenizerManager cuts the prompt and then max_new_tokens to what is left
            return asked if asked is not None else context_len
        if prompt_len >= context_len:  # the wording of the TokenizerManager's checks
            message = (
                f"The input ({prompt_len} tokens) is longer than the model's context length "
                f"({context_len} tokens; at most {context_len - 1} in the prompt)."
            )
            raise APIError(message, param="messages", code="context_length_exceeded")
        if asked is not None and prompt_len + asked > context_len:
            field = "max_completion_tokens" if request.max_completion_tokens else "max_tokens"
            message = (
                f"Requested token count exceeds the model's maximum context length of "
                f"{context_len} tokens: {prompt_len} in the messages plus {asked} {field}."
            )
            raise APIError(message, param="messages", code="context_length_exceeded")
        return asked if asked is not None else context_len - prompt_len

    @staticmethod
    def _generate_input(
        request: ChatCompletionRequest,
        plan: ChatOutputPlan,
        input_ids: list[int],
        params: dict[str, Any],
        rid: str,
    ) -> GenerateReqInput:
        return GenerateReqInput(
            input_ids=list(input_ids),
            sampling_params=params,
            rid=rid,
            stream=True,
            return_logprob=request.logprobs,
            top_logprobs_num=(request.top_logprobs or 0) if request.logprobs else 0,
            return_text_in_logprobs=True,
            require_reasoning=plan.grammar_after_reasoning,
        )

    def _choice(
        self, request: ChatCompletionRequest, prepared: ChatPrepared, index: int, output: dict
    ) -> ChatCompletionChoice:
        meta = output["meta_info"]
        finish_reason, matched = finish_reason_of(meta)
        message = prepared.plan.parse_final(output["text"])
        if message.tool_calls and _calls_ended(request, prepared, finish_reason, matched):
            finish_reason, matched = "tool_calls", None
        return ChatCompletionChoice(
            index=index,
            message=message,
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

    def _delta_chunks(
        self,
        request: ChatCompletionRequest,
        prepared: ChatPrepared,
        index: int,
        state: ChoiceStream,
        output: dict[str, Any],
    ) -> Iterator[dict[str, Any]]:
        rid, model = prepared.request_id, request.model
        if not state.started:
            state.started = True
            yield chat_chunk(rid, model, index, DeltaMessage(role="assistant", content=""))
        meta = output["meta_info"]
        stream = prepared.streams[index]
        deltas = stream.feed(state.take_text(output["text"]))
        finish_reason, matched = finish_reason_of(meta)
        if finish_reason is not None:
            deltas += stream.finish()
        logprobs = self._logprobs(request, meta, state.take_logprob_start(meta))
        if logprobs is not None and logprobs.content and not deltas:
            deltas = [DeltaMessage(content="")]
        for i, delta in enumerate(deltas):
            yield chat_chunk(rid, model, index, delta, logprobs if i == 0 else None)
        if finish_reason is not None:
            if stream.made_calls and _calls_ended(request, prepared, finish_reason, matched):
                finish_reason, matched = "tool_calls", None
            yield chat_chunk(rid, model, index, DeltaMessage(), None, finish_reason, matched)


def _calls_ended(
    request: ChatCompletionRequest, prepared: ChatPrepared, finish_reason: str | None, matched: Any
) -> bool:
    """Whether a choice that made calls stopped as a `"tool_calls"` finish. Forced calls
    (`"required"`, named) end where their grammar ends; a stop string or stop token id of
    the request's cut them short, the last call's arguments unfinished: that stays a
    `"stop"` naming the match, as a `max_tokens` cut stays `"length"`."""
    if finish_reason != "stop":
        return False
    if prepared.plan.tool_mode != "constrained":
        return True
    return not isinstance(matched, str) and matched not in (request.stop_token_ids or ())


def template_kwargs(request: ChatCompletionRequest) -> dict[str, Any] | None:
    """chat_template_kwargs, with reasoning_effort as a template variable where the
    request sets it and the kwargs do not."""
    if request.reasoning_effort is None:
        return request.chat_template_kwargs
    return {"reasoning_effort": request.reasoning_effort, **(request.chat_template_kwargs or {})}
