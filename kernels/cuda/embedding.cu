#include "kernels/cuda/embedding.h"

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

__global__ void EmbeddingKernel(EmbeddingParams p) {
  internal::WaitAndTrigger();
  const int64_t r = blockIdx.x;
  const __nv_bfloat16* row = p.table + static_cast<int64_t>(p.tokens[r]) * p.dim;
  float* out = p.out + r * p.out_stride;
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) out[i] = __bfloat162float(row[i]);
}

}  // namespace

cudaError_t EmbeddingGather(const EmbeddingParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  if (p.table == nullptr || p.tokens == nullptr || p.out == nullptr || p.num_tokens < 0 ||
      p.num_tokens > 0x7fffffff || p.dim <= 0 || p.out_stride < p.dim) {
    return cudaErrorInvalidValue;
  }
  return internal::Launch(EmbeddingKernel, dim3(static_cast<unsigned>(p.num_tokens)), dim3(256), 0, stream, p);
}

}  // namespace tandem::cuda
