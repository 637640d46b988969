"""The kernels' work-claiming pool (sgl-kernel/csrc/cpu/parallel.cpp) and the switch
between it and OpenMP per forward (sglang.srt.layers.cpu_threads).

Every index runs exactly once whatever the thread count, grain and timing; an error in
a chunk reaches the caller and the pool keeps serving; callers on several threads at
once (the second runs its range inline) and a forked child (whose pool threads are gone)
still get every index. Kernels give the same bits on the pool as on OpenMP, and small
forwards take the pool with torch on one thread, larger ones OpenMP.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import torch

from sglang.srt.layers import cpu_kernels, cpu_threads


@pytest.fixture(scope="module")
def kernels():
    module = cpu_kernels.load()
    assert module is not None, "the CPU kernels did not build (see the log)"
    return module


@pytest.fixture
def restore_threads(kernels):
    """Torch's thread count and the pool's setting, restored after the test."""
    before = torch.get_num_threads()
    yield
    kernels.set_pool_threads(0)
    torch.set_num_threads(before)
    cpu_threads._current = None


@pytest.mark.parametrize("num_threads", [1, 2, 4])
@pytest.mark.parametrize("n,grain", [(1, 1), (7, 1), (100, 3), (1000, 1000), (1001, 1000), (70_000, 1)])
def test_every_index_runs_once(kernels, num_threads, n, grain):
    for _ in range(20):  # different interleavings of the caller and the workers
        visits, _ = kernels.parallel_for_visits(n, grain, num_threads, -1)
        assert torch.equal(visits, torch.ones(n, dtype=torch.int32))


@pytest.mark.parametrize("num_threads", [2, 3])
@pytest.mark.parametrize("n,work_per_item", [(2, 1 << 20), (9, 1 << 15), (1000, 1 << 12), (70_000, 1)])
def test_claimed_chunks_under_openmp_run_every_index_once(kernels, restore_threads, num_threads, n,
                                                          work_per_item):
    """parallel_for_claimed on torch's OpenMP team (linear_packed, decode attention): the
    threads claim shrinking chunks from one counter; none is skipped or run twice."""
    kernels.set_pool_threads(0)
    torch.set_num_threads(num_threads)
    for _ in range(20):
        visits = kernels.parallel_for_claimed_visits(n, work_per_item)
        assert torch.equal(visits, torch.ones(n, dtype=torch.int32))


def test_pool_follows_the_thread_count(kernels):
    for num_threads in (4, 2, 3):
        kernels.parallel_for_visits(64, 1, num_threads, -1)
        assert kernels.pool_workers() == num_threads - 1


def test_workers_take_chunks(kernels):
    """More than the calling thread runs chunks of a long range (the workers wake)."""
    runners = set()
    for _ in range(200):
        _, runner = kernels.parallel_for_visits(1 << 22, 1, 2, -1)
        runners |= set(runner.unique().tolist())
        if len(runners) > 1:
            break
    assert len(runners) > 1


def test_an_error_in_a_chunk_reaches_the_caller_and_the_pool_keeps_serving(kernels):
    for throw_at in (0, 537, 999):
        with pytest.raises(RuntimeError, match="raised"):
            kernels.parallel_for_visits(1000, 10, 2, throw_at)
        visits, _ = kernels.parallel_for_visits(1000, 10, 2, -1)
        assert torch.equal(visits, torch.ones(1000, dtype=torch.int32))


def test_callers_on_several_threads_at_once(kernels):
    failures = []

    def call_many():
        for _ in range(50):
            visits, _ = kernels.parallel_for_visits(10_000, 7, 2, -1)
            if not torch.equal(visits, torch.ones(10_000, dtype=torch.int32)):
                failures.append(visits)

    callers = [threading.Thread(target=call_many) for _ in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in callers) and not failures


FORK_SCRIPT = """
import os, sys, torch
from sglang.srt.layers import cpu_kernels, cpu_threads
k = cpu_kernels.load()
torch.set_num_threads(2)
k.parallel_for_visits(10_000, 1, 2, -1)  # the pool and its worker exist
pid = os.fork()
if pid == 0:
    visits, _ = k.parallel_for_visits(10_000, 1, 2, -1)
    os._exit(0 if bool((visits == 1).all()) else 3)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_runs_kernels(kernels):
    """fork() keeps only the calling thread: the child's pool must not wait for workers
    it no longer has. (10,000 indices: torch fills the tensors inline, without an OpenMP
    team, which GNU OpenMP cannot rebuild in a forked child.)"""
    out = subprocess.run([sys.executable, "-c", FORK_SCRIPT], timeout=120, capture_output=True)
    assert out.returncode == 0, out.stderr.decode()[-2000:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_give_the_same_bits_on_the_pool(kernels, restore_threads, dtype):
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 256, generator=gen).to(dtype)
    w = torch.randn(8192, 256, generator=gen).to(dtype)
    on_openmp, on_pool = torch.empty(3, 8192, dtype=dtype), torch.empty(3, 8192, dtype=dtype)
    kernels.linear_small_m(on_openmp, x, w, None)
    kernels.set_pool_threads(2)
    assert kernels.pool_threads() == 2
    kernels.linear_small_m(on_pool, x, w, None)
    assert torch.equal(on_pool, on_openmp)


def test_small_forwards_take_the_pool_and_large_ones_openmp(kernels, restore_threads):
    cpu_threads.configure(2)
    assert kernels.pool_threads() == 0 and torch.get_num_threads() == 2
    cpu_threads.before_forward(1)
    assert kernels.pool_threads() == 2 and torch.get_num_threads() == 1
    cpu_threads.before_forward(cpu_threads.POOL_MAX_TOKENS + 1)
    assert kernels.pool_threads() == 0 and torch.get_num_threads() == 2
    cpu_threads.configure(1)  # one thread: nothing to share out
    cpu_threads.before_forward(1)
    assert kernels.pool_threads() == 0 and torch.get_num_threads() == 1
