"""Which threads run a CPU forward's parallel work: the kernels' own pool for decode-size
forwards (up to POOL_MAX_TOKENS tokens), torch's OpenMP team for the rest.

A decode step is ~40 parallel regions of a few microseconds each. On
OpenMP each region hands every thread a fixed share and joins at a barrier, so when the
serving processes (HTTP, the client) take a core from a worker, the step waits for it.
The kernels' pool (`sgl-kernel/csrc/cpu/parallel.cpp`) lets any thread claim any chunk,
so the caller never waits for a worker that is off the CPU, and its idle workers sleep
after 50 us instead of polling through the scheduler's Python. Served at concurrency 1
on 2 cores (demo model, alternating with the OpenMP-only build in one run): median ITL
2.1-3.0 -> 1.5-2.2 ms, scheduler CPU per token 4.1-5.8 -> 2.7-3.6 ms (docs/cpu.md).

Two sets of polling workers on a small machine starve each other, so while the pool
serves, torch runs on one thread (its ops left in a decode step are small), and larger
forwards (prefill chunks, decode batches past the bound) keep the kernels and torch on
OpenMP.
"""

from __future__ import annotations

import logging

import torch

from sglang.srt.environ import envs
from sglang.srt.layers import cpu_kernels

logger = logging.getLogger(__name__)

# Forwards of at most this many tokens run on the pool. Served on 2 cores (demo model,
# 128 streams of 128/128 tokens, A/B alternating): 4 -> 64 took concurrency 8 from
# 1,206-1,251 to 1,373-1,466 out tok/s and concurrency 32 from 1,874-1,903 to
# 1,969-2,049; the batch-256 offline run (no other process on the cores) was 9% slower
# with every forward on the pool, so the big batches stay on OpenMP.
POOL_MAX_TOKENS = 64


class ForwardThreads:
    """Switches the process between the two ways for each forward (cheap when unchanged).
    One per process (`configure`): the threads are process-wide state, shared by a
    target and a draft runner."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.on_pool = False

    def before_forward(self, num_tokens: int) -> None:
        on_pool = self.threads > 1 and num_tokens <= POOL_MAX_TOKENS
        if on_pool != self.on_pool:
            self._switch(on_pool)

    def _switch(self, on_pool: bool) -> None:
        kernels = cpu_kernels.load()
        if kernels is None:
            return
        kernels.set_pool_threads(self.threads if on_pool else 0)
        torch.set_num_threads(1 if on_pool else self.threads)
        self.on_pool = on_pool


_current: ForwardThreads | None = None


def configure(threads: int) -> None:
    """The process's CPU forwards use `threads` threads (torch's team set to them now)."""
    global _current
    if _current is not None and _current.on_pool:
        _current._switch(False)
    torch.set_num_threads(threads)
    _current = ForwardThreads(threads)
    logger.info("CPU forwards on %d threads; idle OpenMP workers: %s", threads, openmp_idle())


def openmp_idle() -> str:
    """What libgomp's idle workers do in this process (its environment, read at load)."""
    spin_count = envs.GOMP_SPINCOUNT.get()
    if spin_count is not None:
        return f"spin GOMP_SPINCOUNT={spin_count}, then sleep"
    policy = envs.OMP_WAIT_POLICY.get()
    if policy is None:
        return "spin, then sleep (libgomp's default)"
    if policy.strip().upper() == "PASSIVE":
        return "sleep at once (OMP_WAIT_POLICY=PASSIVE)"
    return f"OMP_WAIT_POLICY={policy}"


def before_forward(num_tokens: int) -> None:
    """Pick the threads for a CPU forward of `num_tokens` tokens (no-op unless configured)."""
    if _current is not None:
        _current.before_forward(num_tokens)
