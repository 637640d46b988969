"""The request flow shared by the OpenAI routes.

validate -> build one `GenerateReqInput` per choice -> fan out -> either collect
the final outputs into one JSON response, or prime the stream (so a rejected
prompt is still a plain 400) and answer Server-Sent Events ending in `[DONE]`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel

from sglang.srt.entrypoints.openai.errors import APIError
from sglang.srt.entrypoints.openai.fanout import ChoiceFanout, ClientDisconnected, to_api_error
from sglang.srt.entrypoints.openai.protocol import (
    SamplingFields,
    UnsupportedSGLangFields,
    UsageInfo,
)
from sglang.srt.entrypoints.openai.sampling import (
    check_choice_params,
    for_choice,
    openai_param,
    sampling_params,
)
from sglang.srt.entrypoints.openai.stream_chunks import stamp_usage
from sglang.srt.entrypoints.openai.usage import usage_of
from sglang.srt.managers.tokenizer_manager import INLINE_TOKENIZE_CHARS
from sglang.srt.sampling.param_types import InvalidParamError

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.observability.metrics import ServerMetrics

logger = logging.getLogger(__name__)

SSE_DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy buffering
CLIENT_CLOSED_STATUS = 499  # nginx's "client closed request"; nobody reads it
MODEL_ALIASES = ("default",)
# prompts x n of one HTTP request: each is a concurrent generation (docs/api.md "Limits")
MAX_CHOICES_PER_REQUEST = 1024
# inputs of one /v1/embeddings (OpenAI's limit) or /v1/tokenize, /v1/detokenize request
MAX_INPUTS_PER_REQUEST = 2048


def sse_event(payload: BaseModel | dict[str, Any]) -> bytes:
    if isinstance(payload, BaseModel):
        payload = payload.model_dump(exclude_none=False)
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def check_input_count(count: int, param: str) -> None:
    """400 naming `param` when a request carries more than MAX_INPUTS_PER_REQUEST inputs."""
    if count > MAX_INPUTS_PER_REQUEST:
        raise APIError(
            f"{count} inputs; one request may carry at most {MAX_INPUTS_PER_REQUEST}",
            param=param,
            code="invalid_value",
        )


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def choice_rids(request_id: str, user_rid: str | None, num_choices: int) -> list[str]:
    """The TokenizerManager rid of each choice. One choice runs under the caller's rid,
    else the response's id, so abort_request with the `id` a client saw reaches it (as
    in SGLang); several are `<rid>-<k>` under that parent (mark_samples)."""
    base = user_rid or request_id
    if num_choices == 1:
        return [base]
    return [f"{base}-{i}" for i in range(num_choices)]


def mark_samples(objs: list[Any], request_id: str, user_rid: str | None) -> list[Any]:
    """`objs`, the choices of one request: when there are several, each names the
    caller's rid (else the request id) as its parent, which abort_request reaches."""
    if len(objs) > 1:
        for obj in objs:
            obj.parent_rid = user_rid or request_id
    return objs


def plan_choices(
    request_id: str,
    user_rid: str | None,
    params: dict[str, Any] | list[dict[str, Any]],
    num_prompts: int,
    n: int,
    prompt_param: str = "prompt",
) -> list[tuple[int, dict[str, Any], str]]:
    """(prompt index, sampling dict, rid) of each choice: choice k is sample k % n of
    prompt k // n, and sample j of a seeded request samples with seed + j. `params`:
    one dict for every prompt, or one per prompt."""
    if num_prompts * n > MAX_CHOICES_PER_REQUEST:
        raise APIError(
            f"{num_prompts} prompts x n={n} is {num_prompts * n} generations; one request "
            f"may ask for at most {MAX_CHOICES_PER_REQUEST} (send several requests)",
            param="n" if num_prompts == 1 else prompt_param,
            code="invalid_value",
        )
    rids = choice_rids(request_id, user_rid, num_prompts * n)
    per_prompt = params if isinstance(params, list) else [params] * num_prompts
    return [(k // n, for_choice(per_prompt[k // n], k % n), rid) for k, rid in enumerate(rids)]


def check_model_name(tokenizer_manager: Any, model: str) -> None:
    """404 unless `model` is the served model's name (or an alias of it)."""
    served = tokenizer_manager.served_model_name
    if model != served and model not in MODEL_ALIASES:
        raise APIError(
            f"The model `{model}` does not exist (this server serves `{served}`).",
            404,
            param="model",
            code="model_not_found",
        )


@contextmanager
def param_errors_as_400(code: str = "invalid_value") -> Iterator[None]:
    """A shared check's InvalidParamError as a 400 naming its field, with `code`."""
    try:
        yield
    except InvalidParamError as exc:
        raise APIError(str(exc), param=exc.param, code=code) from None


def check_dp_routing(tokenizer_manager: Any, request: UnsupportedSGLangFields) -> None:
    """A 400 naming SGLang's DP-rank routing field where the request sets one this
    server cannot honour (UnsupportedSGLangFields.check_dp_routing)."""
    with param_errors_as_400("unsupported"):
        request.check_dp_routing(getattr(tokenizer_manager, "num_dp_ranks", 1))


def check_request_size(tokenizer_manager: Any, num_prompts: int, n: int, prompt_param: str) -> None:
    """A 400 for a request of more generations than the server holds at once
    (TokenizerManager.check_request_size), before any of them is queued."""
    with param_errors_as_400():
        tokenizer_manager.check_request_size(num_prompts, n, prompt_param)


def prompt_fields(prompt: str | list[int]) -> dict[str, Any]:
    """A text or token-id prompt as GenerateReqInput's `text` or `input_ids`."""
    return {"text": prompt} if isinstance(prompt, str) else {"input_ids": prompt}


async def open_stream(
    fanout: ChoiceFanout, chunks: AsyncIterator[BaseModel | dict[str, Any]]
) -> StreamingResponse:
    """Start the fanout, wait for every choice's first output, then stream `chunks`.

    Errors before the first output (a rejected prompt) raise here, as a plain HTTP
    error; later ones become an SSE error event. The fanout is closed either way.
    """
    await fanout.__aenter__()
    try:
        await fanout.prime()
    except BaseException:
        fanout.close()
        raise
    return StreamingResponse(
        _sse(fanout, chunks), media_type="text/event-stream", headers=SSE_HEADERS
    )


async def _sse(
    fanout: ChoiceFanout, chunks: AsyncIterator[BaseModel | dict[str, Any]]
) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            yield sse_event(chunk)
    except ClientDisconnected:
        return
    except APIError as exc:
        yield exc.sse_bytes()
    except Exception as exc:  # a bug shaping chunks: the client still gets an error event
        logger.exception("a stream failed while its chunks were made")
        yield to_api_error(exc).sse_bytes()
    finally:
        fanout.close()
    yield SSE_DONE


@dataclass
class Prepared:
    """What a route built from the request before anything is queued."""

    request_id: str
    objs: list[GenerateReqInput]
    n: int  # samples per prompt; choice k is sample k % n of prompt k // n
    echo_texts: list[str] = field(default_factory=list)  # per prompt, when echoing
    # every chunk of a stream carries the same timestamp (OpenAI's reference)
    created: int = field(default_factory=lambda: int(time.time()))


class OpenAIServingBase(ABC):
    def __init__(self, tokenizer_manager: Any, metrics: ServerMetrics | None = None) -> None:
        self.tokenizer_manager = tokenizer_manager
        self.metrics = metrics

    @property
    def tokenizer(self) -> Any:
        return self.tokenizer_manager.tokenizer

    async def handle(self, request: SamplingFields, raw_request: Request | None) -> Response:
        self.check_model(request.model)
        check_dp_routing(self.tokenizer_manager, request)
        if self.prompt_chars(request) > INLINE_TOKENIZE_CHARS:  # keep the loop serving
            prepared = await asyncio.to_thread(self.prepare, request)
        else:
            prepared = self.prepare(request)
        num_prompts = len(prepared.objs) // prepared.n
        check_request_size(self.tokenizer_manager, num_prompts, prepared.n, "prompt")
        fanout = ChoiceFanout(
            self.tokenizer_manager,
            prepared.objs,
            self.metrics,
            raw_request,
            param_of=lambda path: openai_param(request, path),
        )
        try:
            if request.stream:
                return await open_stream(fanout, self.stream_chunks(request, prepared, fanout))
            async with fanout:
                outputs = await fanout.collect()
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED_STATUS)
        body = self.build_response(request, prepared, outputs)
        return JSONResponse(body.model_dump())

    def check_model(self, model: str) -> None:
        check_model_name(self.tokenizer_manager, model)

    def _choice_params(self, request: SamplingFields, max_new_tokens: int | None) -> dict[str, Any]:
        """Check the sampling fields against the limits and the vocab; the per-choice dict."""
        params = sampling_params(request, max_new_tokens)
        check_choice_params(params, self._vocab_size(), lambda path: openai_param(request, path))
        return params

    def _vocab_size(self) -> int | None:
        return getattr(self.tokenizer_manager.model_config, "vocab_size", None)

    @abstractmethod
    def prepare(self, request: Any) -> Prepared: ...

    def prompt_chars(self, request: Any) -> int:
        """About how many characters `prepare` tokenizes itself (0: it leaves the prompt's
        text to the TokenizerManager, which tokenizes a long one off the loop)."""
        return 0

    def build_response(
        self, request: Any, prepared: Prepared, outputs: list[dict[str, Any]]
    ) -> BaseModel:
        choices = [self._choice(request, prepared, i, out) for i, out in enumerate(outputs)]
        return self.response_cls(
            id=prepared.request_id,
            created=prepared.created,
            model=request.model,
            choices=choices,
            usage=usage_of([out["meta_info"] for out in outputs], prepared.n),
        )

    async def stream_chunks(
        self, request: Any, prepared: Prepared, fanout: ChoiceFanout
    ) -> AsyncIterator[BaseModel | dict[str, Any]]:
        states = [ChoiceStream() for _ in prepared.objs]
        usage = StreamUsage(request, prepared)
        async for event in fanout.events():
            usage.note(event.index, event.output["meta_info"])
            state = states[event.index]
            for chunk in self._delta_chunks(request, prepared, event.index, state, event.output):
                chunk["created"] = prepared.created
                yield usage.stamp(chunk)
        if usage.final:
            yield self.chunk_cls(id=prepared.request_id, created=prepared.created,
                                 model=request.model, choices=[], usage=usage.usage())  # fmt: skip

    # The route's response and stream-chunk models, and how one choice fills them.
    response_cls: type[BaseModel]
    chunk_cls: type[BaseModel]

    @abstractmethod
    def _choice(
        self, request: Any, prepared: Prepared, index: int, output: dict[str, Any]
    ) -> BaseModel: ...

    @abstractmethod
    def _delta_chunks(
        self,
        request: Any,
        prepared: Prepared,
        index: int,
        state: ChoiceStream,
        output: dict[str, Any],
    ) -> Iterator[dict[str, Any]]:
        """The chunks of choice `index` for its latest cumulative `output`, as
        `stream_chunks` dicts (the dump of the route's chunk model)."""


@dataclass
class ChoiceStream:
    """What one choice has already sent in a stream."""

    text_len: int = 0
    num_ids: int = 0
    num_logprobs: int = 0
    started: bool = False
    logprob_offsets: Any = None  # completions' TextOffsets of the next output token

    def take_text(self, text: str) -> str:
        delta = text[self.text_len :]
        self.text_len = max(self.text_len, len(text))
        return delta

    def take_ids(self, ids: list[int]) -> list[int]:
        delta = ids[self.num_ids :]
        self.num_ids = max(self.num_ids, len(ids))
        return delta

    def take_logprob_start(self, meta: dict[str, Any]) -> int:
        start = self.num_logprobs
        self.num_logprobs = len(meta.get("output_token_logprobs") or [])
        return start


class StreamUsage:
    """Token usage over a stream (the latest meta_info of each choice), sent as
    `stream_options` asks: in a last chunk (`include_usage`) and/or on every chunk
    (`continuous_usage_stats`)."""

    def __init__(self, request: SamplingFields, prepared: Prepared) -> None:
        options = request.stream_options
        self.final = bool(options and options.include_usage)
        self.continuous = bool(options and options.continuous_usage_stats)
        self._n = prepared.n
        self._metas: list[dict[str, Any]] = [{} for _ in prepared.objs]

    def note(self, index: int, meta: dict[str, Any]) -> None:
        self._metas[index] = meta

    def usage(self) -> UsageInfo:
        return usage_of(self._metas, self._n)

    def stamp(self, chunk: dict[str, Any]) -> dict[str, Any]:
        return stamp_usage(chunk, self.usage()) if self.continuous else chunk
