"""The TokenizerManager's embedding path (`--is-embedding` servers).

`encode_request` validates and tokenizes one prompt, sends a
TokenizedEmbeddingReqInput, waits for the request's single (final) output and
answers `{"embedding": [...], "meta_info": {...}}`. Requests sent back to back
(a list of inputs) reach the scheduler together and share prefill batches.

`dimensions` (OpenAI's truncation) is served for models whose config.json
declares Matryoshka training (`is_matryoshka: true`, or the allowed
`matryoshka_dimensions`): the vector is cut to its first `dimensions` values and
L2-normalised again. Elsewhere it is a 400: a cut vector of a model not trained
for it is not a meaningful embedding.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from sglang.srt.managers.io_struct import EmbeddingReqInput, TokenizedEmbeddingReqInput
from sglang.srt.managers.request_errors import (
    RequestFailedError,
    raise_if_failed,
)
from sglang.srt.sampling.param_types import (
    InvalidParamError,
    RequestId,
    first_error,
    strict,
)

if TYPE_CHECKING:
    from sglang.srt.managers.tokenizer_manager import ReqState

GENERATION_REFUSED = (
    "This server serves an embedding model (--is-embedding): use /v1/embeddings or "
    "Engine.encode; generation requests are refused."
)
EMBEDDING_REFUSED = (
    "This server serves a generation model: embeddings need a server started with --is-embedding."
)


class EmbeddingFieldsSpec(BaseModel):
    text: strict(str) | None
    input_ids: list[strict(int)] | None
    rid: RequestId
    dimensions: strict(int, ge=1) | None


class TokenizerEmbeddingMixin:
    rid_to_state: dict[str, ReqState]
    _release: Any  # TokenizerManager._release
    model_config: Any
    send_to_scheduler: Any

    @property
    def is_embedding(self) -> bool:
        """This engine's --is-embedding (per TokenizerManager: engines may share a process)."""
        return bool(self.config_value("is_embedding"))

    def check_serves_generation(self) -> None:
        if self.is_embedding:
            raise InvalidParamError(GENERATION_REFUSED, None)

    def check_serves_embeddings(self) -> None:
        if not self.is_embedding:
            raise InvalidParamError(EMBEDDING_REFUSED, None)

    async def encode_request(self, obj: EmbeddingReqInput) -> dict[str, Any]:
        """One prompt's embedding: {"embedding": list[float], "meta_info": {...}}."""
        self._check_alive()
        self.check_serves_embeddings()
        self._ensure_handle_loop()
        tokenized, state = await self._admit(obj, self._tokenize_embedding_off_loop)
        if state.finished_reason is None:  # else aborted before it reached the scheduler
            await self._run_embedding(state, tokenized)
        if self.log_requests:  # --log-requests: one line per request, as for generation
            self._log_finished(state)
        check_finite(state.embedding)
        return self._embedding_output(state)

    async def _run_embedding(self, state: ReqState, tokenized: TokenizedEmbeddingReqInput) -> None:
        """Send `tokenized` and wait for its vector; a refused or failed one is logged
        (--log-requests) before it raises."""
        self._register(state)
        try:
            self.send_to_scheduler.send(tokenized)
            await _wait_finished(state)
        except RequestFailedError:
            if self.log_requests:
                self._log_finished(state, state.error)
            raise
        finally:
            self._release(state)

    async def _tokenize_embedding_off_loop(
        self, obj: EmbeddingReqInput
    ) -> TokenizedEmbeddingReqInput:
        from sglang.srt.managers.tokenizer_manager import INLINE_TOKENIZE_CHARS

        if isinstance(obj.text, str) and len(obj.text) > INLINE_TOKENIZE_CHARS:
            return await asyncio.to_thread(self._tokenize_embedding, obj)
        return self._tokenize_embedding(obj)

    def _tokenize_embedding(self, obj: EmbeddingReqInput) -> TokenizedEmbeddingReqInput:
        fields = {name: getattr(obj, name) for name in EmbeddingFieldsSpec.model_fields}
        try:
            EmbeddingFieldsSpec.model_validate(fields)
        except ValidationError as exc:
            raise first_error(exc) from None
        self.check_dimensions(obj.dimensions)
        input_ids = self._input_ids(obj)
        self._check_length(len(input_ids), None)
        return TokenizedEmbeddingReqInput(rid=obj.rid, input_text=obj.text, input_ids=input_ids)

    def check_dimensions(self, dimensions: int | None) -> None:
        """`dimensions` must be one the model was trained to be cut to (400 otherwise)."""
        if dimensions is None:
            return
        raw = getattr(self.model_config, "raw", None) or {}
        allowed = raw.get("matryoshka_dimensions")
        hidden = int(self.model_config.hidden_size)
        if not (raw.get("is_matryoshka") or allowed):
            raise InvalidParamError(
                "this model does not support `dimensions` (its config.json declares no "
                "Matryoshka training: is_matryoshka / matryoshka_dimensions)",
                "dimensions",
            )
        if allowed and dimensions not in allowed:
            raise InvalidParamError(
                f"dimensions must be one of {sorted(allowed)} for this model", "dimensions"
            )
        if dimensions > hidden:
            raise InvalidParamError(
                f"dimensions must be at most the model's embedding size ({hidden})",
                "dimensions",
            )

    def _embedding_output(self, state: ReqState) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": state.obj.rid,
            "prompt_tokens": state.prompt_tokens,
            "cached_tokens": state.cached_tokens,
            "finish_reason": state.finished_reason,
        }
        if state.queue_time_s is not None:
            meta["queue_time"] = state.queue_time_s
        meta["e2e_latency"] = time.monotonic() - state.created_s  # SGLang's, as for generation
        embedding = state.embedding
        if embedding is not None and state.obj.dimensions is not None:
            embedding = truncate_embedding(embedding, state.obj.dimensions)
        return {"embedding": embedding, "meta_info": meta}


async def _wait_finished(state: ReqState) -> None:
    """Until the request's final output (or the runtime's death); an abort that carries
    a status (a refusal, an internal error) raises."""
    while state.finished_reason is None:
        await state.event.wait()
        state.event.clear()
        raise_if_failed(state.error, None)
    raise_if_failed(None, state.finished_reason)


def check_finite(embedding: list[float] | None) -> None:
    """RequestFailedError (a 500) for a vector holding NaN or inf: the model's output,
    not the client's fault (a float16 overflow); the same on every route and format (JSON
    cannot carry it: "float" answered a 500 from the serializer, "base64" a 200 of NaN)."""
    if embedding is not None and not all(math.isfinite(x) for x in embedding):
        raise RequestFailedError(
            "the model's embedding for this input holds NaN or inf (its activations "
            "overflowed; a float32 --dtype may hold them)"
        )


def truncate_embedding(embedding: list[float], dimensions: int) -> list[float]:
    """The first `dimensions` values, L2-normalised again (OpenAI's shortening)."""
    head = embedding[:dimensions]
    norm = math.sqrt(sum(x * x for x in head))
    return [x / norm for x in head] if norm > 0 else head
