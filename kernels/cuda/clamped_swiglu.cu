#include "kernels/cuda/clamped_swiglu.h"

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

// Grid (column blocks, rows).
__global__ void ClampedSwiGluKernel(ClampedSwiGluParams p) {
  internal::WaitAndTrigger();
  const int64_t r = blockIdx.y;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= p.cols) return;
  const float* x = p.x + r * p.x_stride;
  const float g = fminf(x[i], p.limit);
  const float u = fminf(fmaxf(x[p.cols + i], -p.limit), p.limit);
  // As the host rounds it: the division and the product each rounded, no contraction.
  p.out[r * p.out_stride + i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

}  // namespace

cudaError_t ClampedSwiGlu(const ClampedSwiGluParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  if (p.x == nullptr || p.out == nullptr || p.rows < 0 || p.rows > 65535 || p.cols < 0 ||
      p.x_stride < 2 * p.cols || p.out_stride < p.cols || !(p.limit > 0.0f)) {
    return cudaErrorInvalidValue;
  }
  return internal::Launch(ClampedSwiGluKernel,
                          dim3(static_cast<unsigned>((p.cols + kThreads - 1) / kThreads), static_cast<unsigned>(p.rows)),
                          dim3(kThreads), 0, stream, p);
}

}  // namespace tandem::cuda
