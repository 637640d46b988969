"""Admission: build a prefill (EXTEND) batch from the waiting queue."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from sglang.srt.managers.schedule_batch import PrefillBatch
from sglang.srt.managers.schedule_policy import PrefillBudget

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, RunningBatch
    from sglang.srt.managers.schedule_policy import NewTokenRatio, SchedulePolicy
    from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache


class SchedulerAdmissionMixin:
    clock_s: float  # this step's time, the same on every TP rank (Scheduler.recv_requests)
    waiting_queue: list[Req]
    running: RunningBatch
    chunked_req: Req | None
    tree_cache: BasePrefixCache
    req_to_token_pool: Any
    policy: SchedulePolicy
    new_token_ratio: NewTokenRatio
    max_running_requests: int
    max_prefill_tokens: int
    chunked_prefill_size: int | None
    enable_mixed_chunk: bool
    page_size: int

    def get_new_prefill_batch(self) -> PrefillBatch | None:
        if not self.waiting_queue and self.chunked_req is None:
            return None
        budget = self._new_budget()
        admitted: list[Req] = []
        prefix_lens: list[int] = []
        for req in self._candidates():
            prefix_len = self._admit(req, budget)
            if prefix_len is None:
                break
            admitted.append(req)
            prefix_lens.append(prefix_len)
        if not admitted:
            return None
        return self._finish_prefill_batch(admitted, prefix_lens)

    def _new_budget(self) -> PrefillBudget:
        # The chunked request (if any) is the first candidate: its reserve is
        # charged when its last chunk is granted, not here.
        reserve = self.new_token_ratio.reserve(self.running.reqs, self.page_size)
        return PrefillBudget(
            rem_total_tokens=self.free_kv_tokens() - reserve,
            rem_input_tokens=self.max_prefill_tokens,
            rem_chunk_tokens=self._chunk_tokens(),
            rem_running_slots=self.max_running_requests - len(self.running),
            page_size=self.page_size,
            has_running=bool(self.running.reqs),
        )

    def _chunk_tokens(self) -> int | None:
        """Prompt tokens one prefill batch may compute (None: no chunking). Mixed with the
        running requests' decode rows, the batch keeps to the chunk size, but the prompt
        keeps at least half of it (else a large running batch would stall prefill)."""
        chunk = self.chunked_prefill_size
        if chunk is None or chunk <= 0:
            return None
        if self.enable_mixed_chunk:
            return max(chunk - len(self.running), chunk // 2, 1)
        return chunk

    def _candidates(self) -> list[Req]:
        ordered = self.policy.order(self.waiting_queue, self._match_for_policy, self.clock_s)
        if self.chunked_req is not None:
            ordered.insert(0, self.chunked_req)
        return ordered

    def _match_for_policy(self, req: Req) -> tuple[int, Any]:
        match = self.tree_cache.match_prefix(req.all_ids()[: req.max_prefix_len()])
        return match.prefix_len, match.last_node

    # ------------------------------------------------------------------ one request

    def _admit(self, req: Req, budget: PrefillBudget) -> int | None:
        """Lock the prefix, take a row, grant tokens; returns the prefix length or None."""
        if req.req_pool_idx is None and self.req_to_token_pool.available_size() == 0:
            return None
        evictable_before = self.tree_cache.evictable_size()
        if req.req_pool_idx is None:
            self._attach_prefix(req)
        budget.charge_locked(evictable_before - self.tree_cache.evictable_size())
        prefix_len = req.kv_len
        remaining = req.seq_len - prefix_len
        granted = budget.grant(remaining, req.remaining_new_tokens(), prefix_len)
        if granted is None:
            if not req.is_chunked:
                self._detach_prefix(req)
            return None
        req.extend_len = granted
        req.is_chunked = granted < remaining
        return prefix_len

    def _attach_prefix(self, req: Req) -> None:
        match = self.tree_cache.match_prefix(req.all_ids()[: req.max_prefix_len()])
        self.tree_cache.inc_lock_ref(match.last_node)
        req.last_node = match.last_node
        req.cache_protected_len = req.kv_len = match.prefix_len
        req.req_pool_idx = self.req_to_token_pool.alloc(1)[0]
        if match.prefix_len:
            self.req_to_token_pool.write(
                (req.req_pool_idx, slice(0, match.prefix_len)), match.device_indices
            )
        if not req.admitted_once:
            req.num_cached_tokens = match.prefix_len  # counted once admitted

    def _detach_prefix(self, req: Req) -> None:
        self.tree_cache.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx, req.last_node = None, None
        req.kv_len = req.cache_protected_len = 0

    # ------------------------------------------------------------------ the batch

    def _finish_prefill_batch(self, reqs: list[Req], prefix_lens: list[int]) -> PrefillBatch:
        seq_lens = [p + r.extend_len for r, p in zip(reqs, prefix_lens)]
        pool_indices = [r.req_pool_idx for r in reqs]
        out_cache_loc = self.alloc_extend(prefix_lens, seq_lens, pool_indices)
        assert out_cache_loc is not None, "admission budget admitted more than the pool holds"
        offset = 0
        for req, p, s in zip(reqs, prefix_lens, seq_lens):
            n = s - p
            self.req_to_token_pool.write(
                (req.req_pool_idx, slice(p, s)), out_cache_loc[offset : offset + n]
            )
            offset += n
            if not req.admitted_once:  # a request refused for room was tried before
                req.queue_time_s = time.monotonic() - req.arrival_time_s
                self.cache_hits += req.num_cached_tokens
                self.cache_queries += len(req.origin_input_ids)
            req.admitted_once = True
        admitted_ids = {id(r) for r in reqs}
        self.waiting_queue = [r for r in self.waiting_queue if id(r) not in admitted_ids]
        self.chunked_req = None
        return PrefillBatch(
            reqs=reqs, out_cache_loc=out_cache_loc.to(torch.int64), prefix_lens=prefix_lens
        )

    # ------------------------------------------------------------------ mixing

    def mix_running_into(self, batch: PrefillBatch) -> None:
        """Append every running request to `batch` as one row at its kv_len (its last
        output token), so decoding goes on while prompts are prefilled. Left out when
        the pool cannot give each a slot now: the next decode step retracts first."""
        running = self.running
        if not len(running) or not self.decode_fits():
            return
        out_cache_loc = self.alloc_running_slots()
        if out_cache_loc is None:
            return
        for req in running.reqs:
            req.extend_len = 1
        batch.reqs = batch.reqs + running.reqs
        batch.prefix_lens = batch.prefix_lens + [req.kv_len for req in running.reqs]
        batch.out_cache_loc = torch.cat([batch.out_cache_loc, out_cache_loc])
        batch.num_decoding = len(running)
