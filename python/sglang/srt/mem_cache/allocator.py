"""KV slot allocator: hands out token slots in pages of `page_size`.

Slots are 1..size (slot 0 is the pool's padding slot). With page_size > 1 a
page is `page_size` consecutive slots starting at a multiple of page_size, and
a request's tokens fill its pages in order, so slot // page_size is its page.
"""

from __future__ import annotations

import torch


class TokenToKVPoolAllocator:
    """Free-list allocator over KV slots. Pure bookkeeping: no tensor holds KV here.

    The scheduler holds it: `alloc` before a forward, `free` when a request's KV
    is released (or handed to the prefix cache, which frees on eviction).
    """

    def __init__(self, size: int, page_size: int = 1, device: torch.device | str = "cpu"):
        assert page_size >= 1
        self.size = size - size % page_size if page_size > 1 else size
        self.page_size = page_size
        self.device = device
        self.clear()

    def clear(self) -> None:
        # page p covers slots [p * page_size, (p + 1) * page_size); page 0 holds slot 0
        num_pages = self.size // self.page_size
        self.free_pages = torch.arange(1, num_pages + 1, dtype=torch.int64)
        if self.page_size == 1:
            self.free_pages = torch.arange(1, self.size + 1, dtype=torch.int64)
        self._num_free = int(self.free_pages.numel())

    # -- page_size == 1 (and whole pages otherwise) -----------------------------------

    def available_size(self) -> int:
        """Free token slots."""
        return self._num_free * self.page_size

    def can_alloc(self, need_size: int) -> bool:
        return need_size <= self.available_size()

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """int64[need_size] slot ids, or None when short. Page-aligned: whole pages."""
        num_pages = -(-need_size // self.page_size)
        if num_pages > self._num_free:
            return None
        pages = self._take_pages(num_pages)
        return self._page_slots(pages)[:need_size] if self.page_size > 1 else pages

    def free(self, free_index: torch.Tensor) -> None:
        """Return slots; with page_size > 1 a page is freed when any of its slots is given."""
        if free_index.numel() == 0:
            return
        free_index = free_index.to("cpu", torch.int64)
        pages = free_index if self.page_size == 1 else torch.unique(free_index // self.page_size)
        self.free_pages = torch.cat([self.free_pages[: self._num_free], pages])
        self._num_free = int(self.free_pages.numel())

    def _take_pages(self, num_pages: int) -> torch.Tensor:
        taken = self.free_pages[:num_pages]
        self.free_pages = self.free_pages[num_pages:]
        self._num_free -= num_pages
        return taken

    def _page_slots(self, pages: torch.Tensor) -> torch.Tensor:
        offsets = torch.arange(self.page_size, dtype=torch.int64)
        return (pages.unsqueeze(1) * self.page_size + offsets).reshape(-1)

    # -- paged allocation that continues a request's last page ----------------------

    def alloc_extend(
        self, prefix_lens: list[int], seq_lens: list[int], last_locs: list[int]
    ) -> torch.Tensor | None:
        """Slots for positions [prefix_len, seq_len) of each request, concatenated.

        `last_locs[i]` is the slot of request i's token at prefix_len - 1 (-1 if
        none); its page's remaining slots are used before new pages are taken.
        """
        if self.page_size == 1:
            new_len = sum(seq_lens) - sum(prefix_lens)
            return self.alloc(new_len) if new_len else torch.empty(0, dtype=torch.int64)
        plan = [self._plan(p, s, last) for p, s, last in zip(prefix_lens, seq_lens, last_locs)]
        if sum(n for _, n in plan) > self._num_free:
            return None
        out = [
            self._fill(first, n_new, s - p)
            for (first, n_new), p, s in zip(plan, prefix_lens, seq_lens)
        ]
        return torch.cat(out) if out else torch.empty(0, dtype=torch.int64)

    def alloc_decode(self, seq_lens: list[int], last_locs: list[int]) -> torch.Tensor | None:
        """One slot per request for position seq_len - 1 (seq_lens after this step)."""
        return self.alloc_extend([s - 1 for s in seq_lens], seq_lens, last_locs)

    def _plan(self, prefix_len: int, seq_len: int, last_loc: int) -> tuple[list[int], int]:
        """(slots left in the current page, pages to take) for one request."""
        ps = self.page_size
        used_in_page = prefix_len % ps
        tail = (
            []
            if used_in_page == 0 or last_loc < 0
            else list(range(last_loc + 1, last_loc + 1 + ps - used_in_page))
        )
        need = max(0, (seq_len - prefix_len) - len(tail))
        return tail, -(-need // ps)

    def _fill(self, tail: list[int], num_pages: int, n: int) -> torch.Tensor:
        fresh = self._page_slots(self._take_pages(num_pages))
        return torch.cat([torch.tensor(tail, dtype=torch.int64), fresh])[:n]

    # -- invariants --------------------------------------------------------------------

    def check_integrity(self, num_in_use: int = 0, num_cached: int = 0) -> None:
        """Assert free + cached + in use == total, with no duplicate or out-of-range page.

        `num_in_use` / `num_cached` are token slots held by running requests and by
        the prefix cache, as the caller counts them (pass page-rounded counts).
        """
        free = self.free_pages[: self._num_free]
        unit = "slots" if self.page_size == 1 else "pages"
        limit = self.size if self.page_size == 1 else self.size // self.page_size
        if torch.unique(free).numel() != free.numel():
            raise AssertionError(f"allocator: duplicate free {unit}")
        if free.numel() and (int(free.min()) < 1 or int(free.max()) > limit):
            raise AssertionError(f"allocator: free {unit} out of range [1, {limit}]")
        total = self.available_size() + num_in_use + num_cached
        if total != self.size:
            raise AssertionError(
                f"allocator leak: free {self.available_size()} + in use {num_in_use} + "
                f"cached {num_cached} != total {self.size}"
            )
