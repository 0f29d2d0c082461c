// The checks a prefill replica makes of a KvDestination before any byte moves, and the
// byte offsets of its writes, over plain data (no proto, no engine runtime, no transport) so that
// they can be fuzzed with forged messages under AddressSanitizer
// (tests/unit/services/prefill/kv_destination_fuzz_test.cc).
//
// Every write is bounded three times: here (the claimed geometry must be this replica's,
// every block id inside the claimed pool, and the claimed pool inside the memory the
// descriptor describes), by TransferBatch::Put (each put inside the descriptor's length),
// and by the transport against the memory really mapped (the in-process engine's
// registry, UCX's shared-memory segment as /proc/self/maps shows it; CUDA IPC: the
// allocation's range from the driver, cuda_ipc.h).
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/kv_pool.h"

namespace tandem {

struct KvPoolGeometry {
  int64_t num_layers = 0;
  int64_t num_blocks = 0;  // blocks per layer
  int64_t block_size = 0;  // tokens per block
  int64_t entry_dim = 0;   // values per token per layer
  int64_t bytes_per_value = 0;
};

// What a destination message claims.
struct KvDestinationClaim {
  KvPoolGeometry pool;
  std::span<const int32_t> block_ids;  // in position order
  uint64_t region_bytes = 0;           // the memory descriptor's length
};

// OK when `d` can take `num_tokens` positions of this replica's KV (`local`: its layout;
// local.num_blocks is not used): FAILED_PRECONDITION for another geometry,
// INVALID_ARGUMENT (naming the field) for block ids outside the pool, too few blocks, or a
// pool larger than the described memory. Never overflows, whatever the claim.
absl::Status CheckKvDestination(const KvDestinationClaim& d, const KvPoolGeometry& local, int64_t num_tokens);

// Layouts that are not one latent stream: what a destination claims of its KvPool.
struct KvStreamDestinationClaim {
  KvPool::Geometry pool;
  std::span<const int32_t> block_ids;  // in position order
  int64_t state_slot = -1;
  uint64_t region_bytes = 0;  // the memory descriptor's length
};

// The extents to write (KvPool::SequenceExtents) when `d` can take `num_tokens` positions
// of `streams` (this replica's layout, whose layers and block size `local` has):
// FAILED_PRECONDITION for other layers or blocks, INVALID_ARGUMENT (naming the field) for
// blocks or a slot outside the pool, too few blocks, or a pool larger than the described
// memory. Never overflows, whatever the claim.
absl::StatusOr<std::vector<KvExtent>> CheckKvStreamDestination(const KvStreamDestinationClaim& d,
                                                               const std::vector<KvStream>& streams,
                                                               const KvPool::Geometry& local, int64_t num_tokens);

// Byte offset of (layer, block, slot)'s entry in a pool of `pool`'s layout:
// ((layer * num_blocks + block) * block_size + slot) * entry_dim * bytes_per_value. Only for
// a destination CheckKvDestination accepted (then it is below region_bytes).
inline uint64_t KvEntryOffset(const KvPoolGeometry& pool, int64_t layer, int64_t block, int64_t slot) {
  return static_cast<uint64_t>(((layer * pool.num_blocks + block) * pool.block_size + slot) * pool.entry_dim) *
         static_cast<uint64_t>(pool.bytes_per_value);
}

}  // namespace tandem
