#include "kernels/cuda/draft_choice.h"

#include <climits>

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

__global__ void DraftChoiceKernel(DraftChoiceParams p) {
  __shared__ float best_v[kWarps];
  __shared__ int best_i[kWarps];
  __shared__ double sums[kWarps];
  internal::WaitAndTrigger();
  const float* l = p.logits + static_cast<int64_t>(blockIdx.x) * p.stride;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // The argmax, ties to the lowest index.
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
  if (lane == 0) {
    best_v[warp] = bv;
    best_i[warp] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w) {
      if (best_i[w] != INT_MAX && internal::Better(best_v[w], best_i[w], bv, bi)) {
        bv = best_v[w];
        bi = best_i[w];
      }
    }
    best_v[0] = bv;
    best_i[0] = bi;
  }
  __syncthreads();
  const float max = best_v[0];
  const int arg = best_i[0];

  // sum exp(l - max), in double.
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < p.vocab; i += kThreads) {
    const float v = l[i];
    if (!isnan(v)) sum += exp(static_cast<double>(v) - static_cast<double>(max));
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) sums[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kWarps; ++w) total += sums[w];
    const bool none = arg == INT_MAX;
    p.token[blockIdx.x] = none ? 0 : arg;
    p.confidence[blockIdx.x] = none || !(total > 0.0) ? 0.0f : static_cast<float>(1.0 / total);
  }
}

}  // namespace

cudaError_t DraftChoice(const DraftChoiceParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.logits == nullptr || p.token == nullptr || p.confidence == nullptr || p.rows < 0 || p.rows > 0x7fffffff ||
      p.vocab <= 0 || p.vocab > 0x7fffffff || p.stride < p.vocab) {
    return cudaErrorInvalidValue;
  }
  return internal::Launch(DraftChoiceKernel, dim3(static_cast<unsigned>(p.rows)), dim3(kThreads), 0, stream, p);
}

}  // namespace tandem::cuda
