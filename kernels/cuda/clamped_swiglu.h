// DeepSeek-V4's expert activation on the GPU: out[r][i] = silu(min(gate, limit)) *
// clamp(up, -limit, limit), with gate and up the two halves of a row ([gate cols | up
// cols], as a fused gate/up projection writes them). The arithmetic of
// engine/model/deepseek_v4/v4_math.cc ClampedSwiGlu (g / (1 + e^-g) * u).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda {

struct ClampedSwiGluParams {
  const float* x = nullptr;  // [rows][x_stride]: gate in [0, cols), up in [cols, 2 cols)
  int64_t x_stride = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  float limit = 0.0f;  // swiglu_limit, > 0
  float* out = nullptr;  // [rows][out_stride]
  int64_t out_stride = 0;
};

cudaError_t ClampedSwiGlu(const ClampedSwiGluParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
