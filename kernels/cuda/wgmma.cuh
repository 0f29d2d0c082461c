// Hopper (sm_90a) warpgroup MMA building blocks of the MLA attention kernels: shared-memory
// matrix descriptors for the 128-byte swizzle, the wgmma fence/commit/wait protocol, the
// proxy fence that makes generic shared-memory writes visible to wgmma, and the bf16
// m64n64k16 MMA both kernels use (each file keeps its own wider shapes). Only compiled
// where TANDEM_HAS_WGMMA is defined (sm_90a device code); other targets take the mma.sync
// kernels (mma_sync.cuh).
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TANDEM_HAS_WGMMA 1
#endif

#ifdef TANDEM_HAS_WGMMA
namespace tandem::cuda::wgmma {

// Shared-memory matrix descriptor, 128-byte swizzle.
__device__ __forceinline__ uint64_t SmemDesc(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo_bytes >> 4) << 16) |
         (static_cast<uint64_t>(sbo_bytes >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void WgmmaCommit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Makes the compiler treat `r` as rewritten here: orders uses of wgmma accumulators after
// the wait.
__device__ __forceinline__ void FenceReg(float& r) { asm volatile("" : "+f"(r)::"memory"); }
// Generic-proxy shared-memory writes (cp.async, st.shared) made visible to wgmma.
__device__ __forceinline__ void FenceProxyAsync() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// d (+)= A . B, A 64x16 and B 16x64 from shared memory (descriptors), fp32 accumulators.
__device__ __forceinline__ void WgmmaM64N64K16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of 128-byte-swizzled atoms
// (64 rows x 64 bf16 each, `atom_bytes` apart).
__device__ __forceinline__ uint32_t SwizzledOffset(int row, int chunk, uint32_t atom_bytes) {
  return (chunk >> 3) * atom_bytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

}  // namespace tandem::cuda::wgmma
#endif  // TANDEM_HAS_WGMMA
