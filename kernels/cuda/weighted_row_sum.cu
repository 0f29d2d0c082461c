#include "kernels/cuda/weighted_row_sum.h"

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

// Grid (column blocks, tokens).
__global__ void WeightedRowSumKernel(WeightedRowSumParams p) {
  internal::WaitAndTrigger();
  const int64_t t = blockIdx.y;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= p.width) return;
  float acc = 0.0f;
  for (int j = 0; j < p.k; ++j) {
    const float* row = p.rows[t * p.k + j];
    if (row != nullptr) acc = fmaf(p.weights[t * p.k + j], row[i], acc);
  }
  const float add = p.add != nullptr ? p.add[t * p.add_stride + i] : 0.0f;
  p.out[t * p.out_stride + i] = __fadd_rn(acc, add);
}

}  // namespace

cudaError_t WeightedRowSum(const WeightedRowSumParams& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.width == 0) return cudaSuccess;
  if (p.rows == nullptr || p.weights == nullptr || p.out == nullptr || p.k < 1 || p.k > 64 || p.tokens < 0 ||
      p.tokens > 65535 || p.width < 0 || p.out_stride < p.width || (p.add != nullptr && p.add_stride < p.width)) {
    return cudaErrorInvalidValue;
  }
  return internal::Launch(WeightedRowSumKernel,
                          dim3(static_cast<unsigned>((p.width + kThreads - 1) / kThreads),
                               static_cast<unsigned>(p.tokens)),
                          dim3(kThreads), 0, stream, p);
}

}  // namespace tandem::cuda
