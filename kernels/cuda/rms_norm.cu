#include "kernels/cuda/rms_norm.h"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void RmsNormKernel(RmsNormParams p) {
  const int64_t row = blockIdx.x;
  const float* x = p.x + row * p.x_stride;
  float* out = p.out + row * p.out_stride;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) sum += x[i] * x[i];
  // Warp reduction, then across warps through shared memory.
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  __shared__ float warp_sums[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    sum = lane < kThreads / 32 ? warp_sums[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) warp_sums[0] = sum;
  }
  __syncthreads();
  const float inv = rsqrtf(warp_sums[0] / static_cast<float>(p.dim) + p.eps);
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) out[i] = p.weight[i] * (x[i] * inv);
}

}  // namespace

cudaError_t RmsNorm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.x == nullptr || p.weight == nullptr || p.out == nullptr || p.dim <= 0 || p.x_stride < p.dim ||
      p.out_stride < p.dim || p.rows > 0x7fffffff) {
    return cudaErrorInvalidValue;
  }
  RmsNormKernel<<<static_cast<unsigned>(p.rows), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
