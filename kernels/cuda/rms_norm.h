// RMSNorm on the GPU: out[r] = weight * x[r] / sqrt(mean(x[r]^2) + eps), float32 in,
// float32 and/or bf16 out (optionally split: bf16 value plus bf16 remainder, for GEMMs
// that take split activations, grouped_gemm.h), one block per row. Matches kernels/cpu/norm_rope_act.h's
// RmsNorm. AddRmsNorm first adds a delta into x (the residual stream, updated in place),
// then normalizes the sum: the fused residual add of a decoder layer.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace tandem::cuda {

struct RmsNormParams {
  const float* x = nullptr;       // [rows][x_stride]
  const float* weight = nullptr;  // [dim]
  float* out = nullptr;           // [rows][out_stride]; may alias x; may be null when out_bf16 is set
  int64_t rows = 0;
  int64_t dim = 0;
  int64_t x_stride = 0;
  int64_t out_stride = 0;
  float eps = 1e-6f;
  __nv_bfloat16* out_bf16 = nullptr;  // optional bf16 copy of the output, [rows][out_stride]
  const int32_t* row_index = nullptr;  // optional: output row r normalizes x row row_index[r]
  __nv_bfloat16* out_bf16_lo = nullptr;  // optional (with out_bf16): v - bf16(v), [rows][out_stride]
};

cudaError_t RmsNorm(const RmsNormParams& p, cudaStream_t stream);

struct AddRmsNormParams {
  float* x = nullptr;            // [rows][x_stride]: x += delta, written back
  const float* delta = nullptr;  // [rows][delta_stride]
  const float* weight = nullptr;  // [dim]
  float* out = nullptr;               // optional float32 output [rows][out_stride]
  __nv_bfloat16* out_bf16 = nullptr;  // optional bf16 output [rows][out_stride]
  __nv_bfloat16* out_bf16_lo = nullptr;  // optional (with out_bf16): its remainder
  int64_t rows = 0;
  int64_t dim = 0;
  int64_t x_stride = 0;
  int64_t delta_stride = 0;
  int64_t out_stride = 0;
  float eps = 1e-6f;
};

cudaError_t AddRmsNorm(const AddRmsNormParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
