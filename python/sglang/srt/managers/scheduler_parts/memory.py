"""KV memory operations of the scheduler: allocate, release, retract, check."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from sglang.srt.managers.schedule_policy import decode_need, page_span, pick_retractions

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, RunningBatch
    from sglang.srt.managers.schedule_policy import NewTokenRatio
    from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache

logger = logging.getLogger(__name__)


class SchedulerMemoryMixin:
    tree_cache: BasePrefixCache
    allocator: Any
    req_to_token_pool: Any
    page_size: int
    running: RunningBatch
    waiting_queue: list[Req]
    chunked_req: Req | None
    new_token_ratio: NewTokenRatio
    max_total_num_tokens: int

    # ---------------------------------------------------------------- figures

    def free_kv_tokens(self) -> int:
        """Slots obtainable now: free plus evictable from the prefix cache."""
        return self.allocator.available_size() + self.tree_cache.evictable_size()

    def used_kv_tokens(self) -> int:
        return self.max_total_num_tokens - self.free_kv_tokens()

    # ---------------------------------------------------------------- alloc

    def _ensure_free(self, num_tokens: int) -> None:
        short = num_tokens - self.allocator.available_size()
        if short > 0:
            self.tree_cache.evict(short)

    def alloc_extend(
        self, prefix_lens: list[int], seq_lens: list[int], req_pool_indices: list[int]
    ) -> torch.Tensor | None:
        """int64 slots for positions [prefix_len, seq_len) of each request."""
        if self.page_size == 1:
            total = sum(s - p for p, s in zip(prefix_lens, seq_lens))
            self._ensure_free(total)
            return self.allocator.alloc(total)
        self._ensure_free(
            sum(page_span(p, s, self.page_size) for p, s in zip(prefix_lens, seq_lens))
        )
        last_locs = self._last_locs(req_pool_indices, prefix_lens)
        return self.allocator.alloc_extend(prefix_lens, seq_lens, last_locs)

    def alloc_decode(self, kv_lens: torch.Tensor, req_pool_indices: torch.Tensor):
        """One slot per running request, for position kv_len."""
        bs = int(kv_lens.numel())
        if self.page_size == 1:
            self._ensure_free(bs)
            return self.allocator.alloc(bs)
        self._ensure_free(sum(page_span(n, n + 1, self.page_size) for n in kv_lens.tolist()))
        seq_lens = (kv_lens + 1).tolist()
        last_locs = self._last_locs(req_pool_indices.tolist(), kv_lens.tolist())
        return self.allocator.alloc_decode(seq_lens, last_locs)

    def alloc_running_slots(self) -> torch.Tensor | None:
        """int64: one slot per running request, for position kv_len, written into its row
        (None: the pool cannot give them now)."""
        kv_lens, pool_indices = self.running.kv_lens(), self.running.req_pool_indices()
        out_cache_loc = self.alloc_decode(kv_lens, pool_indices)
        if out_cache_loc is None:
            return None
        self.req_to_token_pool.write((pool_indices, kv_lens), out_cache_loc)
        return out_cache_loc.to(torch.int64)

    def _last_locs(self, req_pool_indices: list[int], prefix_lens: list[int]) -> list[int]:
        table = self.req_to_token_pool.req_to_token
        return [
            int(table[idx, p - 1]) if p > 0 else -1 for idx, p in zip(req_pool_indices, prefix_lens)
        ]

    def decode_fits(self) -> bool:
        return self.free_kv_tokens() >= decode_need(self.running.reqs, self.page_size)

    # ---------------------------------------------------------------- release

    def release_req(self, req: Req) -> None:
        """Give a leaving (finished, aborted or retracted) request's KV back."""
        if self.drafter is not None:
            self.drafter.release(req)
        if req.req_pool_idx is None:
            return
        tokens = req.all_ids()[: req.kv_len]
        self.tree_cache.cache_finished_req(req, tokens)
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx = None
        req.kv_len = 0
        req.cache_protected_len = 0
        req.last_node = None

    def retract_for_decode(self) -> list[Req]:
        """Move requests back to the waiting queue until decode fits: first a prompt
        prefilled in part (its chunks' KV, locked until now, becomes evictable), then
        running requests."""
        retracted: list[Req] = []
        if self.chunked_req is not None and not self.decode_fits():
            retracted.append(self._retract_chunked())
        while not self.decode_fits() and len(self.running) > 1:
            need = decode_need(self.running.reqs, self.page_size)
            victims = pick_retractions(
                self.running.reqs, need, self.free_kv_tokens(), self.page_size
            )
            if not victims:
                break
            for req in victims:
                self.release_req(req)
            self.running.remove(victims)
            retracted.extend(victims)
        if retracted:
            self.waiting_queue[:0] = retracted
            self.new_token_ratio.on_retract()
            self.num_retracted_reqs += len(retracted)
            logger.info("retracted %d request(s): KV pool short", len(retracted))
        return retracted

    def _retract_chunked(self) -> Req:
        """The partly prefilled request leaves its chunks to the prefix cache (it may
        match them again when readmitted) and waits. Input logprobs it was still making
        are made again from the start (a request retracted before, prefilling its prompt
        and outputs again, keeps the ones it made the first time)."""
        req, self.chunked_req = self.chunked_req, None
        if req.wants_input_logprobs():
            req.logprobs.input_token_logprobs.clear()
            req.logprobs.input_top_logprobs.clear()
            req.logprobs.input_token_ids_logprobs.clear()
        self.release_req(req)
        req.is_chunked = False
        req.extend_len = 0
        return req

    # ---------------------------------------------------------------- integrity

    def check_memory_integrity(self) -> None:
        """With nothing running or queued: free + cached == total; all rows free."""
        self.tree_cache.check_integrity()
        cached = self.tree_cache.total_size()
        if self.page_size > 1:
            cached = -(-cached // self.page_size) * self.page_size
        reserved_slots, reserved_rows = self.reserved_figures()
        self.allocator.check_integrity(num_in_use=reserved_slots, num_cached=cached)
        held = self.req_to_token_pool.size - self.req_to_token_pool.available_size()
        if held != reserved_rows:
            raise AssertionError(f"request slot leak: {held - reserved_rows} rows held while idle")
        self.check_draft_integrity()
