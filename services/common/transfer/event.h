// A one-shot event (set once, waited for by any number of threads), on std::mutex and
// std::condition_variable so that ThreadSanitizer sees the hand-off (Debian's abseil is not
// instrumented, so absl::Mutex and absl::Notification would hide races from it).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/time/time.h"

namespace tandem::transfer::internal {

class Event {
 public:
  void Notify() {
    std::lock_guard<std::mutex> lock(mu_);
    set_ = true;
    cv_.notify_all();
  }
  bool HasBeenNotified() const {
    std::lock_guard<std::mutex> lock(mu_);
    return set_;
  }
  void Wait() const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return set_; });
  }
  // False when `timeout` passed first.
  bool WaitFor(absl::Duration timeout) const {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [this] { return set_; });
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool set_ = false;
};

}  // namespace tandem::transfer::internal
