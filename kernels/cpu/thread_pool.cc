#include "kernels/cpu/thread_pool.h"

#include <algorithm>

namespace tandem::cpu {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    pending_workers_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  start_cv_.notify_all();
  // The caller takes chunk 0.
  fn(0, std::min(chunk, n));
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return pending_workers_ == 0; });
  job_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* job;
    int64_t n, chunk;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      chunk = job_chunk_;
    }
    const int64_t begin = index * chunk;
    if (begin < n) (*job)(begin, std::min(begin + chunk, n));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_workers_ == 0) done_cv_.notify_one();
    }
  }
}

}  // namespace tandem::cpu
