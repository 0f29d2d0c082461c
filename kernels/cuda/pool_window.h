// DeepSeek-V4's compressor on the GPU: one compressed KV entry from a closed window of
// `slots` rows, per channel a softmax over the slots of their gates (the position bias
// already added) and the weighted sum of their kv values. The arithmetic of
// engine/model/deepseek_v4/v4_math.cc PoolWindow (max, then the sum of exp(g - max) in slot
// order, then sum_s kv * (exp(g - max) / sum) in slot order). Windows are rows of
// `slots` consecutive rows each, as a prefill chunk's compressor projections lay them out.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda {

struct PoolWindowParams {
  const float* kv = nullptr;    // [windows][slots][stride]: width values per row
  const float* gate = nullptr;  // [windows][slots][stride]
  int64_t stride = 0;
  int64_t windows = 0;
  int slots = 0;  // 1..1024 (CSA 2 x ratio with the overlap, HCA 128)
  int64_t width = 0;
  float* out = nullptr;  // [windows][out_stride]
  int64_t out_stride = 0;
};

cudaError_t PoolWindow(const PoolWindowParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
