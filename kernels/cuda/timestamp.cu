#include "kernels/cuda/timestamp.h"

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

__global__ void TimestampKernel(uint64_t* slot) {
  // Trigger before waiting: the next kernel's blocks may start while the previous kernel
  // runs, as they would without this kernel between them.
  internal::TriggerDependentLaunch();
  internal::GridDependencyWait();
  uint64_t t = 0;
#if defined(__CUDA_ARCH__)
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
#endif
  *slot = t;
}

}  // namespace

cudaError_t RecordTimestamp(uint64_t* slot, cudaStream_t stream) {
  if (slot == nullptr) return cudaErrorInvalidValue;
  return internal::Launch(TimestampKernel, dim3(1), dim3(1), 0, stream, slot);
}

}  // namespace tandem::cuda
