// Threads that run the decode replica's heavy per-request work off the gRPC callback
// threads: checking the KV a prefill replica wrote (a checksum over every byte of the
// reservation, on the host or with a GPU kernel) before the request is handed to the
// engine. FIFO; the queue is bounded by the reservations (one task per Decode call).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem {

class ChecksumWorker {
 public:
  explicit ChecksumWorker(int threads);
  // Runs queued tasks to the end, then joins.
  ~ChecksumWorker();
  ChecksumWorker(const ChecksumWorker&) = delete;
  ChecksumWorker& operator=(const ChecksumWorker&) = delete;

  void Post(std::function<void()> task);

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace tandem
