#include "kernels/cuda/rope.h"

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 128;

// One block per row; cos/sin computed once per row in shared memory.
__global__ void RopeKernel(RopeParams p) {
  __shared__ float cos_s[128], sin_s[128];
  internal::WaitAndTrigger();
  const int64_t row = blockIdx.x;
  const int half = p.rope_dim / 2;
  const int64_t position = p.positions[row];
  for (int i = threadIdx.x; i < half; i += kThreads) {
    internal::RopeCosSin(position, p.inv_freq[i], p.attention_factor, &cos_s[i], &sin_s[i]);
    if (p.inverse) sin_s[i] = -sin_s[i];
  }
  __syncthreads();
  float* base = p.x + row * p.row_stride;
  for (int job = threadIdx.x; job < p.num_heads * half; job += kThreads) {
    const int h = job / half, i = job % half;
    float* head = base + h * p.head_stride;
    internal::RotatePair(head, internal::RopePair(i, half, p.interleaved), cos_s[i], sin_s[i]);
  }
}

}  // namespace

cudaError_t Rope(const RopeParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.x == nullptr || p.positions == nullptr || p.inv_freq == nullptr || p.rows < 0 || p.rows > 0x7fffffff ||
      p.num_heads <= 0 || p.rope_dim <= 0 || p.rope_dim % 2 != 0 || p.rope_dim > 256 ||
      (p.num_heads > 1 && p.head_stride < p.rope_dim)) {
    return cudaErrorInvalidValue;
  }
  return internal::Launch(RopeKernel, dim3(static_cast<unsigned>(p.rows)), dim3(kThreads), 0, stream, p);
}

}  // namespace tandem::cuda
