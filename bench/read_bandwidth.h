// What the CPU decode benchmarks share: the memory references they are measured against,
// in the same run and with the same threads (a streaming read, the sum of a buffer larger
// than the caches: what decode does; and memcpy's rate in bytes copied per second, context
// only: a copy moves each byte twice, so its rate flatters a read-bound loop), the bytes a
// weight matrix holds, and percentiles of step times.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/common/dtype.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/weight_matrix.h"

namespace tandem::bench {

inline double SecondsBetween(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Best of `reps` parallel streaming reads of `bytes`: bytes / second.
inline double ReadBandwidth(cpu::ThreadPool& pool, size_t bytes, int reps) {
  std::vector<float> buf(bytes / sizeof(float));
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i & 1023);
  double best = 0;
  std::vector<double> sums(static_cast<size_t>(pool.num_threads()) * 16);
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.ParallelFor(static_cast<int64_t>(buf.size()), 1 << 16, [&](int64_t b, int64_t e) {
      float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
      int64_t i = b;
      for (; i + 8 <= e; i += 8) {
        s0 += buf[i]; s1 += buf[i + 1]; s2 += buf[i + 2]; s3 += buf[i + 3];
        s4 += buf[i + 4]; s5 += buf[i + 5]; s6 += buf[i + 6]; s7 += buf[i + 7];
      }
      for (; i < e; ++i) s0 += buf[i];
      sums[(b / (1 << 16)) % sums.size()] += s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
    });
    best = std::max(best, bytes / SecondsBetween(t0, std::chrono::steady_clock::now()));
  }
  if (std::accumulate(sums.begin(), sums.end(), 0.0) == 42.0) std::fprintf(stderr, " ");  // keep the reads
  return best;
}

// Best of `reps` parallel memcpy of `bytes`: bytes copied / second.
inline double CopyBandwidth(cpu::ThreadPool& pool, size_t bytes, int reps) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.ParallelFor(static_cast<int64_t>(bytes), 1 << 20, [&](int64_t b, int64_t e) {
      std::memcpy(dst.data() + b, src.data() + b, static_cast<size_t>(e - b));
    });
    best = std::max(best, bytes / SecondsBetween(t0, std::chrono::steady_clock::now()));
  }
  return best;
}

// Bytes a decode step reads of `w` (its values and, for FP8, its block scales).
inline uint64_t MatrixBytes(const cpu::WeightMatrix& w) {
  if (!w.valid()) return 0;
  uint64_t b = static_cast<uint64_t>(w.rows) * w.cols * DTypeSize(w.dtype);
  if (w.block_scales != nullptr) b += static_cast<uint64_t>((w.rows + 127) / 128) * w.scale_cols() * 4;
  return b;
}

inline double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * (v.size() - 1))];
}

}  // namespace tandem::bench
