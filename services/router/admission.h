// The router's bounded queues, one per role (docs/design.md §6): requests that have not yet
// got their first token (waiting for or inside a prefill) count against the prefill
// queue; requests waiting for KV room on a decode replica count against the decode
// queue. A request that would go over a limit is refused with RESOURCE_EXHAUSTED and a
// retry hint (the `grpc-retry-pushback-ms` trailer gRPC's retry policy honours, and the
// same figure in the message) instead of queueing without bound.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "services/api/downstream.h"

namespace tandem {

class Admission final : public AdmissionQueues {
 public:
  using Queue = AdmissionQueues::Queue;

  struct Limits {
    int64_t max_prefill_queue = 4096;
    int64_t max_decode_queue = 1024;
    std::chrono::milliseconds retry_after{500};
  };

  explicit Admission(Limits limits) : limits_(limits) {}

  // Takes a place in `q`; false when the queue is full (nothing taken).
  bool TryEnter(Queue q) override;
  void Leave(Queue q) override;

  int64_t size(Queue q) const { return counter(q).load(std::memory_order_relaxed); }
  int64_t limit(Queue q) const { return q == Queue::kPrefill ? limits_.max_prefill_queue : limits_.max_decode_queue; }
  std::chrono::milliseconds retry_after() const override { return limits_.retry_after; }

  // The status a refused request ends with (the caller adds the trailer, see
  // kRetryPushbackKey).
  absl::Status Refusal(Queue q) const override;
  static constexpr const char* kRetryPushbackKey = "grpc-retry-pushback-ms";

 private:
  std::atomic<int64_t>& counter(Queue q) { return q == Queue::kPrefill ? prefill_ : decode_; }
  const std::atomic<int64_t>& counter(Queue q) const { return q == Queue::kPrefill ? prefill_ : decode_; }

  Limits limits_;
  std::atomic<int64_t> prefill_{0};
  std::atomic<int64_t> decode_{0};
};

}  // namespace tandem
