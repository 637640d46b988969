"""KV cache memory: request-to-token table, KV pool, slot allocator."""

from __future__ import annotations

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

__all__ = ["MHATokenToKVPool", "ReqToTokenPool", "TokenToKVPoolAllocator"]
