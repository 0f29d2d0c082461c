#include "kernels/cuda/draft_choice.h"

#include <climits>

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

__global__ void DraftChoiceKernel(DraftChoiceParams p) {
  __shared__ double sums[kWarps];
  internal::WaitAndTrigger();
  const float* l = p.logits + static_cast<int64_t>(blockIdx.x) * p.stride;
  float max = 0.0f;
  int arg = INT_MAX;
  internal::BlockArgmax<kThreads>(l, p.vocab, &max, &arg);
  // sum exp(l - max), in double.
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < p.vocab; i += kThreads) {
    const float v = l[i];
    if (!isnan(v)) sum += exp(static_cast<double>(v) - static_cast<double>(max));
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) sums[threadIdx.x / 32] = sum;
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
