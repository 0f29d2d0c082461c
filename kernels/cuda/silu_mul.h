// SiLU gating on the GPU: out[r][i] = silu(gate[r][i]) * up[r][i] (silu(g) = g / (1 + e^-g)),
// float32 in, float32 and/or bf16 out. The gate and up values of a row come from one
// fused gate_up projection, laid out either as two halves ([gate cols | up cols],
// interleave 0) or in alternating blocks of `interleave` gate then `interleave` up values
// (the layout the CUDA model stores its gate_up weights in). Matches kernels/cpu's SiluMul.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace tandem::cuda {

struct SiluMulParams {
  const float* x = nullptr;  // [rows][x_stride], 2 * cols values used per row
  int64_t x_stride = 0;
  int64_t rows = 0;
  int64_t cols = 0;    // outputs per row
  int interleave = 0;  // 0: halves; else block size (cols % interleave == 0)
  float* out = nullptr;               // optional [rows][out_stride]
  __nv_bfloat16* out_bf16 = nullptr;  // optional [rows][out_stride]
  int64_t out_stride = 0;
};

cudaError_t SiluMul(const SiluMulParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
