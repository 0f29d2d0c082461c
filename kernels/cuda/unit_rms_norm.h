// RMS normalization without a weight on the GPU: x / sqrt(mean(x^2) + eps) over each row
// of `width` values, float32 in and out (in place allowed). DeepSeek-V4 applies it to each
// query head and to the flattened residual streams entering a hyper-connection site. The
// arithmetic of engine/model/deepseek_v4/v4_math.cc UnitRmsNorm: the sum of squares in
// double, then 1 / sqrt(float(sum / width) + eps) multiplied into each value; optionally
// the rope of the normalized heads in the same launch.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda {

struct UnitRmsNormParams {
  const float* x = nullptr;  // [rows][x_stride]
  int64_t x_stride = 0;
  float* out = nullptr;  // [rows][out_stride]; may be x
  int64_t out_stride = 0;
  int64_t rows = 0;  // at most 2^31 - 1
  int64_t width = 0;
  float eps = 1e-6f;
  // Optional, after the norm: kernels/cuda/rope.h's rotation (same arithmetic) of each
  // output row's last rope_dim values, row r at positions[r / rows_per_position]
  // (DeepSeek-V4's query heads: a row per head, the heads of a token at its position).
  int rope_dim = 0;  // 0: none; else even, at most width
  const int32_t* positions = nullptr;
  int64_t rows_per_position = 1;
  const float* inv_freq = nullptr;  // [rope_dim / 2]
  float attention_factor = 1.0f;
  bool interleaved = true;
};

cudaError_t UnitRmsNorm(const UnitRmsNormParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
