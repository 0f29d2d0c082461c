// A fork-join pool for CPU kernels: ParallelFor splits [0, n) into contiguous chunks and
// runs them on the pool's workers and the calling thread, returning when all are done.
// One pool is owned by whoever owns the model (the engine thread); kernels receive it
// the way CUDA kernels receive a stream.
//
// A decode step is hundreds of short ParallelFor calls (one per matrix), a few tens of
// microseconds each: waking a sleeping worker through the kernel for each would cost as
// much as the work. So a worker that finished a chunk, and the caller waiting for the
// workers, spin for a while (50 us; TANDEM_CPU_SPIN_US) before they sleep; between steps
// they sleep.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem::cpu {

class ThreadPool {
 public:
  // num_threads counts the calling thread: 1 means everything runs inline.
  // 0 picks std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over disjoint ranges covering [0, n), each at least `grain` long
  // (except the last). Not reentrant: fn must not call ParallelFor on the same pool.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop(int index);

  std::vector<std::thread> workers_;
  // generation_ and pending_workers_ change under mu_ when a sleeper may need waking, so
  // a wait on the condition variables never misses them; spinners read them lock-free.
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_workers_{0};
  std::atomic<bool> stop_{false};
  // The current job, written before generation_ moves and read after (release/acquire).
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 0;
};

}  // namespace tandem::cpu
