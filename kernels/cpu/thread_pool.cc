#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tandem::cpu {
namespace {

// How long a worker waits for the next job, and the caller for the workers, before
// sleeping: 50 us, or TANDEM_CPU_SPIN_US (0: sleep at once, the pool's behaviour before
// it spun; for benchmarks that compare the two in one run, as GOMP_SPINCOUNT does for OpenMP).
std::chrono::microseconds SpinTime() {
  static const std::chrono::microseconds spin = [] {
    const char* v = std::getenv("TANDEM_CPU_SPIN_US");
    if (v == nullptr || *v == '\0') return std::chrono::microseconds(50);
    char* end = nullptr;
    const long us = std::strtol(v, &end, 10);
    return std::chrono::microseconds(*end == '\0' && us >= 0 && us <= 1000000 ? us : 50);
  }();
  return spin;
}

inline void Relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Spins until pred() or SpinTime() passed; whether pred() held.
template <typename Pred>
bool SpinFor(Pred pred) {
  if (pred()) return true;
  const std::chrono::microseconds spin = SpinTime();
  if (spin.count() == 0) return false;
  const auto start = std::chrono::steady_clock::now();
  const auto until = start + spin, yield_from = start + spin / 5;
  for (;;) {
    for (int k = 0; k < 64; ++k) {
      if (pred()) return true;
      Relax();
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) return pred();
    // Past the gaps within a step, a thread of another process waiting for this core (more
    // threads than cores) runs first: spinning through its turn doubled a 2-core
    // machine's time for two engine tests at once.
    if (now >= yield_from) std::this_thread::yield();
  }
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_release);
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_parts = std::max<int64_t>(1, n / grain);
  const int64_t parts = std::min<int64_t>(num_threads(), max_parts);
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  const int64_t chunk = (n + parts - 1) / parts;
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  pending_workers_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();
  // The caller takes chunk 0.
  fn(0, std::min(chunk, n));
  auto done = [this] { return pending_workers_.load(std::memory_order_acquire) == 0; };
  if (!SpinFor(done)) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, done);
  }
  job_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    auto ready = [&] {
      return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen;
    };
    if (!SpinFor(ready)) {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, ready);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    const std::function<void(int64_t, int64_t)>* job = job_;
    const int64_t n = job_n_, chunk = job_chunk_;
    const int64_t begin = index * chunk;
    if (begin < n) (*job)(begin, std::min(begin + chunk, n));
    if (pending_workers_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // The caller may be asleep: wake it under the lock it checks the count under.
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

}  // namespace tandem::cpu
