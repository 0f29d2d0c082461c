// The counter-based random numbers of the checkpoint generators (model_generator.cc and
// the test constructions beside it): value i of a stream depends only on (key, i), and is
// computed with integer arithmetic and exact float operations, so every machine writes
// the same bytes.
#pragma once

#include <cstdint>

namespace tandem::generator {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// 64 random bits, the i-th of stream `key`.
inline uint64_t RandomBits(uint64_t key, uint64_t i) { return SplitMix64(key ^ SplitMix64(i)); }

// Approximately standard normal (Irwin-Hall of four 16-bit uniforms).
inline float NormalSample(uint64_t key, uint64_t i) {
  const uint64_t r = RandomBits(key, i);
  float sum = 0.0f;
  for (int j = 0; j < 4; ++j) sum += static_cast<float>((r >> (16 * j)) & 0xffff) * (1.0f / 65536.0f);
  return (sum - 2.0f) * 1.7320508f;  // variance of the sum is 4/12
}

inline float UniformSample(uint64_t key, uint64_t i) {  // in [-1, 1)
  return static_cast<float>(RandomBits(key, i) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

}  // namespace tandem::generator
