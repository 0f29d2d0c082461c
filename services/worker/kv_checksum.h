// The checksum both sides compute over a request's KV so the decode replica can tell that
// what arrived is what the prefill replica sent: XXH3-64 of each layer's entries for
// positions [0, n) in order (other layouts: each layer's extents in order), then XXH3-64 of
// the per-layer digests.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/model/kv_pool.h"

namespace tandem {

class KvChecksum {
 public:
  explicit KvChecksum(int64_t num_layers);
  ~KvChecksum();
  // Entries of one layer, continuing where the previous call for that layer stopped.
  void Update(int64_t layer, const void* data, size_t bytes);
  uint64_t Digest() const;

 private:
  std::vector<void*> states_;  // XXH3_state_t* per layer
};

// Decode side, layouts that are not one latent stream: the checksum of a sequence's
// extents (KvPool::SequenceExtents) in `pool`, each added to its layer's digest in order.
uint64_t ExtentsChecksum(const std::byte* pool, int64_t num_layers, std::span<const KvExtent> extents);

// Decode side: the checksum of positions [0, num_positions) read from a pool laid out
// [layer][block][slot][entry_dim] floats through `block_table`.
uint64_t PoolChecksum(const float* pool, int64_t num_layers, int64_t num_blocks, int64_t block_size,
                      int64_t entry_dim, std::span<const int32_t> block_table, int64_t num_positions);

}  // namespace tandem
