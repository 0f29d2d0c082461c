#include "kernels/cuda/token_mask.h"

#include <cmath>

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void TokenMaskKernel(TokenMaskParams p) {
  const int row = blockIdx.y;
  const int slot = p.row_slot[row];
  if (slot < 0) return;
  const int64_t id = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (id >= p.vocab) return;
  const bool allowed =
      id < static_cast<int64_t>(p.words) * 32 &&
      ((p.masks[static_cast<int64_t>(slot) * p.words + id / 32] >> (id % 32)) & 1u) != 0;
  if (!allowed) p.logits[row * p.stride + id] = -INFINITY;
}

}  // namespace

cudaError_t ApplyTokenMasks(const TokenMaskParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.logits == nullptr || p.row_slot == nullptr || p.masks == nullptr || p.rows < 0 || p.vocab <= 0 ||
      p.stride < p.vocab || p.words <= 0 || p.rows > 65535) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid((p.vocab + kThreads - 1) / kThreads, p.rows);
  TokenMaskKernel<<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
