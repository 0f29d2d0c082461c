// y[m, n] (+)= sum_k x[m, k] * W[n, k]: activations in float32 times a weight matrix in its
// stored type (BF16 and F32 read directly, FP8 and F16 dequantized a few rows at a time),
// accumulated in float32. Parallel over output features; each weight row is read once
// per call whatever m is, which is what bounds decode.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/weight_matrix.h"

namespace tandem::cpu {

struct MatmulParams {
  const float* x = nullptr;
  int64_t m = 0;
  int64_t x_stride = 0;  // floats between rows of x (>= w.cols)
  const WeightMatrix* w = nullptr;
  float* y = nullptr;
  int64_t y_stride = 0;  // floats between rows of y (>= w.rows)
  bool accumulate = false;  // y += instead of y =
};

// BF16 weights use the ActiveCpuIsa() variant (kernels/cpu/matmul_bf16.h: every variant
// gives the same bits); the overload names one, for tests and A/B runs.
void Matmul(const MatmulParams& p, ThreadPool& pool);
void Matmul(const MatmulParams& p, ThreadPool& pool, CpuIsa isa);

}  // namespace tandem::cpu
