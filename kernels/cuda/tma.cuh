// Hopper (sm_90a) tensor-memory-accelerator loads and the shared-memory barriers that count
// their bytes: a producer thread arms a barrier with the bytes it expects and starts
// cp.async.bulk.tensor copies that complete on it; consumers wait for the barrier's phase.
// Device side under TANDEM_HAS_WGMMA (wgmma.cuh); the host side builds the descriptors
// through the driver's cuTensorMapEncodeTiled, found at run time (the library links only
// the CUDA runtime).
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/cuda/wgmma.cuh"

namespace tandem::cuda::tma {

// A 2-D row-major tensor of bytes [rows][cols] (row stride `row_bytes`, a multiple of 16)
// read in boxes of [box_rows][box_cols] into 128-byte-swizzled shared memory (box_cols
// must be 128 then); out-of-range elements of a box read as zeros.
cudaError_t EncodeBytes2d(CUtensorMap* map, const void* base, uint64_t rows, uint64_t cols, uint64_t row_bytes,
                          uint32_t box_rows, uint32_t box_cols);

#ifdef TANDEM_HAS_WGMMA
__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initializations visible to the async proxy (TMA completions).
__device__ __forceinline__ void MbarInitFence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Returns once the phase of parity `parity` has completed (a fresh barrier counts its
// phase "-1", parity 1, as completed).
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}
__device__ __forceinline__ void PrefetchDescriptor(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// Box at element (col, row) of the tensor into shared memory at `dst`, completing on `bar`.
__device__ __forceinline__ void Load2d(uint32_t dst, const CUtensorMap* map, int col, int row, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(bar)
      : "memory");
}
// Register budget moves between warpgroups (all threads of the warpgroup execute them).
template <int kRegs>
__device__ __forceinline__ void ShrinkRegisters() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void GrowRegisters() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
#endif  // TANDEM_HAS_WGMMA

}  // namespace tandem::cuda::tma
