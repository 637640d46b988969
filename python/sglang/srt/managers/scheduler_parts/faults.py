"""Fault containment: one request's failure is that request's failure.

A forward that raises is retried one request at a time, so the request(s) that
make it fail are found; they are aborted with the error (their KV freed), and
the others go on with the tokens their single-request forwards produced (the
same tokens: a request's sampling does not depend on its batch). Errors that
leave the process in an unknown state (a broken pool invariant, a device error)
are not contained: they end the process and the launcher fails fast.

With tensor parallelism every rank must run the same forwards, and a fault seen
by one rank only cannot be isolated in step; there a forward error is fatal.

The fault-injection hook and the fatal-error test live in
`managers/fault_injection.py` (no torch: the detokenizer uses them too).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from sglang.srt.managers.fault_injection import FaultInjector, is_fatal
from sglang.srt.managers.request_errors import internal_error_reason
from sglang.srt.managers.schedule_batch import PrefillBatch, RunningBatch
from sglang.srt.managers.scheduler_parts.speculative import VerifyStep
from sglang.srt.model_executor.forward_batch_info import (
    EmbeddingBatchResult,
    GenerationBatchResult,
)

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req

logger = logging.getLogger(__name__)


def merge_results(results: list[Any]) -> GenerationBatchResult | EmbeddingBatchResult:
    """Single-request results, concatenated in order (entries of requests that did
    not ask for a field are placeholders that nobody reads)."""
    if isinstance(results[0], EmbeddingBatchResult):
        return EmbeddingBatchResult([e for r in results for e in r.embeddings])

    def cat(name: str, empty: Any) -> list[Any] | None:
        parts = [getattr(r, name) for r in results]
        if all(p is None for p in parts):
            return None
        return [x for p in parts for x in (p if p is not None else [empty])]

    return GenerationBatchResult(
        next_token_ids=[t for r in results for t in r.next_token_ids],
        next_token_logprobs=cat("next_token_logprobs", 0.0),
        next_token_top_logprobs=cat("next_token_top_logprobs", []),
        input_token_logprobs=cat("input_token_logprobs", []),
        input_top_logprobs=cat("input_top_logprobs", []),
    )


class SchedulerFaultsMixin:
    running: RunningBatch
    tp_sync: Any
    tp_worker: Any
    page_size: int
    req_to_token_pool: Any
    allocator: Any
    pending_outputs: list[Req]
    fault_injector: FaultInjector

    def forward(self, reqs: list[Req], worker_batch: Any) -> GenerationBatchResult:
        """The one place a batch meets the model (and the fault hook)."""
        self.fault_injector.check("forward", [r.rid for r in reqs])
        self.fault_injector.stall([r.rid for r in reqs])
        if self.is_embedding:
            return self.tp_worker.forward_batch_embedding(worker_batch)
        return self.tp_worker.forward_batch_generation(worker_batch)

    def run_contained(self, batch: Any) -> None:
        """Run `batch`; on a containable error isolate the faulty request(s)."""
        try:
            result = self.tp_sync.share_result(self.run_batch(batch))
        except Exception as exc:
            if self.tp_sync.tp_size > 1 or is_fatal(exc):
                raise
            logger.exception("a forward failed; retrying its requests one by one")
            self._isolate(batch)
            return
        self.process_batch_result(batch, result)

    def _isolate(self, batch: Any) -> None:
        if isinstance(batch, PrefillBatch):
            self._isolate_prefill(batch)
            return
        if isinstance(batch, VerifyStep):  # retry as plain decodes, one request at a time
            self.undo_verify_step(batch)
            batch = self.plain_decode_step()
            if batch is None:
                return
        self._isolate_decode(batch)

    def _isolate_prefill(self, batch: PrefillBatch) -> None:
        good: list[tuple[Req, torch.Tensor, int, GenerationBatchResult]] = []
        decoding = {id(r) for r in batch.decoding_reqs}  # mixed in: they sit in running
        failed_decoding: list[Req] = []
        offset = 0
        for req, prefix_len in zip(batch.reqs, batch.prefix_lens):
            loc = batch.out_cache_loc[offset : offset + req.extend_len]
            offset += req.extend_len
            single = PrefillBatch(reqs=[req], out_cache_loc=loc, prefix_lens=[prefix_len])
            try:
                info = self._with_grammar_mask(self._sampling_info([req]), [req])
                result = self.forward([req], single.to_worker_batch(info))
            except Exception as exc:
                if is_fatal(exc):
                    raise
                self.abort_on_error(req, exc, computed_end=req.kv_len + req.extend_len)
                if id(req) in decoding:
                    failed_decoding.append(req)
                continue
            good.append((req, loc, prefix_len, result))
        self.running.remove(failed_decoding)
        if good:
            merged = PrefillBatch(
                reqs=[g[0] for g in good],
                out_cache_loc=torch.cat([g[1] for g in good]),
                prefix_lens=[g[2] for g in good],
                num_decoding=sum(id(g[0]) in decoding for g in good),
            )
            self.process_batch_result(merged, merge_results([g[3] for g in good]))

    def _isolate_decode(self, step: Any) -> None:
        reqs = list(self.running.reqs)
        results: list[GenerationBatchResult] = []
        good_locs: list[torch.Tensor] = []
        failed: list[Req] = []
        for i, req in enumerate(reqs):
            loc = step.out_cache_loc[i : i + 1]
            single = RunningBatch()
            single.add([req])
            try:
                info = self._with_grammar_mask(self._sampling_info([req]), [req])
                worker_batch = single.to_worker_batch(loc, info)
                results.append(self.forward([req], worker_batch))
                good_locs.append(loc)
            except Exception as exc:
                if is_fatal(exc):
                    raise
                failed.append(req)
                self.abort_on_error(req, exc, computed_end=req.kv_len + 1)
        self.running.remove(failed)
        if results:
            step.out_cache_loc = torch.cat(good_locs)
            self.process_batch_result(step, merge_results(results))

    def abort_on_error(self, req: Req, exc: BaseException, computed_end: int) -> None:
        """Abort `req` with `exc`: free the slots of positions [kv_len, computed_end)
        that the failed forward was to fill, then release the request's KV."""
        logger.error("request %s failed: %s: %s", req.rid, type(exc).__name__, exc)
        self._free_uncomputed(req, computed_end)
        req.finished_reason = internal_error_reason(exc)
        self.release_req(req)
        self.pending_outputs.append(req)

    def _free_uncomputed(self, req: Req, end: int) -> None:
        if req.req_pool_idx is None:
            return
        start = req.kv_len
        if self.page_size > 1:
            # The page holding position kv_len - 1 goes with the request's own tail
            # (release_req frees it); only whole fresh pages are freed here.
            start = -(-start // self.page_size) * self.page_size
        if end > start:
            row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
            self.allocator.free(row[start:end].to(torch.int64))
