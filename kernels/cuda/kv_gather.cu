#include "kernels/cuda/kv_gather.h"

namespace tandem::cuda {
namespace {

constexpr int kWarps = 8;

// One warp per position, 16-byte vectors of 8 values.
__global__ void KvGatherKernel(KvGatherParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (i >= p.num_positions) return;
  const int lane = threadIdx.x % 32;
  const int64_t pos = p.first_position + i;
  const int64_t block = p.block_table[pos / p.block_size];
  const uint4* src = reinterpret_cast<const uint4*>(p.kv_cache + (block * p.block_size + pos % p.block_size) *
                                                                     static_cast<int64_t>(p.entry_dim));
  const int chunks = p.entry_dim / 8;
  if (p.out_bf16 != nullptr) {
    uint4* dst = reinterpret_cast<uint4*>(p.out_bf16 + i * p.out_stride);
    for (int c = lane; c < chunks; c += 32) dst[c] = src[c];
  } else {
    float4* dst = reinterpret_cast<float4*>(p.out_f32 + i * p.out_stride);
    for (int c = lane; c < chunks; c += 32) {
      const uint4 v = src[c];
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
      const float2 f0 = __bfloat1622float2(h[0]), f1 = __bfloat1622float2(h[1]);
      const float2 f2 = __bfloat1622float2(h[2]), f3 = __bfloat1622float2(h[3]);
      dst[2 * c] = make_float4(f0.x, f0.y, f1.x, f1.y);
      dst[2 * c + 1] = make_float4(f2.x, f2.y, f3.x, f3.y);
    }
  }
}

}  // namespace

cudaError_t KvGather(const KvGatherParams& p, cudaStream_t stream) {
  if (p.num_positions == 0) return cudaSuccess;
  const bool bf16 = p.out_bf16 != nullptr;
  if (p.kv_cache == nullptr || p.block_table == nullptr || bf16 == (p.out_f32 != nullptr) || p.block_size <= 0 ||
      p.entry_dim <= 0 || p.entry_dim % 8 != 0 || p.num_positions < 0 || p.first_position < 0 ||
      p.out_stride < p.entry_dim || p.out_stride % (bf16 ? 8 : 4) != 0 ||
      reinterpret_cast<uintptr_t>(p.kv_cache) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(bf16 ? static_cast<void*>(p.out_bf16) : static_cast<void*>(p.out_f32)) % 16 != 0 ||
      (p.num_positions + kWarps - 1) / kWarps > 0x7fffffff) {
    return cudaErrorInvalidValue;
  }
  const unsigned blocks = static_cast<unsigned>((p.num_positions + kWarps - 1) / kWarps);
  KvGatherKernel<<<blocks, kWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
