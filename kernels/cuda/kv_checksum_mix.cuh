// The mixing function of the KV transfer checksums (kv_block_copy.h, kv_extent_copy.h),
// shared so that both kernels and their host references stay bit-identical: splitmix64's
// finalizer, a bijection on 64-bit words, and the (layer, index) seed built from it.
// Host code may include it too (cuda_runtime.h makes the qualifiers plain inline).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda::internal {

inline constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

__host__ __device__ __forceinline__ uint64_t Mix(uint64_t z) {
  z ^= z >> 30;
  z *= 0xbf58476d1ce4e5b9ull;
  z ^= z >> 27;
  z *= 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Distinct for distinct (layer < 2^16, index < 2^48): the two fields do not overlap and
// Mix is a bijection.
__host__ __device__ __forceinline__ uint64_t LayerSeed(uint64_t layer, uint64_t index) {
  return Mix((layer << 48) ^ index ^ kGolden);
}

// kv_extent_copy.h's term of word x, word g of the sequence, in an extent of `layer`.
__host__ __device__ __forceinline__ uint64_t ExtentWordTerm(uint64_t x, uint64_t layer, uint64_t g) {
  return Mix(x ^ (LayerSeed(layer, g) + kGolden));
}

}  // namespace tandem::cuda::internal
