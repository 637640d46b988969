from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from sglang.srt.mem_cache.chunk_cache import ChunkCache
from sglang.srt.mem_cache.radix_cache import RadixCache


class FakeAllocator:
    """Slot allocator with page granularity; frees whole pages."""

    def __init__(self, size: int, page_size: int = 1) -> None:
        self.size, self.page_size = size, page_size
        self.free_pages = list(range(size // page_size))

    def alloc(self, n: int) -> torch.Tensor:
        num_pages = -(-n // self.page_size)
        assert num_pages <= len(self.free_pages)
        pages, self.free_pages = self.free_pages[:num_pages], self.free_pages[num_pages:]
        slots = [p * self.page_size + i for p in pages for i in range(self.page_size)]
        return torch.tensor(slots[:n], dtype=torch.int64)

    def free(self, slots: torch.Tensor) -> None:
        pages = sorted(set((slots // self.page_size).tolist()))
        assert not set(pages) & set(self.free_pages), "double free"
        self.free_pages.extend(pages)

    def available_size(self) -> int:
        return len(self.free_pages) * self.page_size


class FakeReqToTokenPool:
    def __init__(self, size: int, max_len: int) -> None:
        self.req_to_token = torch.zeros((size, max_len), dtype=torch.int32)


@dataclass
class FakeReq:
    req_pool_idx: int
    cache_protected_len: int = 0
    last_node: Any = None


def make(page_size: int = 1, size: int = 4096):
    alloc = FakeAllocator(size, page_size)
    pool = FakeReqToTokenPool(8, 512)
    return RadixCache(pool, alloc, page_size=page_size), alloc, pool


def run_request(cache, alloc, pool, tokens: list[int], idx: int = 0) -> FakeReq:
    """Admit (match + lock + alloc the rest), then finish."""
    req = FakeReq(idx)
    match = cache.match_prefix(tokens)
    cache.inc_lock_ref(match.last_node)
    req.last_node, req.cache_protected_len = match.last_node, match.prefix_len
    row = pool.req_to_token[idx]
    row[: match.prefix_len] = match.device_indices.to(torch.int32)
    new = alloc.alloc(len(tokens) - match.prefix_len)
    row[match.prefix_len : len(tokens)] = new.to(torch.int32)
    return req


def test_insert_and_match_prefix():
    cache, alloc, pool = make()
    req = run_request(cache, alloc, pool, [1, 2, 3, 4, 5])
    cache.cache_finished_req(req, [1, 2, 3, 4, 5])
    m = cache.match_prefix([1, 2, 3, 9])
    assert m.prefix_len == 3
    assert m.device_indices.tolist() == pool.req_to_token[0, :3].tolist()
    cache.check_integrity()
    assert cache.evictable_size() == 5 and cache.protected_size() == 0


def test_duplicate_slots_are_freed():
    cache, alloc, pool = make(size=64)
    for idx in range(3):
        req = run_request(cache, alloc, pool, [7, 8, 9, 10], idx)
        cache.cache_finished_req(req, [7, 8, 9, 10])
    assert cache.total_size() == 4
    assert alloc.available_size() + cache.total_size() == 64
    cache.check_integrity()


def test_lock_protects_from_eviction():
    cache, alloc, pool = make(size=64)
    req = run_request(cache, alloc, pool, [1, 2, 3, 4])
    cache.cache_finished_req(req, [1, 2, 3, 4])
    m = cache.match_prefix([1, 2])
    cache.inc_lock_ref(m.last_node)
    assert cache.protected_size() == 2 and cache.evictable_size() == 2
    assert cache.evict(100) == 2
    assert cache.match_prefix([1, 2, 3, 4]).prefix_len == 2
    cache.dec_lock_ref(m.last_node)
    assert cache.evict(100) == 2
    assert alloc.available_size() == 64
    cache.check_integrity()


def test_lru_evicts_oldest_leaf_first():
    cache, alloc, pool = make()
    for idx, toks in enumerate([[1, 1, 1], [2, 2, 2], [3, 3, 3]]):
        req = run_request(cache, alloc, pool, toks, idx)
        cache.cache_finished_req(req, toks)
    cache.match_prefix([1, 1, 1])  # touch: 2 is now the oldest
    cache.evict(1)
    assert cache.match_prefix([2, 2, 2]).prefix_len == 0
    assert cache.match_prefix([1, 1, 1]).prefix_len == 3


def test_unfinished_req_moves_lock_and_rewrites_slots():
    cache, alloc, pool = make()
    req = run_request(cache, alloc, pool, [5, 6, 7, 8])
    cache.cache_unfinished_req(req, [5, 6, 7, 8])
    assert req.cache_protected_len == 4 and cache.protected_size() == 4
    other = run_request(cache, alloc, pool, [5, 6, 7, 8, 9], idx=1)
    assert other.cache_protected_len == 4
    cache.cache_finished_req(other, [5, 6, 7, 8, 9])
    cache.cache_finished_req(req, [5, 6, 7, 8, 1, 2][:4])
    assert cache.protected_size() == 0
    cache.check_integrity()


@pytest.mark.parametrize("page_size", [1, 4])
def test_random_workload_conserves_slots(page_size: int):
    rng = random.Random(0)
    cache, alloc, pool = make(page_size=page_size, size=4096)
    for step in range(200):
        prefix = [rng.randrange(3)] * rng.randrange(0, 12)
        toks = prefix + [rng.randrange(50) for _ in range(rng.randrange(1, 20))]
        req = run_request(cache, alloc, pool, toks, idx=step % 8)
        if rng.random() < 0.3:
            cache.cache_unfinished_req(req, toks)
        cache.cache_finished_req(req, toks)
        if rng.random() < 0.1:
            cache.evict(rng.randrange(1, 30))
        cache.check_integrity()
        assert alloc.available_size() + cache.total_size() == 4096
        assert cache.protected_size() == 0


def test_page_aligned_matching():
    cache, alloc, pool = make(page_size=4)
    toks = list(range(10))
    req = run_request(cache, alloc, pool, toks)
    cache.cache_finished_req(req, toks)
    assert cache.total_size() == 8
    assert cache.match_prefix(list(range(7))).prefix_len == 4
    assert cache.match_prefix(list(range(12))).prefix_len == 8


def test_chunk_cache_frees_everything():
    alloc = FakeAllocator(64)
    pool = FakeReqToTokenPool(2, 32)
    cache = ChunkCache(pool, alloc)
    req = FakeReq(0)
    pool.req_to_token[0, :5] = alloc.alloc(5).to(torch.int32)
    assert cache.match_prefix([1, 2, 3]).prefix_len == 0
    cache.cache_unfinished_req(req, [1, 2, 3, 4, 5])
    cache.cache_finished_req(req, [1, 2, 3, 4, 5])
    assert alloc.available_size() == 64
