#include "kernels/cuda/argmax.h"

#include <climits>

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 512;

__global__ void ArgmaxKernel(ArgmaxParams p) {
  __shared__ float best_v[kThreads / 32];
  __shared__ int best_i[kThreads / 32];
  internal::WaitAndTrigger();
  const float* l = p.logits + static_cast<int64_t>(blockIdx.x) * p.stride;
  float bv = 0.0f;
  int bi = INT_MAX;
  for (int64_t i = threadIdx.x; i < p.vocab; i += kThreads) {
    const float v = l[i];
    if (!isnan(v) && internal::Better(v, static_cast<int>(i), bv, bi)) {
      bv = v;
      bi = static_cast<int>(i);
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, offset);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, offset);
    if (oi != INT_MAX && internal::Better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    best_v[warp] = bv;
    best_i[warp] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) {
      if (best_i[w] != INT_MAX && internal::Better(best_v[w], best_i[w], bv, bi)) {
        bv = best_v[w];
        bi = best_i[w];
      }
    }
    p.out[blockIdx.x] = bi == INT_MAX ? 0 : bi;
  }
}

}  // namespace

cudaError_t Argmax(const ArgmaxParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.logits == nullptr || p.out == nullptr || p.rows < 0 || p.rows > 0x7fffffff || p.vocab <= 0 ||
      p.vocab > 0x7fffffff || p.stride < p.vocab) {
    return cudaErrorInvalidValue;
  }
  return internal::Launch(ArgmaxKernel, dim3(static_cast<unsigned>(p.rows)), dim3(kThreads), 0, stream, p);
}

}  // namespace tandem::cuda
