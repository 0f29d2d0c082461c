// The host half of kv_extent_copy.h, in C++20 (its spans), apart from the C++17 kernel.
#include <cstring>

#include "kernels/cuda/kv_checksum_mix.cuh"
#include "kernels/cuda/kv_extent_copy.h"

namespace tandem::cuda {

uint64_t KvExtentsChecksum(const std::byte* pool, std::span<const KvExtentPair> extents) {
  uint64_t sum = 0;
  for (const KvExtentPair& e : extents) {
    const std::byte* bytes = pool + e.src_offset;
    for (uint64_t w = 0; w < e.bytes / 8; ++w) {
      uint64_t x;
      std::memcpy(&x, bytes + 8 * w, 8);  // little-endian, as the device reads it
      sum += internal::ExtentWordTerm(x, static_cast<uint64_t>(e.layer), e.first_word + w);
    }
  }
  return sum;
}

uint64_t NumberKvExtentWords(std::span<KvExtentPair> extents) {
  uint64_t words = 0;
  for (KvExtentPair& e : extents) {
    e.first_word = words;
    words += e.bytes / 8;
  }
  return words;
}

}  // namespace tandem::cuda
