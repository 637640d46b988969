"""/v1/completions: prompts as text or token ids, echo, legacy logprobs.

With `echo` and `logprobs`, the prompt's own logprobs come first (the first
token's is None): the shape lm-evaluation-harness reads for loglikelihood, also
with `max_tokens` 0.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from sglang.srt.entrypoints.openai.errors import APIError
from sglang.srt.entrypoints.openai.logprobs import (
    TextOffsets,
    completion_logprobs,
    merge_completion_logprobs,
    output_slices,
)
from sglang.srt.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamResponse,
)
from sglang.srt.entrypoints.openai.serving_base import (
    ChoiceStream,
    OpenAIServingBase,
    Prepared,
    mark_samples,
    new_request_id,
    plan_choices,
    prompt_fields,
)
from sglang.srt.entrypoints.openai.stream_chunks import completion_chunk
from sglang.srt.entrypoints.openai.usage import finish_reason_of
from sglang.srt.managers.detokenizer_manager import drops_first_space, silent_token_ids
from sglang.srt.managers.io_struct import GenerateReqInput

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy completions API

Prompt = str | list[int]


def split_prompts(prompt: Any) -> list[Prompt]:
    """A string, a list of strings, a list of ids or a list of id lists -> prompts."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise APIError("prompt must not be empty", param="prompt", code="invalid_value")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    if any(isinstance(p, list) and not p for p in prompt):
        raise APIError(
            "a token-id prompt must not be empty", param="prompt", code="invalid_value"
        )
    return list(prompt)


class OpenAIServingCompletion(OpenAIServingBase):
    response_cls = CompletionResponse
    chunk_cls = CompletionStreamResponse

    def prepare(self, request: CompletionRequest) -> Prepared:
        self._reject_unsupported(request)
        prompts = split_prompts(request.prompt)
        self._check_token_ids(prompts)
        max_new_tokens = DEFAULT_MAX_TOKENS if request.max_tokens is None else request.max_tokens
        params = self._choice_params(request, max_new_tokens)  # checked with the default
        if request.max_tokens is None:  # the default: cut to the room, never refused
            del params["max_new_tokens"]
        request_id = new_request_id("cmpl")
        choices = plan_choices(request_id, request.rid, params, len(prompts), request.n)
        objs = [self._generate_input(request, prompts[i], p, rid) for i, p, rid in choices]
        mark_samples(objs, request_id, request.rid)
        echo_texts = [self._prompt_text(p) for p in prompts] if request.echo else []
        return Prepared(request_id=request_id, objs=objs, n=request.n, echo_texts=echo_texts)

    @staticmethod
    def _reject_unsupported(request: CompletionRequest) -> None:
        if request.suffix:
            raise APIError("suffix is not supported", param="suffix", code="unsupported")
        if request.best_of is not None and request.best_of != request.n:
            raise APIError(
                "best_of other than n is not supported", param="best_of", code="unsupported"
            )

    def _check_token_ids(self, prompts: list[Prompt]) -> None:
        vocab_size = self._vocab_size()
        for prompt in prompts:
            if isinstance(prompt, list) and vocab_size is not None:
                if any(not 0 <= t < vocab_size for t in prompt):
                    raise APIError(f"prompt token ids must be in [0, {vocab_size})",
                                   param="prompt", code="invalid_value")  # fmt: skip

    def _prompt_text(self, prompt: Prompt) -> str:
        if isinstance(prompt, str):
            return prompt
        if self.tokenizer is None:  # a 500 before
            raise APIError("echo needs a tokenizer to decode the prompt's token ids (the "
                           "server runs with --skip-tokenizer-init)", param="echo")  # fmt: skip
        return self.tokenizer.decode(prompt)

    def _generate_input(
        self, request: CompletionRequest, prompt: Prompt, params: dict[str, Any], rid: str
    ) -> GenerateReqInput:
        want_logprobs = request.logprobs is not None
        return GenerateReqInput(
            **prompt_fields(prompt),
            sampling_params=params,
            rid=rid,
            stream=True,
            default_max_new_tokens=DEFAULT_MAX_TOKENS,
            return_logprob=want_logprobs,
            top_logprobs_num=request.logprobs or 0,
            logprob_start_len=0 if (want_logprobs and request.echo) else -1,
            # token texts: without a tokenizer (--skip-tokenizer-init) there are none
            return_text_in_logprobs=want_logprobs and self.tokenizer is not None,
        )

    def _echo(self, prepared: Prepared, index: int) -> str:
        return prepared.echo_texts[index // prepared.n] if prepared.echo_texts else ""

    def _choice(
        self, request: CompletionRequest, prepared: Prepared, index: int, output: dict[str, Any]
    ) -> CompletionChoice:
        meta = output["meta_info"]
        echo = self._echo(prepared, index)
        finish_reason, matched = finish_reason_of(meta)
        logprobs = None
        if request.logprobs is not None:
            logprobs = self._prompt_logprobs(request, prepared.objs[index], meta)
            tokens, tops = output_slices(meta, 0)
            offsets = self._text_offsets(request, len(echo))
            merge_completion_logprobs(logprobs, self._logprobs(request, tokens, tops, offsets))
        return CompletionChoice(
            index=index,
            text=echo + output["text"],
            logprobs=logprobs,
            finish_reason=finish_reason,
            matched_stop=matched,
            token_ids=list(output["output_ids"]) if self.tokenizer is None else None,
        )

    def _logprobs(
        self,
        request: CompletionRequest,
        tokens: list,
        tops: list | None,
        offsets: TextOffsets | int,
    ) -> CompletionLogProbs:
        return completion_logprobs(
            tokens, tops if request.logprobs else None, self.tokenizer, offsets
        )

    def _text_offsets(
        self,
        request: CompletionRequest,
        start: int,
        is_output: bool = True,
        num_silent_first: int = 0,
    ) -> TextOffsets:
        """text_offset from `start`: a SentencePiece decode's dropped first space takes no
        room, and in the output neither do the special tokens its text skips (the echoed
        prompt keeps their text), nor the first `num_silent_first` tokens."""
        if self.tokenizer is None:
            return TextOffsets(start)
        silent, drops_space = self._decode_traits
        skipped = silent if is_output and request.skip_special_tokens else ()
        return TextOffsets(start, skipped, drops_space, num_silent_first)

    @functools.cached_property
    def _decode_traits(self) -> tuple[frozenset[int], bool]:
        """(the special tokens a skip_special_tokens decode leaves out, whether it drops a
        SentencePiece text's first space): read from the tokenizer once."""
        return silent_token_ids(self.tokenizer), drops_first_space(self.tokenizer)

    def _prompt_logprobs(
        self, request: CompletionRequest, obj: GenerateReqInput, meta: dict[str, Any]
    ) -> CompletionLogProbs:
        """The echoed prompt's logprobs. A text prompt is echoed as sent: the special
        tokens its tokenizer adds in front (a BOS) have no text in it; a token-id
        prompt is echoed decoded, theirs included."""
        if not request.echo:
            return CompletionLogProbs()
        tokens = meta.get("input_token_logprobs") or []
        silent = self._num_added_in_front if obj.text is not None else 0
        offsets = self._text_offsets(request, 0, is_output=False, num_silent_first=silent)
        return self._logprobs(request, tokens, meta.get("input_top_logprobs"), offsets)

    @functools.cached_property
    def _num_added_in_front(self) -> int:
        """How many special tokens the tokenizer puts before a text's own (its BOS)."""
        bare = self.tokenizer.encode("a", add_special_tokens=False)
        full = self.tokenizer.encode("a")
        starts = [k for k in range(len(full) - len(bare) + 1) if full[k : k + len(bare)] == bare]
        return starts[0] if starts else 0

    def _delta_chunks(
        self,
        request: CompletionRequest,
        prepared: Prepared,
        index: int,
        state: ChoiceStream,
        output: dict[str, Any],
    ) -> Iterator[dict[str, Any]]:
        meta = output["meta_info"]
        echo = "" if state.started else self._echo(prepared, index)
        logprobs = self._stream_logprobs(request, prepared.objs[index], meta, state, len(echo))
        text = echo + state.take_text(output["text"])
        new_ids = state.take_ids(output["output_ids"]) if self.tokenizer is None else None
        first, state.started = not state.started, True
        finish_reason, matched = finish_reason_of(meta)
        if not (text or new_ids or first or finish_reason or (logprobs and logprobs.tokens)):
            return
        yield completion_chunk(prepared.request_id, request.model, index, text, logprobs,
                               finish_reason, matched, new_ids)  # fmt: skip

    def _stream_logprobs(
        self,
        request: CompletionRequest,
        obj: GenerateReqInput,
        meta: dict[str, Any],
        state: ChoiceStream,
        echo_len: int,
    ) -> CompletionLogProbs | None:
        """This chunk's logprobs; text_offset counts from the start of the choice's text
        (the echoed prompt, then every token sent before), as without streaming."""
        if request.logprobs is None:
            return None
        if state.started:
            logprobs = CompletionLogProbs()
        else:
            logprobs = self._prompt_logprobs(request, obj, meta)
            state.logprob_offsets = self._text_offsets(request, echo_len)
        tokens, tops = output_slices(meta, state.take_logprob_start(meta))
        merge_completion_logprobs(
            logprobs, self._logprobs(request, tokens, tops, state.logprob_offsets)
        )
        return logprobs
