#include "services/prefill/write_gate.h"

#include <utility>

namespace tandem {

void WriteGate::Resolve(absl::Status s) {
  std::vector<std::function<void(const absl::Status&)>> waiting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_) return;
    state_ = s;
    waiting.swap(waiting_);
  }
  cv_.notify_all();
  for (auto& f : waiting) f(s);
}

std::optional<absl::Status> WriteGate::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

void WriteGate::OnResolved(std::function<void(const absl::Status&)> f) {
  absl::Status now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!state_) {
      waiting_.push_back(std::move(f));
      return;
    }
    now = *state_;
  }
  f(now);
}

absl::Status WriteGate::Wait(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_until(lock, deadline, [this] { return state_.has_value(); })) {
    return absl::DeadlineExceededError("the decode replica did not accept this replica's writes in time");
  }
  return *state_;
}

}  // namespace tandem
