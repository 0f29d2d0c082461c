// The GPU benchmarks' memory reference: bytes read + written per second by a large
// device-to-device copy (2 GiB, best of 10 after 2 warm-up copies), measured in the run
// that reports a ratio against it.
#pragma once

#include <algorithm>
#include <cstddef>

#include <cuda_runtime.h>

#include "bench/cuda_check.h"

namespace tandem::bench {

inline double DeviceCopyBytesPerSecond() {
  const size_t bytes = size_t{2} << 30;
  void *src = nullptr, *dst = nullptr;
  CHECK_CUDA(cudaMalloc(&src, bytes));
  CHECK_CUDA(cudaMalloc(&dst, bytes));
  CHECK_CUDA(cudaMemset(src, 1, bytes));
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  double best = 0;
  for (int i = 0; i < 12; ++i) {
    CHECK_CUDA(cudaEventRecord(a));
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    if (i >= 2) best = std::max(best, 2.0 * static_cast<double>(bytes) / (ms * 1e-3));
  }
  cudaFree(src);
  cudaFree(dst);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return best;
}

}  // namespace tandem::bench
