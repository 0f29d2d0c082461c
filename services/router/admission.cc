#include "services/router/admission.h"

#include "absl/strings/str_cat.h"
#include "kernels/common/check.h"

namespace tandem {

bool Admission::TryEnter(Queue q) {
  std::atomic<int64_t>& c = counter(q);
  int64_t n = c.load(std::memory_order_relaxed);
  do {
    if (n >= limit(q)) return false;
  } while (!c.compare_exchange_weak(n, n + 1, std::memory_order_relaxed));
  return true;
}

void Admission::Leave(Queue q) {
  const int64_t before = counter(q).fetch_sub(1, std::memory_order_relaxed);
  TANDEM_CHECK_GE(before, 1) << "Admission::Leave without TryEnter";
}

absl::Status Admission::Refusal(Queue q) const {
  const char* what = q == Queue::kPrefill ? "prefill queue (requests waiting for their first token)"
                                          : "decode queue (requests waiting for KV cache room)";
  const char* flag = q == Queue::kPrefill ? "--max-prefill-queue" : "--max-decode-queue";
  return absl::ResourceExhaustedError(absl::StrCat("the router's ", what, " is full (", limit(q), " requests, ", flag,
                                                "); retry after ", limits_.retry_after.count(), " ms"));
}

}  // namespace tandem
