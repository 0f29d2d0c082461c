#include "kernels/cuda/unit_rms_norm.h"

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 128;

// One block per row. The double sum makes the order of the additions irrelevant to the
// float result in all but vanishing cases, so the CPU's sequential sum is matched.
__global__ void UnitRmsNormKernel(UnitRmsNormParams p) {
  internal::WaitAndTrigger();
  __shared__ double partial[kThreads];
  const float* x = p.x + static_cast<int64_t>(blockIdx.x) * p.x_stride;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < p.width; i += kThreads) sum += static_cast<double>(x[i]) * x[i];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float mean = static_cast<float>(partial[0] / static_cast<double>(p.width));
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, p.eps)));
  float* out = p.out + static_cast<int64_t>(blockIdx.x) * p.out_stride;
  for (int64_t i = threadIdx.x; i < p.width; i += kThreads) out[i] = __fmul_rn(x[i], inv);
  if (p.rope_dim == 0) return;
  __syncthreads();  // the rotated pairs were written by other threads
  const int half = p.rope_dim / 2;
  const int64_t position = p.positions[blockIdx.x / p.rows_per_position];
  float* tail = out + p.width - p.rope_dim;
  for (int i = threadIdx.x; i < half; i += kThreads) {
    float c, s;
    internal::RopeCosSin(position, p.inv_freq[i], p.attention_factor, &c, &s);
    internal::RotatePair(tail, internal::RopePair(i, half, p.interleaved), c, s);
  }
}

}  // namespace

cudaError_t UnitRmsNorm(const UnitRmsNormParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.x == nullptr || p.out == nullptr || p.rows < 0 || p.rows > 0x7fffffff || p.width <= 0 ||
      p.x_stride < p.width || p.out_stride < p.width ||
      (p.rope_dim != 0 && (p.rope_dim < 0 || p.rope_dim % 2 != 0 || p.rope_dim > p.width || p.positions == nullptr ||
                           p.inv_freq == nullptr || p.rows_per_position <= 0))) {
    return cudaErrorInvalidValue;
  }
  return internal::Launch(UnitRmsNormKernel, dim3(static_cast<unsigned>(p.rows)), dim3(kThreads), 0, stream, p);
}

}  // namespace tandem::cuda
