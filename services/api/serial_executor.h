// Runs posted handlers one at a time, in posting order, on the threads that post them (a
// "strand"): whichever thread finds the executor idle drains it, and a handler that posts
// (directly or through a callback that completes inline) only queues, so handlers never
// overlap and never re-enter each other. Keeping the owner alive while a drain runs is
// the caller's job (request_core.cc holds a reference across Drain).
#pragma once

#include <deque>
#include <functional>
#include <mutex>
#include <utility>

namespace tandem {

class SerialExecutor {
 public:
  using Handler = std::function<void()>;

  // Queues `h`. True when the caller must now call Drain (nobody else is draining).
  bool Enqueue(Handler h) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(h));
    if (draining_) return false;
    draining_ = true;
    return true;
  }

  // Runs queued handlers until none is left. Only after Enqueue returned true.
  void Drain() {
    for (;;) {
      Handler h;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (queue_.empty()) {
          draining_ = false;
          return;
        }
        h = std::move(queue_.front());
        queue_.pop_front();
      }
      h();
    }
  }

 private:
  std::mutex mu_;
  std::deque<Handler> queue_;
  bool draining_ = false;
};

}  // namespace tandem
