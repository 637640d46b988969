"""Incoming messages: new requests, aborts and control requests."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from sglang.srt.managers.fault_injection import is_fatal
from sglang.srt.managers.io_struct import (
    AbortReq,
    FlushCacheReqInput,
    FlushCacheReqOutput,
    GetInternalStateReq,
    GetInternalStateReqOutput,
    TokenizedEmbeddingReqInput,
    TokenizedGenerateReqInput,
    UpdateWeightFromDiskReqInput,
    UpdateWeightFromDiskReqOutput,
)
from sglang.srt.managers.request_errors import (
    OVERLOADED_STATUS,
    UPDATE_BUSY_MESSAGE,
    internal_error_reason,
    invalid_request_reason,
)
from sglang.srt.managers.schedule_batch import Req, finish_abort
from sglang.srt.sampling.sampling_params import SamplingParams

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import RunningBatch

logger = logging.getLogger(__name__)


class SchedulerRequestsMixin:
    clock_s: float  # this step's time, the same on every TP rank (Scheduler.recv_requests)
    waiting_queue: list[Req]
    running: RunningBatch
    max_running_requests: int
    chunked_req: Req | None
    pending_outputs: list[Req]
    max_queued_requests: int | None
    context_len: int
    send_to_tokenizer: Any
    tp_worker: Any
    dp_rank: int

    def process_input_requests(self, msgs: list[Any]) -> None:
        for msg in msgs:
            handler = self._handlers().get(type(msg))
            if handler is None:
                logger.error("scheduler: unknown message %r", type(msg).__name__)
                continue
            try:
                handler(msg)
            except Exception as exc:
                if is_fatal(exc):
                    raise
                logger.exception("scheduler: handling %s failed", type(msg).__name__)
                self._reject(msg, exc)

    def _reject(self, msg: Any, exc: Exception) -> None:
        """A new request whose message could not be handled ends with the error."""
        new_request = (TokenizedGenerateReqInput, TokenizedEmbeddingReqInput)
        if isinstance(msg, new_request) and isinstance(msg.rid, str):
            req = Req(msg.rid, [], SamplingParams())
            req.finished_reason = internal_error_reason(exc)
            self.pending_outputs.append(req)

    def _handlers(self) -> dict[type, Any]:
        return {
            TokenizedGenerateReqInput: self.handle_generate,
            TokenizedEmbeddingReqInput: self.handle_embedding,
            AbortReq: self.handle_abort,
            FlushCacheReqInput: self.handle_flush_cache,
            GetInternalStateReq: self.handle_get_internal_state,
            UpdateWeightFromDiskReqInput: self.handle_update_weights,
        }

    # ------------------------------------------------------------------ generate / abort

    def handle_generate(self, msg: TokenizedGenerateReqInput) -> None:
        req = Req(
            msg.rid,
            list(msg.input_ids),
            msg.sampling_params,
            return_logprob=msg.return_logprob,
            top_logprobs_num=msg.top_logprobs_num,
            logprob_token_ids=msg.token_ids_logprob,
            logprob_start_len=msg.logprob_start_len,
            stream=msg.stream,
        )
        if msg.sampling_params.max_new_tokens is None:
            req.max_new_tokens = self.context_len - len(req.origin_input_ids)
        req.parent_rid = msg.parent_rid
        req.reasoning_end_token_id = msg.reasoning_end_token_id
        req.arrival_time_s = self.clock_s  # the same on every TP rank
        if self.refuse_if_queue_full(req):
            return
        if not self.submit_if_constrained(req):
            self.waiting_queue.append(req)

    def refuse_if_queue_full(self, req: Req) -> bool:
        """With --max-queued-requests reached, `req` ends at once (429); True if so. The
        queue counts the requests that must wait: those beyond the free running slots
        (the samples of one request, or a batch, that an idle server can run at once
        are never refused as a queue)."""
        limit = self.max_queued_requests
        if limit is None:
            return False
        free_slots = max(self.max_running_requests - len(self.running), 0)
        if len(self.waiting_queue) + self.num_grammar_waiting() - free_slots < limit:
            return False
        if self._only_own_samples_ahead(req):  # no retry can fit it: the request's n
            text = (
                f"n: this request's samples are more than max_running_requests "
                f"({self.max_running_requests}) + max_queued_requests ({limit}) hold at "
                "once; lower n"
            )
            req.finished_reason = invalid_request_reason(text, "n")
        else:
            text = f"The request queue is full (max_queued_requests={limit}); retry later."
            req.finished_reason = finish_abort(text, status_code=OVERLOADED_STATUS)
        self.pending_outputs.append(req)
        return True

    def _only_own_samples_ahead(self, req: Req) -> bool:
        """Whether every request running or waiting is a sample of `req`'s own request
        (an n > 1 fan-out), so that the queue is full of it alone."""
        if req.parent_rid is None or self.chunked_req is not None:
            return False
        compiling = self.grammar_manager.waiting_reqs() if self.num_grammar_waiting() else []
        ahead = [*self.running.reqs, *self.waiting_queue, *compiling]
        return all(r.parent_rid == req.parent_rid for r in ahead)

    def handle_abort(self, msg: AbortReq) -> None:
        compiling = self.remove_grammar_waiting(msg.rid)
        if compiling is not None:
            self._finish_aborted(compiling, msg.message)
            return
        for i, req in enumerate(self.waiting_queue):
            if req.rid == msg.rid:
                del self.waiting_queue[i]
                self._finish_aborted(req, msg.message)
                return
        if self.chunked_req is not None and self.chunked_req.rid == msg.rid:
            req, self.chunked_req = self.chunked_req, None
            self._finish_aborted(req, msg.message)
            return
        for req in self.running.reqs:
            if req.rid == msg.rid:
                self.running.remove([req])
                self._finish_aborted(req, msg.message)
                return

    def _finish_aborted(self, req: Req, message: str) -> None:
        req.finished_reason = finish_abort(message)
        self.release_req(req)
        self.pending_outputs.append(req)

    # ------------------------------------------------------------------ control

    def has_schedulable_work(self) -> bool:
        """Requests a batch can be built from (queued, running, or mid chunked prefill)."""
        return bool(self.waiting_queue or len(self.running) or self.chunked_req is not None)

    def is_idle(self) -> bool:
        return not self.has_schedulable_work() and not self.num_grammar_waiting()

    def handle_flush_cache(self, msg: FlushCacheReqInput) -> None:
        if not self.is_idle():
            text = "Cannot flush the cache while requests are in flight."
            out = FlushCacheReqOutput(False, text, dp_rank=self.dp_rank)
        else:
            self._empty_cache()
            out = FlushCacheReqOutput(True, "Cache flushed.", dp_rank=self.dp_rank)
        self.send_to_tokenizer.send(out)

    def _empty_cache(self) -> None:
        """Drop every cached prefix (idle: no request holds KV) and the hit-rate figures
        that described them."""
        self.tree_cache.reset()
        self.allocator.clear()
        self.req_to_token_pool.clear()
        self.reserve_excess()
        self.cache_hits = self.cache_queries = 0

    def handle_get_internal_state(self, msg: GetInternalStateReq) -> None:
        if self.is_idle() and not self._checked_idle:
            self._check_idle_integrity()
        state = self.internal_state()
        self.send_to_tokenizer.send(GetInternalStateReqOutput(state, dp_rank=self.dp_rank))

    def internal_state(self) -> dict[str, Any]:
        from sglang.srt.runtime_context import get_context

        state = dict(get_context().resolved_server_args_dict())
        state.update(self.live_figures(), dp_rank=self.dp_rank, pid=os.getpid())
        return state

    def live_figures(self) -> dict[str, Any]:
        used = self.used_kv_tokens()
        return {
            "num_running_reqs": len(self.running) + (1 if self.chunked_req else 0),
            "num_queued_reqs": len(self.waiting_queue) + self.num_grammar_waiting(),
            "num_grammar_queue_reqs": self.num_grammar_waiting(),
            "token_usage": round(used / max(self.max_total_num_tokens, 1), 4),
            "num_used_tokens": used,
            "max_total_num_tokens": self.max_total_num_tokens,
            "effective_max_running_requests": self.max_running_requests,
            "available_kv_tokens": self.allocator.available_size(),
            "cached_kv_tokens": self.tree_cache.total_size(),
            "free_req_slots": self.req_to_token_pool.available_size(),
            "total_req_slots": self.req_to_token_pool.size - self.reserved_figures()[1],
            "cache_hit_rate": round(self.cache_hits / max(self.cache_queries, 1), 4),
            "num_retracted_reqs": self.num_retracted_reqs,
            "memory_integrity": "ok" if self.integrity_error is None else self.integrity_error,
            # the last 2 s window's figure while decoding; 0 once nothing runs
            "last_gen_throughput": round(self.last_gen_throughput if self.running else 0.0, 2),
            **self.spec_live_figures(),
            "timestamp": time.time(),
        }

    def _update_every_tp_rank(self, msg: UpdateWeightFromDiskReqInput) -> tuple[bool, str]:
        """Load the new weights on this rank; with tensor parallelism every rank must
        succeed, else the ranks that did go back to the weights they had (a rank
        failing alone left the ranks on different weights, reported as a success)."""
        from sglang.srt.runtime_context import get_model

        before = (self.tp_worker.model_config.model_path, get_model().load_format)
        ok, text = self.tp_worker.update_weights_from_disk(msg.model_path, msg.load_format)
        if self.tp_sync.tp_size == 1 or self.tp_sync.agree_min([int(ok)])[0]:
            return ok, text
        if ok:  # another rank failed: this one goes back
            back_ok, back_text = self.tp_worker.update_weights_from_disk(*before)
            if not back_ok:
                logger.error("rolling back a failed weight update failed: %s", back_text)
            text = (
                f"failed to update weights from {msg.model_path}: another tensor-parallel "
                "rank could not load them (see its log); every rank keeps the weights it had"
            )
        return False, text

    def handle_update_weights(self, msg: UpdateWeightFromDiskReqInput) -> None:
        from sglang.srt.runtime_context import get_context

        if not self.is_idle():
            ok, text = False, UPDATE_BUSY_MESSAGE
        else:
            ok, text = self._update_every_tp_rank(msg)
        if ok:
            # the runner loads with "auto" when none is given (not the one before)
            fields = {"model_path": msg.model_path, "load_format": msg.load_format or "auto"}
            get_context().override("update_weights_from_disk", **fields)
            self._empty_cache()  # KV made with the old weights
        self.send_to_tokenizer.send(
            UpdateWeightFromDiskReqOutput(
                ok, text, msg.model_path, msg.load_format, dp_rank=self.dp_rank
            )
        )
