// RMSNorm on the GPU: out[r] = weight * x[r] / sqrt(mean(x[r]^2) + eps), float32 in and
// out, one block per row. Matches kernels/cpu/norm_rope_act.h's RmsNorm.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda {

struct RmsNormParams {
  const float* x = nullptr;       // [rows][x_stride]
  const float* weight = nullptr;  // [dim]
  float* out = nullptr;           // [rows][out_stride]; may alias x
  int64_t rows = 0;
  int64_t dim = 0;
  int64_t x_stride = 0;
  int64_t out_stride = 0;
  float eps = 1e-6f;
};

cudaError_t RmsNorm(const RmsNormParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
