#include "kernels/cuda/pool_window.h"

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/pool_window.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 128;

// Grid (channel blocks, windows): a thread per channel walks the window's slots in order,
// so neighbouring threads read neighbouring values of each row.
__global__ void PoolWindowKernel(PoolWindowParams p) {
  internal::WaitAndTrigger();
  const int64_t w = blockIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= p.width) return;
  const float* gate = p.gate + w * p.slots * p.stride + c;
  const float* kv = p.kv + w * p.slots * p.stride + c;
  const float acc = internal::PoolSlots(
      p.slots, [&](int s) { return gate[s * p.stride]; }, [&](int s) { return kv[s * p.stride]; });
  p.out[w * p.out_stride + c] = acc;
}

}  // namespace

cudaError_t PoolWindow(const PoolWindowParams& p, cudaStream_t stream) {
  if (p.windows == 0 || p.width == 0) return cudaSuccess;
  if (p.kv == nullptr || p.gate == nullptr || p.out == nullptr || p.windows < 0 || p.windows > 65535 ||
      p.slots < 1 || p.slots > 1024 || p.width < 0 || p.stride < p.width || p.out_stride < p.width) {
    return cudaErrorInvalidValue;
  }
  return internal::Launch(PoolWindowKernel,
                          dim3(static_cast<unsigned>((p.width + kThreads - 1) / kThreads),
                               static_cast<unsigned>(p.windows)),
                          dim3(kThreads), 0, stream, p);
}

}  // namespace tandem::cuda
