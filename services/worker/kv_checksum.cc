#include "services/worker/kv_checksum.h"

#include <algorithm>

#include "xxhash.h"

namespace tandem {

KvChecksum::KvChecksum(int64_t num_layers) {
  for (int64_t i = 0; i < num_layers; ++i) {
    XXH3_state_t* s = XXH3_createState();
    XXH3_64bits_reset(s);
    states_.push_back(s);
  }
}

KvChecksum::~KvChecksum() {
  for (void* s : states_) XXH3_freeState(static_cast<XXH3_state_t*>(s));
}

void KvChecksum::Update(int64_t layer, const void* data, size_t bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(states_[layer]), data, bytes);
}

uint64_t KvChecksum::Digest() const {
  std::vector<uint64_t> digests;
  for (void* s : states_) digests.push_back(XXH3_64bits_digest(static_cast<XXH3_state_t*>(s)));
  return XXH3_64bits(digests.data(), digests.size() * sizeof(uint64_t));
}

uint64_t ExtentsChecksum(const std::byte* pool, int64_t num_layers, std::span<const KvExtent> extents) {
  KvChecksum sum(num_layers);
  for (const KvExtent& e : extents) sum.Update(e.layer, pool + e.offset, e.bytes);
  return sum.Digest();
}

uint64_t PoolChecksum(const float* pool, int64_t num_layers, int64_t num_blocks, int64_t block_size,
                      int64_t entry_dim, std::span<const int32_t> block_table, int64_t num_positions) {
  KvChecksum sum(num_layers);
  for (int64_t l = 0; l < num_layers; ++l) {
    // Runs of consecutive positions within a block are contiguous in memory.
    for (int64_t p = 0; p < num_positions;) {
      const int64_t block = block_table[p / block_size];
      const int64_t slot = p % block_size;
      const int64_t n = std::min(block_size - slot, num_positions - p);
      const float* src = pool + ((l * num_blocks + block) * block_size + slot) * entry_dim;
      sum.Update(l, src, static_cast<size_t>(n * entry_dim) * sizeof(float));
      p += n;
    }
  }
  return sum.Digest();
}

}  // namespace tandem
