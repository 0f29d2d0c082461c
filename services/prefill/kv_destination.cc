#include "services/prefill/kv_destination.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

// a * b, or false when it does not fit in 64 bits (both non-negative).
bool Mul(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) return false;
  *out = a * b;
  return true;
}

}  // namespace

absl::Status CheckKvDestination(const KvDestinationClaim& d, const KvPoolGeometry& local, int64_t num_tokens) {
  const KvPoolGeometry& p = d.pool;
  if (p.entry_dim != local.entry_dim || p.num_layers != local.num_layers || p.block_size != local.block_size ||
      p.bytes_per_value != local.bytes_per_value) {
    return absl::FailedPreconditionError(absl::StrCat(
        "destination: KV geometry (", p.num_layers, " layers, blocks of ", p.block_size, ", entries of ", p.entry_dim,
        " x ", p.bytes_per_value, " bytes) differs from this replica's (", local.num_layers, ", ", local.block_size,
        ", ", local.entry_dim, " x ", local.bytes_per_value, ")"));
  }
  if (local.block_size <= 0 || local.entry_dim <= 0 || local.num_layers <= 0 || local.bytes_per_value <= 0) {
    return absl::InvalidArgumentError("destination: this replica's own KV geometry is empty");
  }
  if (p.num_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("destination.num_blocks: ", p.num_blocks, " (must be positive)"));
  }
  if (num_tokens <= 0 || static_cast<uint64_t>(num_tokens) >
                             static_cast<uint64_t>(d.block_ids.size()) * static_cast<uint64_t>(p.block_size)) {
    return absl::InvalidArgumentError(absl::StrCat("destination.block_ids: ", d.block_ids.size(),
                                                   " blocks cannot hold ", num_tokens, " tokens"));
  }
  for (int32_t b : d.block_ids) {
    if (b < 0 || b >= p.num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("destination.block_ids: ", b, " outside the pool of ", p.num_blocks, " blocks"));
    }
  }
  // The whole claimed pool must lie inside the memory the descriptor describes: the
  // largest offset written is below num_layers * num_blocks * block bytes.
  uint64_t entry = 0, block = 0, layer = 0, pool = 0;
  if (!Mul(static_cast<uint64_t>(p.entry_dim), static_cast<uint64_t>(p.bytes_per_value), &entry) ||
      !Mul(entry, static_cast<uint64_t>(p.block_size), &block) ||
      !Mul(block, static_cast<uint64_t>(p.num_blocks), &layer) ||
      !Mul(layer, static_cast<uint64_t>(p.num_layers), &pool) || pool > d.region_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "destination.num_blocks: a pool of ", p.num_blocks, " blocks of ", p.num_layers, " layers does not fit the ",
        d.region_bytes, " bytes its memory descriptor describes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<KvExtent>> CheckKvStreamDestination(const KvStreamDestinationClaim& d,
                                                               const std::vector<KvStream>& streams,
                                                               const KvPool::Geometry& local, int64_t num_tokens) {
  if (d.pool.num_layers != local.num_layers || d.pool.block_size != local.block_size) {
    return absl::FailedPreconditionError(absl::StrCat("destination: KV geometry (", d.pool.num_layers,
                                                      " layers, blocks of ", d.pool.block_size,
                                                      ") differs from this replica's (", local.num_layers, ", ",
                                                      local.block_size, ")"));
  }
  absl::StatusOr<size_t> bytes = KvPool::BytesFor(streams, d.pool);
  if (!bytes.ok()) return absl::InvalidArgumentError(absl::StrCat("destination.num_blocks: ", bytes.status().message()));
  if (*bytes > d.region_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("destination.num_blocks: a pool of ", d.pool.num_blocks,
                                                   " blocks and ", d.pool.num_sequence_slots, " slots (", *bytes,
                                                   " bytes) does not fit the ", d.region_bytes,
                                                   " bytes its memory descriptor describes"));
  }
  absl::StatusOr<std::vector<KvExtent>> extents =
      KvPool::SequenceExtents(streams, d.pool, d.block_ids, d.state_slot, num_tokens);
  if (!extents.ok()) return absl::InvalidArgumentError(absl::StrCat("destination: ", extents.status().message()));
  return extents;
}

}  // namespace tandem
