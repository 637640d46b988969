"""/v1/embeddings: OpenAI's embeddings API over `TokenizerManager.encode_request`.

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
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from sglang.srt.entrypoints.openai.errors import APIError
from sglang.srt.entrypoints.openai.fanout import (
    ClientDisconnected,
    to_api_error,
    wait_for_disconnect,
)
from sglang.srt.entrypoints.openai.protocol import (
    EmbeddingObject,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
)
from sglang.srt.entrypoints.openai.serving_base import (
    CLIENT_CLOSED_STATUS,
    check_input_count,
    check_model_name,
    choice_rids,
    mark_samples,
    new_request_id,
    prompt_fields,
)
from sglang.srt.managers.io_struct import EmbeddingReqInput
from sglang.srt.managers.tokenizer_embedding import EMBEDDING_REFUSED
from sglang.srt.observability.metrics import ServerMetrics

logger = logging.getLogger(__name__)
EmbeddingPrompt = str | list[int]


def split_inputs(value: Any) -> list[EmbeddingPrompt]:
    """A text, texts, token ids or lists of token ids -> one prompt per input."""
    if isinstance(value, str):
        return [value]
    if not value:
        raise APIError("input must not be empty", param="input", code="invalid_value")
    if all(isinstance(v, int) for v in value):
        return [list(value)]
    if any(isinstance(v, list) and not v for v in value):
        raise APIError("a token-id input must not be empty", param="input", code="invalid_value")
    check_input_count(len(value), "input")
    return list(value)


def encode_vector(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


def _input_param(path: str) -> str:
    """A runtime error's field (`text`, `input_ids`) is the route's `input`."""
    return "input" if path in ("text", "input_ids") else path


class OpenAIServingEmbedding:
    def __init__(self, tokenizer_manager: Any, metrics: ServerMetrics | None = None) -> None:
        self.tokenizer_manager = tokenizer_manager
        self.metrics = metrics

    async def handle(self, request: EmbeddingRequest, raw_request: Request | None) -> Response:
        check_model_name(self.tokenizer_manager, request.model)
        if not self.tokenizer_manager.is_embedding:
            raise APIError(EMBEDDING_REFUSED, param="model", code="model_not_embedding")
        objs = self.prepare(request)
        try:
            outputs = await self._collect(objs, raw_request)
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED_STATUS)
        return JSONResponse(self.build_response(request, outputs).model_dump())

    def prepare(self, request: EmbeddingRequest) -> list[EmbeddingReqInput]:
        prompts = split_inputs(request.input)
        request_id = new_request_id("embd")
        rids = choice_rids(request_id, request.rid, len(prompts))
        objs = [
            EmbeddingReqInput(**prompt_fields(p), rid=rid, dimensions=request.dimensions)
            for p, rid in zip(prompts, rids)
        ]
        return mark_samples(objs, request_id, request.rid)

    async def _collect(
        self, objs: list[EmbeddingReqInput], raw_request: Request | None
    ) -> list[dict[str, Any]]:
        """Every input's output. On the first failure, or when the client goes away
        (ClientDisconnected), the others are cancelled, which aborts them in the
        scheduler, and the failure is answered."""
        tasks = [asyncio.ensure_future(self._encode(o)) for o in objs]
        every = asyncio.gather(*tasks)
        watch = None if raw_request is None else asyncio.ensure_future(
            wait_for_disconnect(raw_request))  # fmt: skip
        try:
            if watch is not None:
                await asyncio.wait((every, watch), return_when=asyncio.FIRST_COMPLETED)
                if not every.done():
                    logger.info("client disconnected; aborting %d embedding input(s)", len(objs))
                    raise ClientDisconnected()
            return list(await every)
        except Exception as exc:
            for task in tasks:
                task.cancel()
            await asyncio.gather(every, return_exceptions=True)
            if isinstance(exc, ClientDisconnected):
                raise
            error = to_api_error(exc, _input_param)
            error.param = error.param and _input_param(error.param)
            raise error from None
        finally:
            if watch is not None:
                watch.cancel()

    async def _encode(self, obj: EmbeddingReqInput) -> dict[str, Any]:
        """One input's output, counted in /metrics (requests, prompt tokens, latency)."""
        tracker = self.metrics.track() if self.metrics is not None else None
        out = await self.tokenizer_manager.encode_request(obj)
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
