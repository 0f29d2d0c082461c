// Multi-head latent attention over a paged latent KV cache, in the two forms DeepSeek
// models are served with:
//  - expanded: the cached latents are projected by kv_b into per-head keys and values,
//    then ordinary attention runs (cheap when many queries share the keys: prefill);
//  - absorbed: kv_b's key half is folded into the query and its value half applied after
//    the weighted sum, so attention runs over the latents themselves (what decode reads,
//    kv_lora_rank + rope values per token, no per-head expansion).
// Both compute the same function; tests hold them to 1e-4 relative.
#pragma once

#include <cstdint>

#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/weight_matrix.h"

namespace tandem::cpu {

// Where the latent entries of one sequence live: position p is entry
// (block_table[p / block_size] * block_size + p % block_size) of a layer's pool, each
// entry `entry_dim` floats: kv_lora_rank normalized latent values, then the rotated
// rotary key. With position_offset k, position p reads the entry stored at p + k (the MTP
// layer's cache: the entry of slot q holds position q - 1, docs/speculative-decoding.md).
struct LatentCacheView {
  const float* base = nullptr;
  const int32_t* block_table = nullptr;
  int64_t block_size = 0;
  int64_t entry_dim = 0;
  int64_t position_offset = 0;

  const float* Entry(int64_t position) const {
    const int64_t slot = position + position_offset;
    const int64_t block = block_table[slot / block_size];
    return base + (block * block_size + slot % block_size) * entry_dim;
  }
};

struct MlaAttentionParams {
  int64_t num_heads = 0;
  int64_t qk_nope_dim = 0;
  int64_t qk_rope_dim = 0;
  int64_t v_dim = 0;
  int64_t kv_lora_rank = 0;
  float softmax_scale = 1.0f;
  // Queries of `num_tokens` consecutive tokens of one sequence, the first at
  // `first_position`; layout [token][head][nope | rope], the rope part already rotated.
  const float* q = nullptr;
  int64_t q_stride = 0;
  int64_t num_tokens = 0;
  int64_t first_position = 0;
  // Holds positions [0, first_position + num_tokens); token t attends to [0, first_position + t].
  LatentCacheView cache;
  const WeightMatrix* kv_b = nullptr;  // [num_heads * (qk_nope_dim + v_dim), kv_lora_rank]
  float* out = nullptr;                // [token][head * v_dim]
  int64_t out_stride = 0;
};

void MlaAttentionExpanded(const MlaAttentionParams& p, ThreadPool& pool);
void MlaAttentionAbsorbed(const MlaAttentionParams& p, ThreadPool& pool);

}  // namespace tandem::cpu
