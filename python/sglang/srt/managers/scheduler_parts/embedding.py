"""Embedding requests (`--is-embedding`): one prefill each, then a pooled vector.

An embedding server admits embedding requests only (the TokenizerManager refuses
generation), so every prefill batch is an embedding batch: the worker pools each
request's last hidden state instead of sampling, and no request ever decodes.
Admission is the generation path's (prefix matching, chunked prefill, the
prefill budget); a chunked request is pooled at its last chunk. A finished
request's KV goes to the prefix cache like a finished generation's, so a
repeated prompt recomputes only its last token; the cache evicts it under
pressure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sglang.srt.managers.request_errors import invalid_request_reason
from sglang.srt.managers.schedule_batch import Req, finish_length
from sglang.srt.sampling.sampling_params import SamplingParams

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import BatchTokenIDOutput, TokenizedEmbeddingReqInput
    from sglang.srt.managers.schedule_batch import PrefillBatch
    from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache
    from sglang.srt.model_executor.forward_batch_info import EmbeddingBatchResult


class SchedulerEmbeddingMixin:
    tp_worker: Any
    tree_cache: BasePrefixCache
    chunked_req: Req | None
    waiting_queue: list[Req]
    pending_outputs: list[Req]

    def _init_embedding(self) -> None:
        from sglang.srt.runtime_context import get_model

        self.is_embedding = bool(get_model().is_embedding)
        if self.is_embedding:
            self.tp_worker.check_can_embed()
        else:
            self.tp_worker.check_can_generate()

    def handle_embedding(self, msg: TokenizedEmbeddingReqInput) -> None:
        req = Req(msg.rid, list(msg.input_ids), SamplingParams(max_new_tokens=0))
        if not self.is_embedding:  # the TokenizerManager refuses these first
            text = "This server serves a generation model; start it with --is-embedding."
            req.finished_reason = invalid_request_reason(text, "input")
            self.pending_outputs.append(req)
            return
        if not self.refuse_if_queue_full(req):
            self.waiting_queue.append(req)

    def run_embedding_batch(self, batch: PrefillBatch) -> EmbeddingBatchResult:
        return self.forward(batch.reqs, batch.to_worker_batch(None))

    def process_embedding_result(self, batch: PrefillBatch, result: EmbeddingBatchResult) -> None:
        """A request whose prompt is all in KV finishes with its vector; its KV is released."""
        for i, req in enumerate(batch.reqs):
            req.kv_len += req.extend_len
            if req.is_chunked:
                self.tree_cache.cache_unfinished_req(req, req.all_ids()[: req.kv_len])
                self.chunked_req = req
                continue
            if not req.finished:  # (finished: aborted while its prefill ran, already answered)
                req.embedding = result.embeddings[i]
                req.finished_reason = finish_length(0)
                self.pending_outputs.append(req)
            self.release_req(req)

    def attach_embeddings(self, msg: BatchTokenIDOutput, reqs: list[Req]) -> None:
        if self.is_embedding:
            msg.embeddings = [r.embedding for r in reqs]
