"""/generate: SGLang's native request and response shape.

A single prompt with n = 1 answers `{"text", "output_ids", "meta_info"}`; a list
of prompts or n > 1 answers a list of those (prompt-major). Streaming sends the
cumulative output of each choice as an SSE event (with `"index"` when there are
several) and ends with `data: [DONE]`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Union

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import ConfigDict

from sglang.srt.entrypoints.openai.errors import APIError
from sglang.srt.entrypoints.openai.fanout import ChoiceFanout, ClientDisconnected
from sglang.srt.entrypoints.openai.protocol import UnsupportedSGLangFields
from sglang.srt.entrypoints.openai.serving_base import (
    CLIENT_CLOSED_STATUS,
    check_dp_routing,
    check_request_size,
    mark_samples,
    new_request_id,
    open_stream,
    param_errors_as_400,
    plan_choices,
    prompt_fields,
)
from sglang.srt.entrypoints.per_prompt import (
    check_prompt_count,
    check_same_n,
    option_per_prompt,
    params_per_prompt,
    sample_rids,
)
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.sampling.param_types import (
    Flag,
    LogprobStartLen,
    LogprobTokenIds,
    NonNegInt,
    NullTakesTheDefault,
    RequestId,
    TopLogprobsNum,
    strict,
)
from sglang.srt.sampling.sampling_params import SamplingParamsSpec

if TYPE_CHECKING:
    from sglang.srt.observability.metrics import ServerMetrics


class GenerateRequest(NullTakesTheDefault, UnsupportedSGLangFields):
    """The body of `/generate`; `sampling_params` is the shared native definition."""

    model_config = ConfigDict(extra="forbid")
    text: Union[strict(str), list[strict(str)], None] = None
    input_ids: Union[list[NonNegInt], list[list[NonNegInt]], None] = None
    # one dict for every prompt, or one per prompt (a batch), as SGLang's /generate
    sampling_params: Union[SamplingParamsSpec, list[SamplingParamsSpec], None] = None
    # these, as SGLang's: one value for every prompt, or a list with one per prompt
    rid: Union[RequestId, list[RequestId], None] = None
    return_logprob: Union[Flag, list[Flag]] = False
    top_logprobs_num: Union[TopLogprobsNum, list[TopLogprobsNum]] = 0
    logprob_start_len: Union[LogprobStartLen, list[LogprobStartLen]] = -1
    # ids, so a list of lists for one per prompt
    token_ids_logprob: Union[LogprobTokenIds, list[LogprobTokenIds], None] = None
    stream: Flag = False
    return_text_in_logprobs: Flag = False
    # SGLang's: the constraint applies after the reasoning (--reasoning-parser)
    require_reasoning: Flag = False

    def check_fields(self) -> None:
        """The rules across fields, as 400s naming the field (a model validator's
        errors carry no field)."""
        if (self.text is None) == (self.input_ids is None):
            raise APIError("give exactly one of text and input_ids", param="text",
                           code="invalid_value")  # fmt: skip
        if isinstance(self.sampling_params, list):
            with param_errors_as_400():
                check_same_n([p.n for p in self.sampling_params])

    def prompts(self) -> list[str | list[int]]:
        if isinstance(self.text, str):
            return [self.text]
        if self.text is not None:
            return list(self.text)
        if self.input_ids and isinstance(self.input_ids[0], list):
            return list(self.input_ids)
        return [list(self.input_ids)]

    def is_batch(self) -> bool:
        single = isinstance(self.text, str) or (
            self.input_ids is not None
            and not (self.input_ids and isinstance(self.input_ids[0], list))
        )
        return not single or self.num_samples() > 1

    def num_samples(self) -> int:
        params = self.sampling_params
        if isinstance(params, list):
            return params[0].n if params else 1
        return params.n if params is not None else 1

    def item_param(self, path: str, prompt_index: int) -> str:
        """A runtime error's field `path` for prompt `prompt_index`, indexed where the
        request gave that field per prompt (`sampling_params.1.regex`, `text.1`), as the
        field checks name a list's element; a field given once keeps its name."""
        head, _, rest = path.partition(".")
        if head in ("text", "input_ids", "sampling_params", *PER_PROMPT_OPTIONS):
            value = getattr(self, head)
            nested = head in ("input_ids", "token_ids_logprob")  # a list of lists per prompt
            per_prompt = isinstance(value, list) and (
                not nested or (bool(value) and isinstance(value[0], list))
            )
            if per_prompt:
                return ".".join(filter(None, (head, str(prompt_index), rest)))
        return path

    def params_dicts(self, num_prompts: int) -> list[dict[str, Any]]:
        """Each prompt's sampling fields as the client set them, without `n` (fanned
        out here)."""
        with param_errors_as_400():
            return [_set_fields(p) for p in params_per_prompt(self.sampling_params, num_prompts)]

    def options_per_prompt(self, num_prompts: int) -> list[dict[str, Any]]:
        """Each prompt's logprob options (PER_PROMPT_OPTIONS), from one value or a list."""
        columns = {}
        for name in PER_PROMPT_OPTIONS:
            with param_errors_as_400():
                columns[name] = option_per_prompt(name, getattr(self, name), num_prompts)
        return [{name: values[i] for name, values in columns.items()} for i in range(num_prompts)]


PER_PROMPT_OPTIONS = ("return_logprob", "top_logprobs_num", "logprob_start_len", "token_ids_logprob")


def _set_fields(params: SamplingParamsSpec | None) -> dict[str, Any]:
    if params is None:
        return {}
    fields = params.model_dump(exclude_unset=True)
    fields.pop("n", None)
    return fields


def build_inputs(request: GenerateRequest) -> list[GenerateReqInput]:
    request.check_fields()
    prompts, n = request.prompts(), request.num_samples()
    prompt_param = "text" if request.text is not None else "input_ids"
    with param_errors_as_400():
        check_prompt_count(len(prompts), prompt_param)
    request_id = new_request_id("gen")
    one_rid = None if isinstance(request.rid, list) else request.rid
    choices = plan_choices(
        request_id, one_rid, request.params_dicts(len(prompts)), len(prompts), n, prompt_param
    )
    options = request.options_per_prompt(len(prompts))
    objs = [_one_input(request, prompts[i], p, rid, options[i]) for i, p, rid in choices]
    if one_rid is not None or request.rid is None:
        return mark_samples(objs, request_id, one_rid)
    try:  # a rid per prompt: `<rid>-<k>` for its samples when n > 1
        named = sample_rids(request.rid, [n] * len(prompts))
    except ValueError as exc:
        raise APIError(str(exc), param="rid", code="invalid_value") from None
    for obj, (rid, parent) in zip(objs, named):
        obj.rid, obj.parent_rid = rid, parent
    return objs


def _one_input(
    request: GenerateRequest,
    prompt: str | list[int],
    params: dict[str, Any],
    rid: str,
    options: dict[str, Any],
) -> GenerateReqInput:
    return GenerateReqInput(
        **prompt_fields(prompt),
        sampling_params=params,
        rid=rid,
        stream=True,
        return_text_in_logprobs=request.return_text_in_logprobs,
        require_reasoning=request.require_reasoning,
        **options,
    )


class NativeServing:
    def __init__(self, tokenizer_manager: Any, metrics: ServerMetrics | None = None) -> None:
        self.tokenizer_manager = tokenizer_manager
        self.metrics = metrics

    async def handle(self, request: GenerateRequest, raw_request: Request | None) -> Response:
        check_dp_routing(self.tokenizer_manager, request)
        objs = build_inputs(request)
        n = request.num_samples()
        prompt_param = "text" if request.text is not None else "input_ids"
        check_request_size(self.tokenizer_manager, len(objs) // n, n, prompt_param)
        fanout = ChoiceFanout(
            self.tokenizer_manager, objs, self.metrics, raw_request,
            choice_param=lambda path, index: request.item_param(path, index // n),
        )  # fmt: skip
        try:
            if request.stream:
                return await open_stream(fanout, _native_chunks(fanout, request.is_batch()))
            async with fanout:
                outputs = await fanout.collect()
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED_STATUS)
        return JSONResponse(outputs if request.is_batch() else outputs[0])


async def _native_chunks(fanout: ChoiceFanout, is_batch: bool) -> AsyncIterator[dict[str, Any]]:
    async for event in fanout.events():
        yield dict(event.output, index=event.index) if is_batch else event.output
