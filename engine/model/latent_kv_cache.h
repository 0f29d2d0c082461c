// Storage of the latent KV cache: for every layer, `num_blocks` blocks of `block_size`
// token entries, each entry kv_lora_rank + qk_rope_head_dim floats (docs/design.md §4). Which
// blocks a sequence owns is the caller's business (the block manager's); the forward pass
// is handed a block table per sequence.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/model/kv_pool.h"
#include "kernels/common/check.h"
#include "kernels/cpu/mla_attention.h"

namespace tandem {

inline constexpr int64_t kKvBlockSize = 64;

class LatentKvCache {
 public:
  LatentKvCache(int64_t num_layers, int64_t num_blocks, int64_t entry_dim,
                int64_t block_size = kKvBlockSize)
      : num_layers_(num_layers), num_blocks_(num_blocks), entry_dim_(entry_dim), block_size_(block_size),
        owned_(static_cast<size_t>(num_layers * num_blocks * block_size * entry_dim), 0.0f),
        data_(owned_.data()) {}
  // Over caller-owned memory of at least BytesFor(...) bytes (e.g. memory a transfer layer
  // allocated so that peers can write into it), which must outlive the cache.
  LatentKvCache(float* memory, int64_t num_layers, int64_t num_blocks, int64_t entry_dim,
                int64_t block_size = kKvBlockSize)
      : num_layers_(num_layers), num_blocks_(num_blocks), entry_dim_(entry_dim), block_size_(block_size),
        data_(memory) {}
  LatentKvCache(LatentKvCache&& o) noexcept
      : num_layers_(o.num_layers_), num_blocks_(o.num_blocks_), entry_dim_(o.entry_dim_), block_size_(o.block_size_),
        owned_(std::move(o.owned_)), data_(owned_.empty() ? o.data_ : owned_.data()) {}
  LatentKvCache(const LatentKvCache&) = delete;
  LatentKvCache& operator=(const LatentKvCache&) = delete;

  // A view of `pool`'s one stream: per token, float32, on every layer (checked), whose
  // geometry is this class's (kv_pool.h).
  static LatentKvCache Of(KvPool& pool) {
    TANDEM_CHECK_EQ(pool.streams().size(), 1u) << DescribeKvStreams(pool.streams());
    const KvStream& s = pool.streams()[0];
    TANDEM_CHECK(s.granularity == KvGranularity::kPerToken && s.dtype == "f32" &&
                 static_cast<int64_t>(s.layers.size()) == pool.geometry().num_layers)
        << DescribeKvStreams(pool.streams());
    return LatentKvCache(reinterpret_cast<float*>(pool.memory().data() + pool.StreamOffset(0)),
                         pool.geometry().num_layers, pool.geometry().num_blocks, s.width,
                         pool.geometry().block_size);
  }

  static size_t BytesFor(int64_t num_layers, int64_t num_blocks, int64_t entry_dim, int64_t block_size = kKvBlockSize) {
    return static_cast<size_t>(num_layers * num_blocks * block_size * entry_dim) * sizeof(float);
  }

  int64_t num_layers() const { return num_layers_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t entry_dim() const { return entry_dim_; }

  // The entry of `position` of a sequence whose blocks are `block_table`.
  float* Entry(int64_t layer, std::span<const int32_t> block_table, int64_t position) {
    const int64_t b = position / block_size_;
    TANDEM_CHECK_LT(b, static_cast<int64_t>(block_table.size())) << "position " << position;
    const int32_t block = block_table[b];
    TANDEM_CHECK(block >= 0 && block < num_blocks_) << "block " << block;
    return LayerBase(layer) + (block * block_size_ + position % block_size_) * entry_dim_;
  }

  cpu::LatentCacheView View(int64_t layer, std::span<const int32_t> block_table, int64_t position_offset = 0) {
    return {.base = LayerBase(layer), .block_table = block_table.data(), .block_size = block_size_,
            .entry_dim = entry_dim_, .position_offset = position_offset};
  }

  // The whole pool: [layer][block][slot][entry_dim] floats.
  std::span<float> data() {
    return {data_, static_cast<size_t>(num_layers_ * num_blocks_ * block_size_ * entry_dim_)};
  }

  // One layer's bytes of one block (for KV export/import).
  std::span<float> Block(int64_t layer, int32_t block) {
    return {LayerBase(layer) + static_cast<int64_t>(block) * block_size_ * entry_dim_,
            static_cast<size_t>(block_size_ * entry_dim_)};
  }

 private:
  float* LayerBase(int64_t layer) {
    TANDEM_CHECK(layer >= 0 && layer < num_layers_);
    return data_ + layer * num_blocks_ * block_size_ * entry_dim_;
  }

  int64_t num_layers_, num_blocks_, entry_dim_, block_size_;
  std::vector<float> owned_;  // empty when the memory is the caller's
  float* data_;
};

}  // namespace tandem
