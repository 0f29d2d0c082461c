#include "kernels/cuda/argmax.h"

#include <climits>

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 512;

__global__ void ArgmaxKernel(ArgmaxParams p) {
  internal::WaitAndTrigger();
  float best = 0.0f;
  int index = INT_MAX;
  internal::BlockArgmax<kThreads>(p.logits + static_cast<int64_t>(blockIdx.x) * p.stride, p.vocab, &best, &index);
  if (threadIdx.x == 0) p.out[blockIdx.x] = index == INT_MAX ? 0 : index;
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
