// Reads latent KV entries out of one layer of the paged bf16 cache (docs/design.md §4): output
// row i is the entry of position first_position + i of the sequence whose blocks are
// block_table, as bf16 (the expanded attention of a prefill chunk gathers its keys this
// way) or float32 (KV export to the host). With block_table = a list of block ids and
// first_position 0 it copies whole blocks in list order.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace tandem::cuda {

struct KvGatherParams {
  const __nv_bfloat16* kv_cache = nullptr;  // [num_blocks][block_size][entry_dim]
  const int32_t* block_table = nullptr;     // blocks covering the positions read
  int block_size = 64;
  int entry_dim = 0;  // a multiple of 8
  int64_t first_position = 0;
  int64_t num_positions = 0;
  __nv_bfloat16* out_bf16 = nullptr;  // one of the two: [num_positions][out_stride]
  float* out_f32 = nullptr;
  int64_t out_stride = 0;  // a multiple of 8 (bf16) or 4 (float)
};

cudaError_t KvGather(const KvGatherParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
