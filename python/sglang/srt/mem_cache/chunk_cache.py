"""The prefix cache used under --disable-radix-cache: caches nothing.

A request owns all of its KV slots from admission to finish; chunked prefill
keeps them in req_to_token between chunks.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache, CacheableReq, MatchResult

_EMPTY = torch.empty((0,), dtype=torch.int64)


class ChunkCache(BasePrefixCache):
    def __init__(self, req_to_token_pool: Any, token_to_kv_pool_allocator: Any) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.allocator = token_to_kv_pool_allocator

    def reset(self) -> None:
        pass

    def match_prefix(self, key: list[int]) -> MatchResult:
        return MatchResult(device_indices=_EMPTY, last_node=None)

    def cache_finished_req(self, req: CacheableReq, token_ids: list[int]) -> None:
        kv_len = len(token_ids)
        if kv_len > 0:
            row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
            self.allocator.free(row[:kv_len].to(torch.int64))
        req.cache_protected_len = 0
        req.last_node = None

    def cache_unfinished_req(self, req: CacheableReq, token_ids: list[int]) -> None:
        pass

    def inc_lock_ref(self, node: Any) -> None:
        pass

    def dec_lock_ref(self, node: Any) -> None:
        pass

    def evict(self, num_tokens: int) -> int:
        return 0

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def check_integrity(self) -> None:
        pass
