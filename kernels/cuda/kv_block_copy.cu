#include "kernels/cuda/kv_block_copy.h"

#include <cstring>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/kv_checksum_mix.cuh"

namespace tandem::cuda {
namespace {

constexpr int kWarps = 4;  // per CTA
constexpr int kThreads = kWarps * 32;
constexpr int kCtasPerSm = 8;               // 1024 threads per SM: registers <= 64 per thread
constexpr int kUnroll = 4;                  // vectors in flight per lane
constexpr int64_t kMaxTileBytes = 32 << 10;  // a warp's tile, when there are enough tiles

using internal::kGolden;
using internal::Mix;

__host__ __device__ __forceinline__ uint64_t EntrySeed(int64_t layer, int64_t position) {
  return internal::LayerSeed(static_cast<uint64_t>(layer), static_cast<uint64_t>(position));
}

// Terms of words 2 * vec and 2 * vec + 1 of an entry whose seed is `seed`.
__device__ __forceinline__ uint64_t VectorTerms(uint64_t seed, int vec, uint4 v) {
  const uint64_t lo = static_cast<uint64_t>(v.x) | (static_cast<uint64_t>(v.y) << 32);
  const uint64_t hi = static_cast<uint64_t>(v.z) | (static_cast<uint64_t>(v.w) << 32);
  const uint64_t salt = seed + static_cast<uint64_t>(2 * vec + 1) * kGolden;
  return Mix(lo ^ salt) + Mix(hi ^ (salt + kGolden));
}

// Read once: bypass L1 (the data is not written during the kernel).
__device__ __forceinline__ uint4 LoadOnce(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// How the work is cut: tile t is layer layer_begin + t / (blocks * parts), block table
// index first_block + (t / parts) % blocks, slots [part * group, (part + 1) * group) of
// that block (clipped to [begin, end)), part = t % parts.
struct Tiling {
  int64_t first_block = 0;
  int64_t blocks = 0;
  int64_t group = 0;
  int64_t parts = 0;
  int64_t tiles = 0;
  int vecs_per_entry = 0;
};

template <bool kCopy, bool kSum>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) KvBlockCopyKernel(KvBlockCopyParams p, Tiling g) {
  internal::WaitAndTrigger();
  const int lane = threadIdx.x % 32;
  const int vpe = g.vecs_per_entry;
  // The lane's (entry, vector) within a tile, and how it moves per 32 vectors.
  const int e0 = lane / vpe, w0 = lane - e0 * vpe;
  const int step_e = 32 / vpe, step_w = 32 - step_e * vpe;
  const int64_t tiles_per_layer = g.blocks * g.parts;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  uint64_t sum = 0;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; t < g.tiles; t += warps) {
    const int64_t layer = p.layer_begin + t / tiles_per_layer;
    const int64_t r = t % tiles_per_layer;
    const int64_t j = g.first_block + r / g.parts;
    const int64_t part = r % g.parts;
    const int64_t block_start = j * p.block_size;
    const int64_t lo = block_start + part * g.group;
    const int64_t hi = block_start + (part + 1 < g.parts ? (part + 1) * g.group : p.block_size);
    const int64_t p0 = lo > p.begin ? lo : p.begin;
    const int64_t p1 = hi < p.end ? hi : p.end;
    if (p0 >= p1) continue;
    const int64_t src_block = p.src_blocks[j];
    if (src_block < 0 || src_block >= p.src_num_blocks) continue;
    int64_t dst_block = 0;
    if constexpr (kCopy) {
      dst_block = p.dst_blocks[j];
      if (dst_block < 0 || dst_block >= p.dst_num_blocks) continue;
    }
    const int64_t slot = p0 - block_start;
    const uint4* s = reinterpret_cast<const uint4*>(static_cast<const char*>(p.src) +
                                                    ((layer * p.src_num_blocks + src_block) * p.block_size + slot) *
                                                        p.entry_bytes);
    uint4* d = nullptr;
    if constexpr (kCopy) {
      d = reinterpret_cast<uint4*>(static_cast<char*>(p.dst) +
                                   ((layer * p.dst_num_blocks + dst_block) * p.block_size + slot) * p.entry_bytes);
    }
    const int n = static_cast<int>(p1 - p0) * vpe;
    int e = e0, w = w0;
    for (int base = lane; base < n; base += 32 * kUnroll) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (base + u * 32 < n) v[u] = LoadOnce(s + base + u * 32);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * 32;
        if (i < n) {
          if constexpr (kCopy) d[i] = v[u];
          if constexpr (kSum) sum += VectorTerms(EntrySeed(layer, p0 + e), w, v[u]);
        }
        if constexpr (kSum) {
          e += step_e;
          w += step_w;
          if (w >= vpe) {
            w -= vpe;
            ++e;
          }
        }
      }
    }
  }
  if constexpr (kSum) {
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0 && sum != 0) atomicAdd(p.checksum, static_cast<unsigned long long>(sum));
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t KvBlockCopy(const KvBlockCopyParams& p, cudaStream_t stream) {
  const bool copy = p.dst != nullptr, sum = p.checksum != nullptr;
  if ((!copy && !sum) || p.entry_bytes <= 0 || p.entry_bytes % 16 != 0 || p.entry_bytes > (int64_t{1} << 30) ||
      p.block_size <= 0 || p.block_size > (int64_t{1} << 30) || p.layer_begin < 0 || p.layer_end < p.layer_begin ||
      p.layer_end > (int64_t{1} << 16) || p.begin < 0 || p.end < p.begin || p.end > (int64_t{1} << 48) ||
      p.src == nullptr || !Aligned16(p.src) || p.src_blocks == nullptr || p.src_num_blocks <= 0 ||
      (copy && (!Aligned16(p.dst) || p.dst_blocks == nullptr || p.dst_num_blocks <= 0))) {
    return cudaErrorInvalidValue;
  }
  if (p.begin == p.end || p.layer_begin == p.layer_end) return cudaSuccess;

  Tiling g;
  g.vecs_per_entry = static_cast<int>(p.entry_bytes / 16);
  g.first_block = p.begin / p.block_size;
  g.blocks = (p.end - 1) / p.block_size - g.first_block + 1;
  const int64_t layers = p.layer_end - p.layer_begin;
  const int sms = CurrentDeviceMultiprocessors();
  // Tiles of up to kMaxTileBytes; smaller (down to one entry) until there is a tile for
  // every warp the grid can hold, so that small copies still reach every SM.
  const int64_t target_tiles = static_cast<int64_t>(sms) * kCtasPerSm * kWarps;
  int64_t group = kMaxTileBytes / p.entry_bytes;
  group = group < 1 ? 1 : (group > p.block_size ? p.block_size : group);
  auto tiles = [&](int64_t gr) { return layers * g.blocks * ((p.block_size + gr - 1) / gr); };
  while (group > 1 && tiles(group) < target_tiles) group = (group + 1) / 2;
  g.group = group;
  g.parts = (p.block_size + group - 1) / group;
  g.tiles = tiles(group);
  const int64_t max_ctas = static_cast<int64_t>(sms) * kCtasPerSm;
  const int64_t ctas = (g.tiles + kWarps - 1) / kWarps < max_ctas ? (g.tiles + kWarps - 1) / kWarps : max_ctas;
  const dim3 grid(static_cast<unsigned>(ctas)), block(kThreads);
  if (copy && sum) return internal::Launch(KvBlockCopyKernel<true, true>, grid, block, 0, stream, p, g);
  if (copy) return internal::Launch(KvBlockCopyKernel<true, false>, grid, block, 0, stream, p, g);
  return internal::Launch(KvBlockCopyKernel<false, true>, grid, block, 0, stream, p, g);
}

uint64_t KvEntryChecksum(int64_t layer, int64_t position, const void* entry, int64_t entry_bytes) {
  const uint64_t seed = EntrySeed(layer, position);
  const unsigned char* bytes = static_cast<const unsigned char*>(entry);
  uint64_t sum = 0;
  for (int64_t w = 0; w < entry_bytes / 8; ++w) {
    uint64_t x;
    std::memcpy(&x, bytes + 8 * w, 8);  // little-endian, as the device reads it
    sum += Mix(x ^ (seed + static_cast<uint64_t>(w + 1) * kGolden));
  }
  return sum;
}

}  // namespace tandem::cuda
