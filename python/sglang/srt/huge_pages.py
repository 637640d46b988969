"""CPU tensors on 2 MiB pages (Linux transparent huge pages), for the big arrays a step
streams: the linear weights and the KV pool.

A decode step reads every weight byte (batch 1 of a real model is bound by it) and a
large batch reads every cached K/V row; on 4 KiB pages each 4 KiB of that stream is a
TLB entry, and in a VM a TLB miss walks two page tables. Where THP is `madvise` (the
default of most distributions) memory is backed by 2 MiB pages only when advised
before it is first touched, so these arrays are allocated here: a fresh anonymous
mapping 2 MiB larger than asked (never malloc's heap, whose reused chunks already sit on
4 KiB pages: glibc serves blocks up to 32 MiB from it once big blocks have been freed),
its 2 MiB-aligned part advised with MADV_HUGEPAGE, the tensor a view of that part. The
slack before the aligned start is never touched (no resident memory); the mapping goes
when the last tensor viewing it does.
Elsewhere (THP `never`, not Linux, SGLANG_CPU_HUGE_PAGES=0, under 2 MiB) it is a plain
torch.empty. The bytes and the results are the same either way.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import math
import mmap
import sys
from pathlib import Path

import torch

from sglang.srt.environ import envs

logger = logging.getLogger(__name__)

HUGE_PAGE_BYTES = 2 << 20
_MADV_HUGEPAGE = 14  # <sys/mman.h> on Linux, every architecture
_THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@functools.cache
def _madvise():
    """libc's madvise, or None where huge pages are off or unavailable."""
    if not sys.platform.startswith("linux") or not envs.SGLANG_CPU_HUGE_PAGES.get():
        return None
    try:
        mode = _THP_MODE.read_text()
    except OSError:
        return None
    if "[never]" in mode:
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fn = libc.madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def enabled() -> bool:
    """Whether big CPU tensors from `empty` are advised onto 2 MiB pages."""
    return _madvise() is not None


def _anonymous_mapping(nbytes: int) -> mmap.mmap:
    """Fresh private anonymous memory (MAP_SHARED, mmap's default, would be shmem, whose
    huge pages follow another switch)."""
    return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)


def empty(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor, on 2 MiB pages where the kernel gives them
    (see the module docstring); call before anything writes it."""
    madvise = _madvise()
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    if madvise is None or nbytes < HUGE_PAGE_BYTES:
        return torch.empty(shape, dtype=dtype)
    # torch.frombuffer keeps the mapping alive as long as any view of it
    raw = torch.frombuffer(_anonymous_mapping(nbytes + HUGE_PAGE_BYTES), dtype=torch.uint8)
    address = raw.data_ptr()
    start = -address % HUGE_PAGE_BYTES  # bytes to the first 2 MiB boundary
    advised = nbytes // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    if madvise(address + start, advised, _MADV_HUGEPAGE) != 0:
        logger.debug("madvise(MADV_HUGEPAGE) failed: errno %d", ctypes.get_errno())
    return raw[start : start + nbytes].view(dtype).view(shape)
