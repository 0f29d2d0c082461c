// Embedding lookup on the GPU: out[r] = float(table[tokens[r]]) for a bf16 table
// [vocab][dim]; token ids must be in [0, vocab) (checked by the caller).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace tandem::cuda {

struct EmbeddingParams {
  const __nv_bfloat16* table = nullptr;  // [vocab][dim]
  const int32_t* tokens = nullptr;       // [num_tokens]
  int64_t num_tokens = 0;
  int64_t dim = 0;
  float* out = nullptr;  // [num_tokens][out_stride]
  int64_t out_stride = 0;
};

cudaError_t EmbeddingGather(const EmbeddingParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
