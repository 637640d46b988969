"""/v1/embeddings: OpenAI's embeddings API over `TokenizerManager.encode_request`;
/encode: SGLang's native one (`{"text"}` or `{"input_ids"}`, one prompt or a list;
answers `{"embedding", "meta_info"}`, or a list of those, as `Engine.encode`).

Each input (a text or a token-id list) is one embedding request; they are sent
together, so the scheduler batches them. `encoding_format` "base64" answers each
vector as the base64 of its float32 little-endian bytes (what the openai SDK asks
for by default and decodes with numpy). `dimensions` is checked and applied by the
TokenizerManager (models that declare Matryoshka training; else a 400).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable
from typing import Any, Union

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import ConfigDict

from sglang.srt.entrypoints.openai.errors import APIError
from sglang.srt.entrypoints.openai.fanout import (
    ClientDisconnected,
    is_client_error,
    to_api_error,
    wait_for_disconnect,
)
from sglang.srt.entrypoints.openai.protocol import (
    EmbeddingObject,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
    UnsupportedSGLangFields,
)
from sglang.srt.entrypoints.openai.serving_base import (
    CLIENT_CLOSED_STATUS,
    check_dp_routing,
    check_input_count,
    check_model_name,
    choice_rids,
    mark_samples,
    new_request_id,
    prompt_fields,
)
from sglang.srt.entrypoints.per_prompt import per_prompt
from sglang.srt.managers.io_struct import EmbeddingReqInput
from sglang.srt.managers.tokenizer_embedding import EMBEDDING_REFUSED
from sglang.srt.observability.metrics import ServerMetrics
from sglang.srt.sampling.param_types import NonNegInt, RequestId, strict

logger = logging.getLogger(__name__)
EmbeddingPrompt = str | list[int]


def split_inputs(value: Any, param: str = "input") -> list[EmbeddingPrompt]:
    """A text, texts, token ids or lists of token ids (the request's field `param`) ->
    one prompt per input."""
    if isinstance(value, str):
        return [value]
    if not value:
        raise APIError(f"{param} must not be empty", param=param, code="invalid_value")
    if all(isinstance(v, int) for v in value):
        return [list(value)]
    if any(isinstance(v, list) and not v for v in value):
        raise APIError("a token-id input must not be empty", param=param, code="invalid_value")
    check_input_count(len(value), param)
    return list(value)


def encode_vector(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


def _input_param(path: str) -> str:
    """A runtime error's field (`text`, `input_ids`) is the route's `input`."""
    return "input" if path in ("text", "input_ids") else path


class EncodeRequest(UnsupportedSGLangFields):
    """The body of SGLang's native `/encode`."""

    model_config = ConfigDict(extra="forbid")
    text: Union[strict(str, min_length=1), list[strict(str, min_length=1)], None] = None
    input_ids: Union[list[NonNegInt], list[list[NonNegInt]], None] = None
    rid: Union[RequestId, list[RequestId], None] = None  # one, or one per prompt (SGLang's)
    dimensions: strict(int, ge=1) | None = None

    def prompt_field(self) -> str:
        if (self.text is None) == (self.input_ids is None):
            raise APIError("give exactly one of text and input_ids", param="text",
                           code="invalid_value")  # fmt: skip
        return "text" if self.text is not None else "input_ids"


class OpenAIServingEmbedding:
    def __init__(self, tokenizer_manager: Any, metrics: ServerMetrics | None = None) -> None:
        self.tokenizer_manager = tokenizer_manager
        self.metrics = metrics

    async def handle(self, request: EmbeddingRequest, raw_request: Request | None) -> Response:
        check_model_name(self.tokenizer_manager, request.model)
        check_dp_routing(self.tokenizer_manager, request)
        if not self.tokenizer_manager.is_embedding:
            raise APIError(EMBEDDING_REFUSED, param="model", code="model_not_embedding")
        objs = self.prepare(request)
        try:
            outputs = await self._collect(objs, raw_request)
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED_STATUS)
        return JSONResponse(self.build_response(request, outputs).model_dump())

    async def handle_native(self, request: EncodeRequest, raw_request: Request | None) -> Response:
        """/encode: each prompt's `{"embedding", "meta_info"}`; a list for a list."""
        check_dp_routing(self.tokenizer_manager, request)
        if not self.tokenizer_manager.is_embedding:
            raise APIError(EMBEDDING_REFUSED, param=None, code="model_not_embedding")
        field = request.prompt_field()
        given = getattr(request, field)
        objs = self._inputs(split_inputs(given, field), request.rid, request.dimensions)

        def param_of(path: str) -> str:  # the prompt's errors name the field it came in
            return field if path in ("text", "input_ids") else path

        try:
            outputs = await self._collect(objs, raw_request, param_of=param_of)
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED_STATUS)
        is_batch = not isinstance(given, str) and not all(isinstance(v, int) for v in given)
        return JSONResponse(outputs if is_batch else outputs[0])

    def prepare(self, request: EmbeddingRequest) -> list[EmbeddingReqInput]:
        return self._inputs(split_inputs(request.input), request.rid, request.dimensions)

    @staticmethod
    def _inputs(
        prompts: list[EmbeddingPrompt], rid: str | list[str] | None, dimensions: int | None
    ) -> list[EmbeddingReqInput]:
        """One request per prompt; `rid` one (`<rid>-<k>` for several prompts) or one
        per prompt (/encode, as SGLang)."""
        request_id = new_request_id("embd")
        if isinstance(rid, list):
            try:
                rids = per_prompt(rid, len(prompts), "rid")
            except ValueError as exc:
                raise APIError(str(exc), param="rid", code="invalid_value") from None
        else:
            rids = choice_rids(request_id, rid, len(prompts))
        objs = [
            EmbeddingReqInput(**prompt_fields(p), rid=r, dimensions=dimensions)
            for p, r in zip(prompts, rids)
        ]
        return objs if isinstance(rid, list) else mark_samples(objs, request_id, rid)

    async def _collect(
        self,
        objs: list[EmbeddingReqInput],
        raw_request: Request | None,
        param_of: Any = _input_param,
    ) -> list[dict[str, Any]]:
        """Every input's output. On the first failure, or when the client goes away
        (ClientDisconnected), the others are cancelled, which aborts them in the
        scheduler, and the failure is answered."""
        client_left: list[bool] = []  # cancelled for the client (counted aborts), or not
        tasks = [asyncio.ensure_future(self._encode(o, lambda: bool(client_left))) for o in objs]
        every = asyncio.gather(*tasks)
        watch = None if raw_request is None else asyncio.ensure_future(
            wait_for_disconnect(raw_request))  # fmt: skip
        try:
            if watch is not None:
                await asyncio.wait((every, watch), return_when=asyncio.FIRST_COMPLETED)
                if not every.done():
                    logger.info("client disconnected; aborting %d embedding input(s)", len(objs))
                    client_left.append(True)
                    raise ClientDisconnected()
            return list(await every)
        except Exception as exc:
            for task in tasks:
                task.cancel()
            await asyncio.gather(every, return_exceptions=True)
            if isinstance(exc, ClientDisconnected):
                raise
            error = to_api_error(exc, param_of)
            error.param = error.param and param_of(error.param)
            raise error from None
        finally:
            if watch is not None:
                watch.cancel()

    async def _encode(
        self, obj: EmbeddingReqInput, client_left: Callable[[], bool]
    ) -> dict[str, Any]:
        """One input's output, counted in /metrics (requests, prompt tokens, latency) as
        a generation is: an input cut off by its client as an abort, one the runtime
        failed as a failure; one cancelled because a sibling failed is that sibling's."""
        tracker = self.metrics.track() if self.metrics is not None else None
        try:
            out = await self.tokenizer_manager.encode_request(obj)
        except asyncio.CancelledError:
            if tracker is not None and client_left():
                tracker.on_abort()
            raise
        except Exception as exc:
            if tracker is not None and not is_client_error(exc):
                tracker.on_failure()
            raise
        if tracker is not None:
            tracker.on_output(out)
        return out

    @staticmethod
    def build_response(
        request: EmbeddingRequest, outputs: list[dict[str, Any]]
    ) -> EmbeddingResponse:
        data = []
        for index, out in enumerate(outputs):
            if out["embedding"] is None:  # aborted (by /abort_request) before it finished
                # not a server fault, and there is no finish_reason to say "abort" with
                raise APIError(
                    "the request was aborted (abort_request) before its embedding was made",
                    400,
                    code="request_aborted",
                )
            vector = encode_vector(out["embedding"], request.encoding_format)
            data.append(EmbeddingObject(index=index, embedding=vector))
        prompt_tokens = sum(int(out["meta_info"]["prompt_tokens"]) for out in outputs)
        usage = EmbeddingUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens)
        return EmbeddingResponse(data=data, model=request.model, usage=usage)
