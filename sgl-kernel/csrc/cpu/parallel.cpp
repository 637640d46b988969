// The kernels' work-claiming thread pool (see parallel.h).
//
// One job at a time: the submitter writes the job, then publishes a ticket
// [generation:32][chunks:16][next chunk:16]; a thread claims chunk i by a CAS of next from
// i to i + 1 (only while i < chunks), runs it and counts it done. The submitter claims
// too, then waits for the done count. A claim proves the job is live (it cannot finish
// before the claimed chunk is counted), so the job's fields read after a claim are that
// job's: the submitter writes the next job only after every chunk is done.
#include "parallel.h"

#include <ATen/Parallel.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace sgl_cpu {
namespace {

constexpr int64_t kChunksPerThread = 8;  // room to rebalance when a thread falls behind
constexpr int64_t kMaxChunks = (1 << 16) - 1;
// How long an idle worker polls for the next job before it sleeps: long enough to span the
// gaps between a step's kernels (a few us), short enough to free the core in the
// scheduler's Python between steps (~0.1-0.3 ms) for the processes that share it.
constexpr auto kIdlePoll = std::chrono::microseconds(50);
constexpr int kPausesPerClockRead = 64;
constexpr int kWaitSpinsBeforeYield = 1 << 12;  // submitter, waiting on a preempted chunk

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

thread_local bool t_in_task = false;  // inside a chunk, or submitting: nested calls run inline

// Sets t_in_task for a scope and puts back what it was (also when the scope throws).
class InTask {
 public:
  InTask() : outer_(t_in_task) { t_in_task = true; }
  ~InTask() { t_in_task = outer_; }
  InTask(const InTask&) = delete;
  InTask& operator=(const InTask&) = delete;

 private:
  bool outer_;
};

class Pool {
 public:
  explicit Pool(int64_t workers) {
    threads_.reserve(workers);
    for (int64_t i = 0; i < workers; ++i) threads_.emplace_back([this] { worker_loop(); });
  }

  ~Pool() {
    stop_.store(true);
    epoch_.fetch_add(1);
    epoch_.notify_all();
    for (auto& t : threads_) t.join();
  }

  int64_t workers() const { return static_cast<int64_t>(threads_.size()); }

  void run(int64_t begin, int64_t end, int64_t chunk, int64_t chunks, ChunkFn fn, void* ctx) {
    begin_ = begin, end_ = end, chunk_ = chunk, fn_ = fn, ctx_ = ctx;
    error_ = nullptr;
    done_.store(0, std::memory_order_relaxed);
    const uint64_t gen = ++generation_;
    ticket_.store((gen << 32) | (uint64_t(chunks) << 16), std::memory_order_release);
    epoch_.fetch_add(1, std::memory_order_release);
    epoch_.notify_all();
    while (run_one()) {
    }
    for (int spins = 0; done_.load(std::memory_order_acquire) < chunks; ++spins) {
      if (spins < kWaitSpinsBeforeYield) {
        cpu_relax();
      } else {
        std::this_thread::yield();  // the chunk's thread is off the CPU: let it back on
      }
    }
    if (error_) std::rethrow_exception(error_);
  }

 private:
  // Claims and runs one chunk of the current job; false when none is left.
  bool run_one() {
    uint64_t t = ticket_.load(std::memory_order_acquire);
    uint64_t next;
    do {
      next = t & 0xffff;
      if (next >= ((t >> 16) & 0xffff)) return false;
    } while (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel,
                                            std::memory_order_acquire));
    const int64_t b = begin_ + int64_t(next) * chunk_;
    {
      InTask in_task;
      try {
        fn_(ctx_, b, std::min(end_, b + chunk_));
      } catch (...) {
        std::lock_guard<std::mutex> guard(error_mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
    done_.fetch_add(1, std::memory_order_release);
    return true;
  }

  void worker_loop() {
    uint32_t seen = epoch_.load(std::memory_order_acquire);
    while (!stop_.load(std::memory_order_relaxed)) {
      while (run_one()) {
      }
      const auto give_up = std::chrono::steady_clock::now() + kIdlePoll;
      for (int spins = 1; epoch_.load(std::memory_order_acquire) == seen; ++spins) {
        cpu_relax();
        if (spins % kPausesPerClockRead == 0 && std::chrono::steady_clock::now() > give_up) break;
      }
      epoch_.wait(seen, std::memory_order_acquire);  // returns at once if it moved
      seen = epoch_.load(std::memory_order_acquire);
    }
  }

  std::atomic<uint64_t> ticket_{0};
  std::atomic<uint32_t> epoch_{0};  // bumped per job (and at stop); idle workers wait on it
  std::atomic<int64_t> done_{0};
  std::atomic<bool> stop_{false};
  uint64_t generation_ = 0;
  // The current job, written by the submitter before it publishes the ticket.
  int64_t begin_ = 0, end_ = 0, chunk_ = 1;
  ChunkFn fn_ = nullptr;
  void* ctx_ = nullptr;
  std::mutex error_mu_;
  std::exception_ptr error_;
  std::vector<std::thread> threads_;
};

std::atomic<int64_t> g_pool_threads{0};  // set_pool_threads

// One pool per process, sized to the threads of its last job less the caller, and
// rebuilt when that changes. Submitters take g_submit; a thread that finds it taken runs its range inline.
std::mutex g_submit;
Pool* g_pool = nullptr;

void forget_pool_in_child() {
  // fork() copies only the forking thread: the workers are gone (the old pool is leaked,
  // not joined) and g_submit may have been held by another thread.
  g_pool = nullptr;
  new (&g_submit) std::mutex();
}

Pool* pool_for(int64_t threads) {
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr, forget_pool_in_child);
    return true;
  }();
  (void)registered;
  if (g_pool == nullptr || g_pool->workers() != threads - 1) {
    delete g_pool;
    g_pool = nullptr;
    g_pool = new Pool(threads - 1);
  }
  return g_pool;
}

}  // namespace

void parallel_for_chunks(int64_t begin, int64_t end, int64_t grain, int64_t threads, ChunkFn fn,
                         void* ctx) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t max_chunks = std::min(kMaxChunks, threads * kChunksPerThread);
  const int64_t chunks_by_grain = (n + grain - 1) / grain;
  if (threads <= 1 || chunks_by_grain <= 1 || t_in_task || at::in_parallel_region()) {
    fn(ctx, begin, end);
    return;
  }
  std::unique_lock<std::mutex> lock(g_submit, std::try_to_lock);
  if (!lock.owns_lock()) {  // another thread's job is running: this one runs alone
    fn(ctx, begin, end);
    return;
  }
  const int64_t chunks_wanted = std::min(chunks_by_grain, max_chunks);
  const int64_t chunk = (n + chunks_wanted - 1) / chunks_wanted;
  const int64_t chunks = (n + chunk - 1) / chunk;
  InTask in_task;
  pool_for(threads)->run(begin, end, chunk, chunks, fn, ctx);
}

void set_pool_threads(int64_t threads) { g_pool_threads.store(std::max<int64_t>(0, threads)); }

int64_t pool_threads() { return g_pool_threads.load(std::memory_order_relaxed); }

int64_t pool_workers() {
  std::lock_guard<std::mutex> lock(g_submit);
  return g_pool == nullptr ? 0 : g_pool->workers();
}

}  // namespace sgl_cpu
