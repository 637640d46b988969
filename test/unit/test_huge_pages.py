"""Big CPU tensors on 2 MiB transparent huge pages (sglang.srt.huge_pages): the same bytes
and results, aligned and advised where the kernel offers THP, plain tensors elsewhere."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

from sglang.srt import huge_pages
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.model_loader.loader import place_on_huge_pages

MiB = 1 << 20


@pytest.fixture
def fresh_policy():
    """Re-read SGLANG_CPU_HUGE_PAGES and the THP mode around the test."""
    huge_pages._madvise.cache_clear()
    yield
    huge_pages._madvise.cache_clear()


def thp_offered() -> bool:
    try:
        return "[never]" not in huge_pages._THP_MODE.read_text()
    except OSError:
        return False


def faults_in_huge_pages() -> bool:
    """Whether a first touch of an advised region is given a 2 MiB page at once (THP defrag
    `always`, `madvise` or `defer+madvise`: the fault compacts for it)."""
    try:
        mode = (huge_pages._THP_MODE.parent / "defrag").read_text()
    except OSError:
        return False
    return any(f"[{m}]" in mode for m in ("always", "madvise", "defer+madvise"))


def anon_huge_kib(address: int) -> int:
    """AnonHugePages of the mapping of this process that holds `address`."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(part, 16) for part in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "AnonHugePages:":
                return int(line.split()[1])
    return 0


def test_policy_follows_the_kernel_and_the_switch(fresh_policy, monkeypatch):
    monkeypatch.delenv("SGLANG_CPU_HUGE_PAGES", raising=False)
    assert huge_pages.enabled() == (sys.platform.startswith("linux") and thp_offered())
    monkeypatch.setenv("SGLANG_CPU_HUGE_PAGES", "0")
    huge_pages._madvise.cache_clear()
    assert not huge_pages.enabled()
    t = huge_pages.empty((4 * MiB,), torch.uint8)
    assert t.shape == (4 * MiB,) and t.is_contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_big_tensors_are_aligned_and_hold_their_values(fresh_policy, dtype):
    shape = (3 * MiB // 64 + 5, 64)  # not a multiple of 2 MiB: the tail is on small pages
    t = huge_pages.empty(shape, dtype)
    assert t.shape == shape and t.dtype == dtype and t.is_contiguous()
    values = torch.randn(shape).to(dtype)
    t.copy_(values)
    assert torch.equal(t, values)
    if huge_pages.enabled():
        assert t.data_ptr() % huge_pages.HUGE_PAGE_BYTES == 0
        if faults_in_huge_pages():  # else khugepaged collapses them later, in its own time
            assert anon_huge_kib(t.data_ptr()) >= 2048  # touched and backed by 2 MiB pages
    small = huge_pages.empty((16, 16), dtype)  # under 2 MiB: a plain tensor
    assert small.shape == (16, 16)


def test_big_tensors_get_fresh_pages_after_big_frees(fresh_policy):
    # Once a big block is freed glibc serves blocks up to its raised mmap threshold from
    # its heap, whose reused memory is already on 4 KiB pages: the advice would come too
    # late there. Touch and free heap memory the way a weight load does, then allocate.
    for nbytes in (48 * MiB, 8 * MiB, 8 * MiB):  # the first raises the threshold
        scratch = torch.empty(nbytes, dtype=torch.uint8)
        scratch.fill_(1)
        del scratch
    t = huge_pages.empty((3 * MiB,), torch.uint8)
    t.fill_(2)
    assert bool((t == 2).all())
    if huge_pages.enabled() and faults_in_huge_pages():  # (this VM kind: THP madvise)
        assert anon_huge_kib(t.data_ptr()) >= 2048


def test_loader_moves_big_parameters_and_keeps_ties(fresh_policy):
    embed = nn.Embedding(1024, 1024)  # 4 MiB of float32
    head = nn.Linear(1024, 1024, bias=False)
    head.weight = embed.weight  # tied, as in a tie_word_embeddings model
    model = nn.ModuleDict({"embed": embed, "head": head, "norm": nn.LayerNorm(1024)})
    norm_ptr = model["norm"].weight.data_ptr()
    place_on_huge_pages(model)
    assert model["head"].weight is model["embed"].weight
    assert model["embed"].weight.shape == (1024, 1024)
    assert model["norm"].weight.data_ptr() == norm_ptr  # 4 KiB: left where it was
    if huge_pages.enabled():
        assert model["embed"].weight.data_ptr() % huge_pages.HUGE_PAGE_BYTES == 0


def test_kv_pool_layers_on_huge_pages(fresh_policy):
    pool = MHATokenToKVPool(8192, torch.bfloat16, 2, 64, 2, "cpu", 1)  # 4 MiB a layer
    for buf in pool.kv_buffer:
        assert buf.shape == (8193, 2, 2, 64) and buf.is_contiguous()
        if huge_pages.enabled():
            assert buf.data_ptr() % huge_pages.HUGE_PAGE_BYTES == 0
