// Writes new tokens' latent KV entries into the paged bf16 cache of one layer (docs/design.md
// §4): entry i goes to slot slots[i] = block * block_size + offset. The entries arrive in
// float32 (kv_lora_rank normalized latent, then rope_dim rotated rotary key) and are
// stored in bf16 (round to nearest even). A negative slot (or one past num_slots) skips
// the entry. No allocation inside.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace tandem::cuda {

struct KvCacheWriteParams {
  const float* entries = nullptr;  // [num_tokens][entry_dim], row stride entries_stride
  int64_t entries_stride = 0;
  const int32_t* slots = nullptr;  // [num_tokens]
  int num_tokens = 0;
  int entry_dim = 0;
  __nv_bfloat16* kv_cache = nullptr;  // one layer: [num_slots][entry_dim]
  int64_t num_slots = 0;              // num_blocks * block_size
};

cudaError_t KvCacheWrite(const KvCacheWriteParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
