// The KV pool's sequence slots (kv_pool.h: rings and states, one slot per sequence that
// holds them): a free list on the engine thread, shared by the scheduler (a running
// sequence holds one) and the KV leases (a reservation being written by a prefill replica
// holds one, which the imported sequence then keeps).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/common/check.h"

namespace tandem {

class StateSlots {
 public:
  explicit StateSlots(int32_t num_slots) {
    for (int32_t i = num_slots; i-- > 0;) free_.push_back(i);
    size_ = num_slots;
  }
  int32_t size() const { return size_; }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  // A free slot, or -1 when none is.
  int32_t Take() {
    if (free_.empty()) return -1;
    const int32_t s = free_.back();
    free_.pop_back();
    return s;
  }
  void Release(int32_t slot) {
    TANDEM_CHECK(slot >= 0 && slot < size_ && static_cast<int32_t>(free_.size()) < size_) << "state slot " << slot;
    free_.push_back(slot);
  }

 private:
  std::vector<int32_t> free_;
  int32_t size_ = 0;
};

}  // namespace tandem
