// The leases this process may still write into: a lease is added before this replica
// announces itself as its writer (Decode.BeginWrites) and removed once its writes are
// complete or will never be made. Prefill.WriterState answers from it, which is what lets
// a decode replica end a quarantine whose EndWrites was lost. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace tandem {

class KvWriterRegistry {
 public:
  void Add(const std::string& lease_id, uint64_t token) {
    std::lock_guard<std::mutex> lock(mu_);
    ++held_[{lease_id, token}];
  }
  void Remove(const std::string& lease_id, uint64_t token) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = held_.find({lease_id, token});
    if (it == held_.end()) return;
    if (--it->second == 0) held_.erase(it);
    if (held_.empty()) cv_.notify_all();
  }
  bool Holds(const std::string& lease_id, uint64_t token) const {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.contains({lease_id, token});
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.size();
  }
  // Blocks until no lease is held, or `deadline` (false then).
  bool WaitEmpty(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, deadline, [this] { return held_.empty(); });
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<std::string, uint64_t>, int> held_;  // write sessions per lease
};

}  // namespace tandem
