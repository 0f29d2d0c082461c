// Shared by the CUDA kernel benchmarks: deterministic operand fills (a per-index hash,
// grid-stride kernels) and event timing of back-to-back launches.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "bench/cuda_check.h"

namespace tandem::bench {

// A well-mixed 32-bit value for element i of a fill keyed by seed.
__device__ __forceinline__ uint32_t FillHash(size_t i, uint32_t seed) {
  uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B1u ^ seed;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// value * (1 + (i % 7) / 8): scales and activations of a known, varied size.
__global__ void FillFloats(float* p, size_t n, float value) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = value * (1.0f + static_cast<float>(i % 7) * 0.125f);
  }
}

// Milliseconds per call of `reps` calls of fn back to back on the default stream.
template <typename Fn>
double BatchMs(int reps, Fn&& fn, cudaEvent_t a, cudaEvent_t b) {
  CHECK_CUDA(cudaEventRecord(a));
  for (int i = 0; i < reps; ++i) fn();
  CHECK_CUDA(cudaEventRecord(b));
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0.0f;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  return static_cast<double>(ms) / reps;
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median of `iters` batches of BatchMs, after one batch of warm-up.
template <typename Fn>
double MedianMs(int iters, int reps, Fn&& fn) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < reps; ++i) fn();
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> ms;
  for (int it = 0; it < iters; ++it) ms.push_back(BatchMs(reps, fn, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return Median(std::move(ms));
}

}  // namespace tandem::bench
