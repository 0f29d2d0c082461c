// The decode side's KV reservations (leases) and the quarantine of expired ones.
//
// A reservation's blocks are written by a prefill replica from outside this process (UCX
// puts, a memcpy into shared memory, a CUDA IPC copy), and nothing here can stop such a
// writer. So a reservation that expires (no SubmitImported in time) does not free its
// blocks: they go into quarantine, still allocated, and leave it only
//   - when the caller says no writer can still touch them (Release: the router's
//     Decode.Release, sent only once the prefill call ended, or the Decode call that
//     follows a completed prefill), or
//   - after quarantine_seconds more, the bounded fallback for a writer nobody hears of
//     again. The prefill replica's writer stops starting writes before the lease ends
//     (its own deadline, services/prefill/kv_write_deadline.h), so the fallback only
//     matters for a write started in time and then held up longer than the quarantine
//     (docs/architecture.md, "KV leases", states the argument and what is left).
// Quarantined blocks count as in use; the block manager cannot hand them out.
//
// Not thread-safe: the engine thread owns it. Times are the caller's clock (seconds).
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/runtime/block_manager.h"

namespace tandem {

struct KvLeaseStats {
  int64_t expired = 0;              // leases that expired unused (each went into quarantine)
  int64_t quarantine_released = 0;  // quarantines ended by Release (the writer ended)
  int64_t quarantine_timeouts = 0;  // quarantines ended by the fallback bound
  int64_t quarantined_blocks = 0;   // blocks in quarantine now
  int64_t quarantined_leases = 0;   // leases in quarantine now
};

class KvLeases {
 public:
  // `blocks` must outlive this object.
  KvLeases(BlockManager* blocks, double lease_seconds, double quarantine_seconds)
      : blocks_(blocks), lease_seconds_(lease_seconds), quarantine_seconds_(quarantine_seconds) {}

  struct Reservation {
    std::vector<int32_t> blocks;
    int32_t num_tokens = 0;
  };

  // Whether `id` holds a reservation, live or quarantined (an id in use).
  bool Contains(const std::string& id) const { return live_.contains(id) || quarantined_.contains(id); }
  // Reserves `num_blocks` blocks for `num_tokens` tokens under `id` until now + the lease.
  // RESOURCE_EXHAUSTED when the block manager has too few; INVALID_ARGUMENT for an id in use.
  absl::StatusOr<std::vector<int32_t>> Reserve(const std::string& id, int32_t num_blocks, int32_t num_tokens,
                                               double now);
  // The live reservation of `id` (null: none, or expired). Valid until the next call.
  const Reservation* Find(const std::string& id) const {
    auto it = live_.find(id);
    return it == live_.end() ? nullptr : &it->second.r;
  }
  // Hands a live reservation's blocks to its sequence (the lease ends, the blocks stay
  // allocated). nullopt when `id` has no live reservation (expired, or never made).
  std::optional<Reservation> Take(const std::string& id);
  // No writer can still touch `id`'s blocks: frees them, live or quarantined. False when
  // `id` holds nothing.
  bool Release(const std::string& id);
  // Moves leases expired by `now` into quarantine and frees quarantines past their bound.
  void Tick(double now);
  // When Tick has something to do next (+infinity: nothing pending).
  double NextDeadline() const;
  // Frees everything (shutdown: no peer writes into a pool that is going away matter).
  void ReleaseAll();

  KvLeaseStats stats() const;
  bool empty() const { return live_.empty() && quarantined_.empty(); }

 private:
  struct Held {
    Reservation r;
    double until = 0;  // live: the lease's end; quarantined: the fallback's end
  };
  BlockManager* blocks_;
  const double lease_seconds_;
  const double quarantine_seconds_;
  std::map<std::string, Held> live_;
  std::map<std::string, Held> quarantined_;
  int64_t quarantined_blocks_ = 0;
  KvLeaseStats counts_;
};

}  // namespace tandem
