// parallel_for for the kernels: chunks claimed from a shared counter by the calling thread
// and a pool of workers, so the caller never waits for a thread that has not started.
//
// at::parallel_for (OpenMP, static split) hands each team thread a fixed share and joins
// at a barrier: when a worker is descheduled (a 2-core server, where the HTTP process and
// the client take turns on the cores) the caller finishes its share and spins until the
// worker runs again, for up to a scheduler time slice. Here every chunk goes to whichever
// thread claims it first; the caller claims too and returns once every chunk is done, so
// a worker that never woke costs nothing, and one preempted mid-chunk costs one chunk.
// Idle workers spin briefly, then sleep, leaving the core to other processes.
//
// The pool serves while set_pool_threads turns it on (forwards of a few tokens, chosen per
// forward by sglang.srt.layers.cpu_threads), OpenMP otherwise. Results do not depend on
// which thread runs a chunk: a chunk's outputs are its own.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace sgl_cpu {

// Items per task so that a task does at least this many multiply-adds: a call this small
// runs inline on the calling thread (waking another thread costs more).
constexpr int64_t kMinTaskWork = 1 << 15;

inline int64_t grain_for(int64_t work_per_item) {
  return std::max<int64_t>(1, kMinTaskWork / std::max<int64_t>(1, work_per_item));
}

// The threads of the pool while it serves the kernels (set_pool_threads), else 0: then
// they run on at::parallel_for (OpenMP), as the torch ops do. The pool serves the small
// forwards (a decode step of a stream or two) with torch itself set to one thread, so
// no OpenMP team polls beside it: two sets of workers polling at once on a small machine
// starve each other's chunks (measured: a batch-32 decode step 5.9 -> 10.4 ms with the
// kernels on the pool and the torch ops on OpenMP).
void set_pool_threads(int64_t threads);
int64_t pool_threads();

// Threads a parallel_for may use now: the pool's while it serves, else torch's.
inline int64_t parallel_threads() {
  const int64_t pool = pool_threads();
  return pool > 0 ? pool : at::get_num_threads();
}

// fn(chunk_begin, chunk_end) over [begin, end) in chunks of at least `grain` items, on the
// pool with `threads` threads (the caller and threads - 1 workers). Runs inline (one call,
// fn(begin, end)) when the range is one grain, threads is 1, or the caller is inside a
// parallel_for or an OpenMP region.
using ChunkFn = void (*)(void* ctx, int64_t begin, int64_t end);
void parallel_for_chunks(int64_t begin, int64_t end, int64_t grain, int64_t threads, ChunkFn fn,
                         void* ctx);

template <typename F>
void pool_parallel_for(int64_t begin, int64_t end, int64_t grain, int64_t threads, const F& f) {
  parallel_for_chunks(
      begin, end, grain, threads,
      [](void* ctx, int64_t b, int64_t e) { (*static_cast<const F*>(ctx))(b, e); },
      const_cast<void*>(static_cast<const void*>(&f)));
}

// f(chunk_begin, chunk_end) over [begin, end), each item about `work_per_item`
// multiply-adds: on the pool while it serves, else at::parallel_for; inline when the
// whole range is under one task's work.
template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t work_per_item, const F& f) {
  const int64_t grain = grain_for(work_per_item);
  const int64_t pool = pool_threads();
  if (pool > 1) {
    pool_parallel_for(begin, end, grain, pool, f);
  } else {
    at::parallel_for(begin, end, grain, f);
  }
}

// parallel_for whose chunks are claimed, under OpenMP too: each team thread takes chunks
// from a shared counter until none is left, each chunk 1 / (kClaimShare x threads) of
// what is left (guided: large chunks first, single grains at the end, so the threads
// finish together). For calls of many equal items where one thread can fall behind (its
// core shared with the caller's serial work or another process) or items differ in cost
// (attention over requests of different lengths): a static split makes the early thread
// spin at the join, and fixed chunks of a quarter share left up to one chunk of
// imbalance: guided chunks ran the demo model's prefill-size linears (2048 rows) 6-11%
// faster than those on the 2-core AVX2 EPYC (A/B alternating), the same at 256 rows.
template <typename F>
void parallel_for_claimed(int64_t begin, int64_t end, int64_t work_per_item, const F& f) {
  const int64_t grain = grain_for(work_per_item);
  const int64_t pool = pool_threads();
  if (pool > 1) {  // the pool's chunks are claimed already
    pool_parallel_for(begin, end, grain, pool, f);
    return;
  }
  const int64_t threads = at::get_num_threads();
  if (threads <= 1 || end - begin <= grain || at::in_parallel_region()) {
    f(begin, end);
    return;
  }
  constexpr int64_t kClaimShare = 2;
  std::atomic<int64_t> next{begin};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    int64_t b = next.load(std::memory_order_relaxed);
    while (b < end) {
      const int64_t chunk = std::max(grain, (end - b) / (kClaimShare * threads));
      if (next.compare_exchange_weak(b, b + chunk, std::memory_order_relaxed)) {
        f(b, std::min(end, b + chunk));
        b = next.load(std::memory_order_relaxed);
      }  // else b holds the counter's current value: try again from there
    }
  });
}

// Workers the pool has now (threads - 1 once a parallel_for has run; 0 before).
int64_t pool_workers();

}  // namespace sgl_cpu
