// y[m, n] (+)= sum_k x[m, k] * W[n, k]: activations in float32 times a weight matrix in its
// stored type (BF16 and F32 read directly, FP8 and F16 dequantized a few rows at a time),
// accumulated in float32. Parallel over output features; each weight row is read once
// per call whatever m is, which is what bounds decode.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/weight_matrix.h"

namespace tandem::cpu {

// Weight rows are taken in blocks of this many from row 0, the rest one at a time (the two
// paths round differently): a matrix split by rows at multiples of it gives bitwise the
// whole matrix's products (engine/model/parallel_layout.h).
inline constexpr int64_t kMatmulRowBlock = 4;

struct MatmulParams {
  const float* x = nullptr;
  int64_t m = 0;
  int64_t x_stride = 0;  // floats between rows of x (>= w.cols)
  const WeightMatrix* w = nullptr;
  float* y = nullptr;
  int64_t y_stride = 0;  // floats between rows of y (>= w.rows)
  bool accumulate = false;  // y += instead of y =
  // FP8 weights only: x rounded as the GPU's block-scaled FP8 GEMM reads it first
  // (fp8_gemm_input.h), the reference for that GEMM; other weights ignore it.
  bool round_fp8_input = false;
};

// BF16 weights use the ActiveCpuIsa() variant, but decode products (m = 1) of rows of at
// most 2 KB the portable one, which streams them faster (kernels/cpu/matmul.cc), unless
// TANDEM_CPU_ISA names a variant (kernels/cpu/matmul_bf16.h: every variant gives the same
// bits); the overload names one, for tests and A/B runs.
void Matmul(const MatmulParams& p, ThreadPool& pool);
void Matmul(const MatmulParams& p, ThreadPool& pool, CpuIsa isa);

// Independent matmuls (no job reads another's output) in one fork-join: the rows of all
// of them are split across the pool at once. A decode step's matrices are small (a routed
// expert's projection is tens of microseconds of reading), so one pass per matrix paid a
// fork-join and a straggler's wait for each. Every output's bits are Matmul's.
void MatmulBatch(std::span<const MatmulParams> jobs, ThreadPool& pool);

}  // namespace tandem::cpu
