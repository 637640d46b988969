"""build_kv_page_table (the flashinfer backend's page table) against a plain-Python
reference on random request-to-token tables, page sizes 1 and 4. Pure torch, on cpu;
importing the backend module must not import flashinfer."""

from __future__ import annotations

import sys

import pytest
import torch

from sglang.srt.layers.attention.flashinfer_backend import build_kv_page_table


def reference(table: list[list[int]], rows: list[int], lens: list[int], page_size: int):
    indptr, indices, last = [0], [], []
    for row, n in zip(rows, lens):
        pages = [table[row][pos] // page_size for pos in range(0, n, page_size)]
        indices += pages
        indptr.append(indptr[-1] + len(pages))
        last.append(n - (len(pages) - 1) * page_size if pages else 0)
    return indptr, indices, last


def random_table(lens: list[int], page_size: int, gen) -> tuple[torch.Tensor, list[int]]:
    """Each request gets random whole pages (slot = page * page_size + offset) in a random row."""
    num_rows, max_len = len(lens) + 2, max(lens) + page_size
    table = torch.zeros(num_rows, max_len, dtype=torch.int32)
    rows = torch.randperm(num_rows, generator=gen)[: len(lens)].tolist()
    free_pages = (torch.randperm(sum(lens) + 8, generator=gen) + 1).tolist()
    for row, n in zip(rows, lens):
        count = -(-n // page_size)
        pages, free_pages = torch.tensor(free_pages[:count]), free_pages[count:]
        slots = pages.repeat_interleave(page_size) * page_size + torch.arange(page_size).repeat(
            count
        )
        table[row, : count * page_size] = slots.to(torch.int32)
    return table, rows


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("lens", [[1], [4, 5, 8, 3], [17, 1, 64, 9, 12], [7, 0, 2]])
@pytest.mark.parametrize("host_total", [False, True])
def test_matches_the_reference(page_size, lens, host_total):
    gen = torch.Generator().manual_seed(len(lens) * 10 + page_size)
    table, rows = random_table([max(n, 1) for n in lens], page_size, gen)
    total = sum(-(-n // page_size) for n in lens) if host_total else None
    indptr, indices, last = build_kv_page_table(
        table, torch.tensor(rows), torch.tensor(lens), page_size, num_pages_total=total
    )
    want = reference(table.tolist(), rows, lens, page_size)
    assert (indptr.tolist(), indices.tolist(), last.tolist()) == want
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32


def test_page_size_one_indices_are_the_slots():
    table = torch.tensor([[5, 9, 2, 0], [7, 3, 0, 0]], dtype=torch.int32)
    indptr, indices, last = build_kv_page_table(
        table, torch.tensor([1, 0]), torch.tensor([2, 3]), 1
    )
    assert (indptr.tolist(), indices.tolist(), last.tolist()) == (
        [0, 2, 5],
        [7, 3, 5, 9, 2],
        [1, 1],
    )


def test_module_imports_without_flashinfer():
    assert "flashinfer" not in sys.modules
