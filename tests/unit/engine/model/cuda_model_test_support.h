// Helpers shared by the CUDA model tests (cuda_deepseek_model_test.cc,
// cuda_fp8_decode_test.cc): whether a GPU is usable, deterministic prompts, block tables and
// the logits comparisons against the CPU engine.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/cuda/device_info.h"

namespace tandem::testing {

// False (with the reason) where no GPU is usable: the tests skip, saying why.
inline bool HaveGpu(std::string* why) {
  std::vector<cuda::DeviceInfo> devices;
  *why = cuda::QueryDevices(&devices);
  return why->empty();
}

// n tokens in [3, vocab) from a xorshift stream seeded by salt.
inline std::vector<int32_t> Tokens(int n, int64_t vocab, int salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(salt + 1);
  for (int i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t[static_cast<size_t>(i)] = static_cast<int32_t>(3 + x % static_cast<uint64_t>(vocab - 3));
  }
  return t;
}

// Blocks first .. first + n - 1.
inline std::vector<int32_t> Table(int first, int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

inline int32_t Argmax(const float* row, int64_t vocab) {
  return static_cast<int32_t>(std::max_element(row, row + vocab) - row);
}

// Largest |gpu - cpu| of a row relative to the row's largest |cpu|.
inline double RowError(const float* gpu, const float* cpu, int64_t vocab) {
  double d = 0, m = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    d = std::max(d, std::fabs(static_cast<double>(gpu[i]) - cpu[i]));
    m = std::max(m, std::fabs(static_cast<double>(cpu[i])));
  }
  return d / m;
}

}  // namespace tandem::testing
