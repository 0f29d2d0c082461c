#include "kernels/cuda/kv_extent_copy.h"

#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/kv_checksum_mix.cuh"

namespace tandem::cuda {
namespace {

using internal::ExtentWordTerm;

constexpr int kWarps = 8;  // per CTA
constexpr int kThreads = kWarps * 32;
constexpr int kCtasPerSm = 3;  // 768 threads per SM: registers <= 80 per thread (64 spill)
constexpr int kUnroll = 4;     // loads in flight per lane
// A warp's chunk of an extent, in 8-byte words: at most 32 KiB; down to 2 KiB when the
// copy is too small to give every warp of the grid a full chunk.
constexpr uint64_t kMaxChunkWords = 4096;
constexpr uint64_t kMinChunkWords = 256;

// Read once (the pools do not overlap, so nothing writes the source during the kernel).
__device__ __forceinline__ ulonglong2 LoadOnce(const ulonglong2* p) {
  ulonglong2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u64 {%0, %1}, [%2];" : "=l"(v.x), "=l"(v.y) : "l"(p));
  return v;
}

__device__ __forceinline__ uint64_t LoadOnce(const uint64_t* p) {
  uint64_t v;
  asm("ld.global.nc.L1::no_allocate.u64 %0, [%1];" : "=l"(v) : "l"(p));
  return v;
}

// How the work is cut: item t is part t % parts of extent t / parts, which takes the
// extent's chunks part, part + parts, part + 2 * parts, ... A large extent thus spreads
// over `parts` warps; the parts of a small one find nothing to do but its first.
struct Plan {
  int64_t items = 0;
  int64_t parts = 0;
  uint64_t chunk_words = 0;
};

__device__ __forceinline__ bool Inside(uint64_t offset, uint64_t bytes, uint64_t pool_bytes) {
  return bytes <= pool_bytes && offset <= pool_bytes - bytes;  // no overflow, whatever the extent claims
}

__device__ __forceinline__ bool Valid(const KvExtentPair& x, const KvExtentCopyParams& p, bool copy) {
  if (x.bytes % 8 != 0 || x.src_offset % 8 != 0 || x.layer < 0 || x.layer >= (int64_t{1} << 16)) return false;
  if (!Inside(x.src_offset, x.bytes, p.src_bytes)) return false;
  return !copy || (x.dst_offset % 8 == 0 && Inside(x.dst_offset, x.bytes, p.dst_bytes));
}

// Words [w0, w1) of the extent at s (to d), this lane's share of them; returns the lane's
// checksum terms. 16-byte accesses where source and destination are 16-byte aligned
// alike (the first word peeled off when both are 8 past it), 8-byte ones otherwise.
template <bool kCopy, bool kSum>
__device__ __forceinline__ uint64_t CopyWords(const char* s, char* d, uint64_t w0, uint64_t w1, uint64_t layer,
                                              uint64_t first_word, int lane) {
  uint64_t sum = 0;
  const bool paired = !kCopy || ((reinterpret_cast<uintptr_t>(s) ^ reinterpret_cast<uintptr_t>(d)) & 15) == 0;
  if (paired) {
    uint64_t v0 = w0 + ((reinterpret_cast<uintptr_t>(s + 8 * w0) & 15) != 0 ? 1 : 0);
    if (v0 > w1) v0 = w1;
    const int pairs = static_cast<int>((w1 - v0) / 2);
    const uint64_t v1 = v0 + 2 * static_cast<uint64_t>(pairs);
    // The unpaired words at either end, on two different lanes.
    const uint64_t edge = lane == 0 && v0 > w0 ? w0 : (lane == 1 && v1 < w1 ? v1 : w1);
    if (edge < w1) {
      const uint64_t x = LoadOnce(reinterpret_cast<const uint64_t*>(s + 8 * edge));
      if constexpr (kCopy) *reinterpret_cast<uint64_t*>(d + 8 * edge) = x;
      if constexpr (kSum) sum += ExtentWordTerm(x, layer, first_word + edge);
    }
    const ulonglong2* sv = reinterpret_cast<const ulonglong2*>(s + 8 * v0);
    ulonglong2* dv = kCopy ? reinterpret_cast<ulonglong2*>(d + 8 * v0) : nullptr;
    for (int base = lane; base < pairs; base += 32 * kUnroll) {
      ulonglong2 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (base + u * 32 < pairs) v[u] = LoadOnce(sv + base + u * 32);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * 32;
        if (i < pairs) {
          if constexpr (kCopy) dv[i] = v[u];
          if constexpr (kSum) {
            const uint64_t g = first_word + v0 + 2 * static_cast<uint64_t>(i);
            sum += ExtentWordTerm(v[u].x, layer, g) + ExtentWordTerm(v[u].y, layer, g + 1);
          }
        }
      }
    }
  } else if constexpr (kCopy) {
    const uint64_t* sw = reinterpret_cast<const uint64_t*>(s + 8 * w0);
    uint64_t* dw = reinterpret_cast<uint64_t*>(d + 8 * w0);
    const int n = static_cast<int>(w1 - w0);
    for (int base = lane; base < n; base += 32 * kUnroll) {
      uint64_t v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (base + u * 32 < n) v[u] = LoadOnce(sw + base + u * 32);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * 32;
        if (i < n) {
          dw[i] = v[u];
          if constexpr (kSum) sum += ExtentWordTerm(v[u], layer, first_word + w0 + static_cast<uint64_t>(i));
        }
      }
    }
  }
  return sum;
}

template <bool kCopy, bool kSum>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) KvExtentCopyKernel(KvExtentCopyParams p, Plan plan) {
  internal::WaitAndTrigger();
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  const uint64_t stride = static_cast<uint64_t>(plan.parts) * plan.chunk_words;
  uint64_t sum = 0;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; t < plan.items; t += warps) {
    const int64_t e = t / plan.parts, part = t % plan.parts;
    const KvExtentPair x = p.extents[e];
    if (!Valid(x, p, kCopy)) {
      if (part == 0 && lane == 0 && p.bad_extent != nullptr) *p.bad_extent = 1;
      continue;
    }
    const uint64_t words = x.bytes / 8;
    const char* s = reinterpret_cast<const char*>(p.src) + x.src_offset;
    char* d = kCopy ? reinterpret_cast<char*>(p.dst) + x.dst_offset : nullptr;
    for (uint64_t w0 = static_cast<uint64_t>(part) * plan.chunk_words; w0 < words; w0 += stride) {
      const uint64_t w1 = words - w0 < plan.chunk_words ? words : w0 + plan.chunk_words;
      sum += CopyWords<kCopy, kSum>(s, d, w0, w1, static_cast<uint64_t>(x.layer), x.first_word, lane);
    }
  }
  if constexpr (kSum) {
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0 && sum != 0) atomicAdd(p.checksum, static_cast<unsigned long long>(sum));
  }
}

bool Aligned8(const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; }

}  // namespace

cudaError_t KvExtentCopy(const KvExtentCopyParams& p, cudaStream_t stream) {
  const bool copy = p.dst != nullptr, sum = p.checksum != nullptr;
  if ((!copy && !sum) || p.src == nullptr || !Aligned8(p.src) || (copy && !Aligned8(p.dst)) || p.num_extents < 0 ||
      (p.num_extents > 0 && p.extents == nullptr) || p.total_words >= (uint64_t{1} << 48)) {
    return cudaErrorInvalidValue;
  }
  if (p.num_extents == 0) return cudaSuccess;

  // total_words only sizes the plan (a wrong one costs balance, never bytes): chunks
  // shrink until every warp of the grid has one, and each extent gets as many parts as
  // the average extent has chunks, but no more than the grid has warps or an extent
  // inside the source pool can have chunks (a huge claimed total stays cheap).
  const int sms = CurrentDeviceMultiprocessors();
  const int64_t max_ctas = static_cast<int64_t>(sms) * kCtasPerSm;
  const uint64_t target_chunks = static_cast<uint64_t>(max_ctas) * kWarps;
  Plan plan;
  plan.chunk_words = kMaxChunkWords;
  while (plan.chunk_words > kMinChunkWords && p.total_words / plan.chunk_words < target_chunks) plan.chunk_words /= 2;
  const uint64_t chunks = (p.total_words + plan.chunk_words - 1) / plan.chunk_words;
  const uint64_t n = static_cast<uint64_t>(p.num_extents);
  const uint64_t most = std::min(target_chunks, p.src_bytes / 8 / plan.chunk_words + 1);
  plan.parts = static_cast<int64_t>(chunks <= n ? 1 : std::min((chunks + n - 1) / n, most));
  plan.items = p.num_extents * plan.parts;  // <= chunks + num_extents when parts > 1: no overflow
  const int64_t needed = plan.items / kWarps + (plan.items % kWarps != 0 ? 1 : 0);
  const int64_t ctas = needed < max_ctas ? needed : max_ctas;
  const dim3 grid(static_cast<unsigned>(ctas)), block(kThreads);
  if (copy && sum) return internal::Launch(KvExtentCopyKernel<true, true>, grid, block, 0, stream, p, plan);
  if (copy) return internal::Launch(KvExtentCopyKernel<true, false>, grid, block, 0, stream, p, plan);
  return internal::Launch(KvExtentCopyKernel<false, true>, grid, block, 0, stream, p, plan);
}

}  // namespace tandem::cuda
