// A mixture-of-experts combine on the GPU: per token, out = (sum over j of w_j * rows_j)
// + add, the sum starting from zero and taken over j in order (the routed experts'
// outputs in ascending expert order, as the CPU engine sums them), then the shared
// expert's output added. Rows are named by pointer, so the experts' outputs are read
// where their grouped computation left them. A null row pointer is skipped (a token
// routed nowhere).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda {

struct WeightedRowSumParams {
  const float* const* rows = nullptr;  // [tokens][k] device pointers to `width` floats, or null
  const float* weights = nullptr;      // [tokens][k]
  int k = 0;                           // 1..64
  int64_t tokens = 0;                  // at most 65535
  int64_t width = 0;
  const float* add = nullptr;  // [tokens][add_stride], or null
  int64_t add_stride = 0;
  float* out = nullptr;  // [tokens][out_stride]; may be `add`
  int64_t out_stride = 0;
};

cudaError_t WeightedRowSum(const WeightedRowSumParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
