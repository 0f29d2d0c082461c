// When a prefill replica stops writing into a decode replica's KV reservation.
//
// The decode replica leases the blocks for KvDestination.lease_ms from the moment it
// reserved them (T_d, its clock) and quarantines them when the lease expires
// (engine/runtime/kv_leases.h). The writer cannot know T_d: every message it sees arrives
// after it. So it counts on its own steady clock from when it received the destination
// (T_r >= T_d) and keeps a margin of a quarter of the lease: it starts no write after
//   T_r + lease_ms - lease_ms / 4,
// which is before the decode replica's expiry T_d + lease_ms as long as the control-plane
// delay T_r - T_d (the Reserve answer, the router, the Prefill call) is under lease_ms / 4
// (7.5 s of the default 30 s). Delay pushes this deadline later, never earlier — which is
// why it is only the first line: it makes the writer of an abandoned lease stop by itself
// (the normal case of a slow or stopped replica), while what makes a late write land
// nowhere harmful is the decode side's quarantine (docs/architecture.md, "KV leases").
#pragma once

#include <chrono>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tandem/v1/internal.pb.h"

namespace tandem {

inline absl::StatusOr<std::chrono::steady_clock::time_point> KvWriteDeadline(
    const v1::KvDestination& d, std::chrono::steady_clock::time_point received) {
  if (d.lease_ms() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("destination.lease_ms: ", d.lease_ms(), " (the reservation's lease must be positive)"));
  }
  return received + std::chrono::milliseconds(d.lease_ms() - d.lease_ms() / 4);
}

inline absl::Status KvWriteDeadlinePassed() {
  return absl::DeadlineExceededError(
      "the destination's lease is about to end (the write deadline passed): no more KV is written into it");
}

}  // namespace tandem
