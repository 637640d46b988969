"""KV slot allocator (token and paged) and the request-to-token table."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool


def test_alloc_free_and_integrity():
    alloc = TokenToKVPoolAllocator(10)
    a = alloc.alloc(4)
    b = alloc.alloc(6)
    assert alloc.alloc(1) is None and not alloc.can_alloc(1)
    slots = torch.cat([a, b]).tolist()
    assert sorted(slots) == list(range(1, 11))  # slot 0 is the padding slot
    alloc.check_integrity(num_in_use=10)
    alloc.free(a)
    assert alloc.available_size() == 4
    alloc.check_integrity(num_in_use=6)
    with pytest.raises(AssertionError, match="leak"):
        alloc.check_integrity(num_in_use=0)


def test_double_free_is_detected():
    alloc = TokenToKVPoolAllocator(4)
    a = alloc.alloc(2)
    alloc.free(a)
    alloc.free(a)
    with pytest.raises(AssertionError, match="duplicate"):
        alloc.check_integrity()


def test_paged_alloc_extend_and_decode_fill_pages_in_order():
    ps = 4
    alloc = TokenToKVPoolAllocator(32, page_size=ps)
    first = alloc.alloc_extend([0, 0], [6, 3], [-1, -1])
    a, b = first[:6], first[6:]
    assert a[0] % ps == 0 and torch.equal(a[:4], a[0] + torch.arange(4))
    assert torch.equal(a[4:], a[4] + torch.arange(2)) and a[4] % ps == 0
    # decode continues request a's last page before taking a new one
    nxt = alloc.alloc_decode([7, 4], [int(a[-1]), int(b[-1])])
    assert nxt.tolist() == [int(a[-1]) + 1, int(b[-1]) + 1]
    assert alloc.available_size() == 32 - 3 * ps
    alloc.check_integrity(num_in_use=3 * ps)
    alloc.free(torch.cat([a, nxt[:1]]))
    alloc.check_integrity(num_in_use=ps)


def test_paged_alloc_returns_none_when_short():
    alloc = TokenToKVPoolAllocator(8, page_size=4)
    assert alloc.alloc_extend([0], [9], [-1]) is None
    assert alloc.alloc(8) is not None and alloc.alloc(1) is None


def test_req_to_token_pool():
    pool = ReqToTokenPool(3, 16, "cpu")
    rows = pool.alloc(2)
    assert len(rows) == 2 and pool.available_size() == 1 and pool.alloc(2) is None
    pool.write((rows[0], slice(0, 3)), torch.tensor([5, 6, 7]))
    assert pool.req_to_token[rows[0], :3].tolist() == [5, 6, 7]
    pool.free(rows[0])
    assert pool.available_size() == 2


def test_kv_pool_layout_and_write():
    pool = MHATokenToKVPool(8, torch.float32, head_num=2, head_dim=4, layer_num=2, device="cpu")
    assert pool.get_key_buffer(0).shape == (9, 2, 4)
    assert torch.count_nonzero(pool.get_kv_buffer(1)[0]) == 0  # padding slot is zero
    k, v = torch.ones(2, 2, 4), torch.full((2, 2, 4), 2.0)
    pool.set_kv_buffer(1, torch.tensor([3, 5]), k, v)
    assert torch.equal(pool.get_key_buffer(1)[3], k[0])
    assert torch.equal(pool.get_value_buffer(1)[5], v[1])
