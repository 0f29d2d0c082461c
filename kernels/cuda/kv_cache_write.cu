#include "kernels/cuda/kv_cache_write.h"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 128;

// One block per token: converts its entry to bf16, two values per thread step.
__global__ void __launch_bounds__(kThreads) KvCacheWriteKernel(KvCacheWriteParams p) {
  const int token = blockIdx.x;
  const int64_t slot = p.slots[token];
  if (slot < 0 || slot >= p.num_slots) return;
  const float* src = p.entries + token * p.entries_stride;
  __nv_bfloat16* dst = p.kv_cache + slot * p.entry_dim;
  if (p.entry_dim % 2 == 0 && p.entries_stride % 2 == 0 && reinterpret_cast<uintptr_t>(p.entries) % 8 == 0 &&
      reinterpret_cast<uintptr_t>(p.kv_cache) % 4 == 0) {
    for (int i = threadIdx.x; i < p.entry_dim / 2; i += kThreads) {
      const float2 v = reinterpret_cast<const float2*>(src)[i];
      reinterpret_cast<__nv_bfloat162*>(dst)[i] = __floats2bfloat162_rn(v.x, v.y);
    }
  } else {
    for (int i = threadIdx.x; i < p.entry_dim; i += kThreads) dst[i] = __float2bfloat16_rn(src[i]);
  }
}

}  // namespace

cudaError_t KvCacheWrite(const KvCacheWriteParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  if (p.num_tokens < 0 || p.entries == nullptr || p.slots == nullptr || p.kv_cache == nullptr || p.entry_dim <= 0 ||
      p.entries_stride < p.entry_dim || p.num_slots < 0) {
    return cudaErrorInvalidValue;
  }
  KvCacheWriteKernel<<<static_cast<unsigned>(p.num_tokens), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
