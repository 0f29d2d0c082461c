#include "kernels/cuda/moe_expert_gemv.h"

#include <algorithm>
#include <atomic>
#include <climits>

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTileRows = 2 * kWarps;      // weight rows of a block's tile: two per warp
constexpr int kUnroll = 8;                 // 16-byte weight chunks per lane and row in flight
constexpr int kPassChunks = 32 * kUnroll;  // chunks of a weight row per pass (2048 elements)
constexpr int kMaxActive = kMoeExpertGemvMaxActive;
constexpr int kMaxRows = kMoeExpertGemvMaxRows;

// One group of the tile list, read once per block after the wait.
struct Entry {
  int group;
  int begin;  // first permuted row
  int rows;   // at most the kernel's row bound
  int a_row[kMaxRows];
  int dst_row[kMaxRows];
  float scale[kMaxRows];
};

// A streamed weight chunk: read once, not worth L1.
__device__ __forceinline__ uint4 LoadWeight(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void Unpack(uint4 w, float* f) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ float Dot8(const float* w, float4 a, float4 b) {
  float s = a.x * w[0];
  s = fmaf(a.y, w[1], s);
  s = fmaf(a.z, w[2], s);
  s = fmaf(a.w, w[3], s);
  s = fmaf(b.x, w[4], s);
  s = fmaf(b.y, w[5], s);
  s = fmaf(b.z, w[6], s);
  s = fmaf(b.w, w[7], s);
  return s;
}

// The two weight rows of `warp` in tile `tile`: a gate row and its up row (interleave
// blocks of 8), or two adjacent rows (adjacent output columns of the scatter-add).
__device__ __forceinline__ int2 WarpRows(bool silu, int tile, int warp) {
  const int r0 = tile * kTileRows;
  return silu ? make_int2(r0 + warp, r0 + kWarps + warp) : make_int2(r0 + 2 * warp, r0 + 2 * warp + 1);
}

// Issues this warp's loads of one pass over its two rows of (group, tile).
__device__ __forceinline__ void LoadPass(const MoeExpertGemvParams& p, int group, int tile, int pass, bool silu,
                                         uint4 (&wv)[2][kUnroll]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int2 r = WarpRows(silu, tile, warp);
  const __nv_bfloat16* base = p.b + static_cast<int64_t>(group) * p.b_group_stride;
  const uint4* w0 = reinterpret_cast<const uint4*>(base + static_cast<int64_t>(r.x) * p.k);
  const uint4* w1 = reinterpret_cast<const uint4*>(base + static_cast<int64_t>(r.y) * p.k);
  const int kc = p.k / 8;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int ch = pass * kPassChunks + u * 32 + lane;
    if (ch < kc) {
      wv[0][u] = LoadWeight(w0 + ch);
      wv[1][u] = LoadWeight(w1 + ch);
    } else {
      wv[0][u] = make_uint4(0, 0, 0, 0);
      wv[1][u] = make_uint4(0, 0, 0, 0);
    }
  }
}

// acc[c][m] += this lane's part of row c's product with A row m over one pass. xs holds
// the A rows as float4 halves of 16-byte chunks, [m][half][kc] (conflict-free reads).
template <int kRows>
__device__ __forceinline__ void ComputePass(const float4* xs, int kc, int pass, int rows,
                                            const uint4 (&wv)[2][kUnroll], float (&acc)[2][kRows]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int ch = pass * kPassChunks + u * 32 + lane;
    if (ch < kc) {
      float w0[8], w1[8];
      Unpack(wv[0][u], w0);
      Unpack(wv[1][u], w1);
#pragma unroll
      for (int m = 0; m < kRows; ++m) {
        if (m < rows) {
          const float4 a = xs[(2 * m) * kc + ch], b = xs[(2 * m + 1) * kc + ch];
          acc[0][m] += Dot8(w0, a, b);
          acc[1][m] += Dot8(w1, a, b);
        }
      }
    }
  }
}

template <int kRows>
__device__ __forceinline__ void Epilogue(const MoeExpertGemvParams& p, const Entry& e, int tile, bool silu,
                                         float (&acc)[2][kRows]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    if (m >= e.rows) continue;  // warp-uniform
    const float v0 = internal::WarpSum(acc[0][m]), v1 = internal::WarpSum(acc[1][m]);
    if (lane != m) continue;
    if (silu) {
      const int64_t at = static_cast<int64_t>(e.begin + m) * p.ldo + tile * (kTileRows / 2) + warp;
      const float v = internal::SiluMulValue(v0, v1);
      const __nv_bfloat16 hi = __float2bfloat16_rn(v);
      static_cast<__nv_bfloat16*>(p.out)[at] = hi;
      if (p.out_lo != nullptr) p.out_lo[at] = __float2bfloat16_rn(v - __bfloat162float(hi));
    } else {
      float* dst = static_cast<float*>(p.out) + static_cast<int64_t>(e.dst_row[m]) * p.ldo + tile * kTileRows + 2 * warp;
      const float s = e.scale[m];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      atomicAdd(reinterpret_cast<float2*>(dst), make_float2(s * v0, s * v1));
#else
      atomicAdd(dst, s * v0);
      atomicAdd(dst + 1, s * v1);
#endif
    }
  }
}

template <int kRows>
__global__ void __launch_bounds__(kThreads, 2) MoeExpertGemvKernel(MoeExpertGemvParams p) {
  extern __shared__ float4 xs[];  // [kRows][2][kc]: the A rows of the current group, float32
  __shared__ Entry table[kMaxActive];
  __shared__ int entries;
  const int tid = threadIdx.x;
  const bool silu = p.epilogue == GemmEpilogue::kSiluMulBf16;
  const int kc = p.k / 8;
  const int passes = (kc + kPassChunks - 1) / kPassChunks;
  const int tiles = p.n / kTileRows;
  const int first_static = p.num_groups - p.num_static;
  const int static_tiles = p.num_static * tiles;
  const int stride = static_cast<int>(gridDim.x);

  // Before the wait, only weights: the first tile's loads if it is a static group's, and
  // the block's other static tiles (and the first one's later passes) into L2.
  uint4 wv[2][kUnroll];
  int j = static_cast<int>(blockIdx.x);
  const bool preloaded = j < static_tiles;
  if (preloaded) {
    LoadPass(p, first_static + j / tiles, j % tiles, 0, silu, wv);
    for (int jj = passes > 1 ? j : j + stride; jj < static_tiles; jj += stride) {
      internal::PrefetchRangeL2(p.b + static_cast<int64_t>(first_static + jj / tiles) * p.b_group_stride +
                                    static_cast<int64_t>(jj % tiles) * kTileRows * p.k,
                                static_cast<int64_t>(kTileRows) * p.k * 2);
    }
  }
  internal::WaitAndTrigger();

  // The tile list's groups: the static ones, then the routed active groups (ascending, so
  // the first entries of active_groups; the static groups are the highest).
  {
    const int active = min(*p.num_active, p.max_active);
    const int g = tid < active ? p.active_groups[tid] : INT_MAX;
    const int routed = __syncthreads_count(g < first_static);
    auto fill = [&](int slot, int group) {
      if (slot >= kMaxActive) return;
      const int begin = p.group_offsets[group];
      const int rows = max(min(p.group_offsets[group + 1] - begin, kRows), 0);
      Entry& e = table[slot];
      e.group = group;
      e.begin = begin;
      e.rows = rows;
#pragma unroll
      for (int m = 0; m < kMaxRows; ++m) {
        const int r = begin + m;
        const bool ok = m < rows;
        e.a_row[m] = ok ? (p.a_rows != nullptr ? p.a_rows[r] : r) : -1;
        e.dst_row[m] = ok && !silu ? (p.out_rows != nullptr ? p.out_rows[r] : r) : 0;
        e.scale[m] = ok && !silu ? (p.row_scale != nullptr ? p.row_scale[r] : 1.0f) : 0.0f;
      }
    };
    if (tid < p.num_static) fill(tid, first_static + tid);
    if (tid < routed) fill(p.num_static + tid, g);
    if (tid == 0) entries = min(p.num_static + routed, kMaxActive);
    __syncthreads();
  }

  const int total = entries * tiles;
  if (j < total && !preloaded) LoadPass(p, table[j / tiles].group, j % tiles, 0, silu, wv);
  float acc[2][kRows];
#pragma unroll
  for (int m = 0; m < kRows; ++m) acc[0][m] = acc[1][m] = 0.0f;
  int staged_rows = -1;  // A rows in shared memory (block-uniform)
  int staged[kMaxRows];
#pragma unroll
  for (int m = 0; m < kMaxRows; ++m) staged[m] = -1;
  int pass = 0;
  while (j < total) {
    const int v = j / tiles, tile = j % tiles;
    const int rows = table[v].rows;
    if (pass == 0) {
      bool same = rows == staged_rows;
#pragma unroll
      for (int m = 0; m < kMaxRows; ++m) same = same && table[v].a_row[m] == staged[m];
      if (!same) {
        __syncthreads();  // the previous rows' readers are done
        for (int i = tid; i < rows * kc; i += kThreads) {
          const int m = i / kc, ch = i % kc;
          const int64_t at = static_cast<int64_t>(table[v].a_row[m]) * p.lda + ch * 8;
          float f[8];
          Unpack(*reinterpret_cast<const uint4*>(p.a + at), f);
          if (p.a_lo != nullptr) {
            float g[8];
            Unpack(*reinterpret_cast<const uint4*>(p.a_lo + at), g);
#pragma unroll
            for (int q = 0; q < 8; ++q) f[q] += g[q];
          }
          xs[(2 * m) * kc + ch] = make_float4(f[0], f[1], f[2], f[3]);
          xs[(2 * m + 1) * kc + ch] = make_float4(f[4], f[5], f[6], f[7]);
        }
        __syncthreads();
        staged_rows = rows;
#pragma unroll
        for (int m = 0; m < kMaxRows; ++m) staged[m] = table[v].a_row[m];
      }
    }
    ComputePass<kRows>(xs, kc, pass, rows, wv, acc);
    // The registers are free: the next loads go out before this tile's reduction.
    int next = j, next_pass = pass + 1;
    if (next_pass == passes) {
      next_pass = 0;
      next = j + stride;
    }
    if (next < total) LoadPass(p, table[next / tiles].group, next % tiles, next_pass, silu, wv);
    if (next_pass == 0) {
      Epilogue<kRows>(p, table[v], tile, silu, acc);
#pragma unroll
      for (int m = 0; m < kRows; ++m) acc[0][m] = acc[1][m] = 0.0f;
    }
    j = next;
    pass = next_pass;
  }
}

int MultiprocessorCount() {
  constexpr int kDevices = 16;
  static int cache[kDevices] = {};
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return 132;
  }
  if (dev >= 0 && dev < kDevices && cache[dev] > 0) return cache[dev];
  if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0) {
    cudaGetLastError();
    return 132;
  }
  if (dev >= 0 && dev < kDevices) cache[dev] = v;
  return v;
}

template <int kRows>
cudaError_t LaunchRows(const MoeExpertGemvParams& p, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(kRows) * p.k * sizeof(float);
  static std::atomic<size_t> configured{0};  // the kernel's dynamic shared memory limit, raised as needed
  if (smem > configured.load(std::memory_order_relaxed)) {
    const cudaError_t e = cudaFuncSetAttribute(MoeExpertGemvKernel<kRows>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
    if (e != cudaSuccess) return e;
    configured.store(smem, std::memory_order_relaxed);
  }
  // Two blocks per multiprocessor (the register bound of __launch_bounds__) where shared
  // memory allows: every block of the grid is resident at once, none waits for a second wave.
  const int per_sm = smem <= 96 * 1024 ? 2 : 1;
  const int64_t tiles = static_cast<int64_t>(p.max_active) * (p.n / kTileRows);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(tiles, static_cast<int64_t>(per_sm) * MultiprocessorCount()));
  return internal::Launch(MoeExpertGemvKernel<kRows>, dim3(blocks), dim3(kThreads), smem, stream, p);
}

}  // namespace

cudaError_t MoeExpertGemv(const MoeExpertGemvParams& p, cudaStream_t stream) {
  const bool silu = p.epilogue == GemmEpilogue::kSiluMulBf16;
  const bool scatter = p.epilogue == GemmEpilogue::kScatterAddF32;
  if (p.a == nullptr || p.b == nullptr || p.out == nullptr || p.group_offsets == nullptr ||
      p.active_groups == nullptr || p.num_active == nullptr ||
      !MoeExpertGemvSupports(p.n, p.k, p.max_rows, p.max_active, p.num_static) || p.num_groups <= 0 ||
      p.num_static > p.num_groups || p.lda < p.k || p.lda % 8 != 0 || p.b_group_stride % 8 != 0 ||
      p.b_group_stride < 0 || reinterpret_cast<uintptr_t>(p.a) % 16 != 0 ||
      (p.a_lo != nullptr && reinterpret_cast<uintptr_t>(p.a_lo) % 16 != 0) ||
      reinterpret_cast<uintptr_t>(p.b) % 16 != 0 || (!silu && !scatter) || (silu && p.ldo < p.n / 2) ||
      (!silu && p.out_lo != nullptr) ||
      (scatter && (p.ldo < p.n || p.ldo % 2 != 0 || reinterpret_cast<uintptr_t>(p.out) % 8 != 0))) {
    return cudaErrorInvalidValue;
  }
  switch (p.max_rows) {
    case 1: return LaunchRows<1>(p, stream);
    case 2: return LaunchRows<2>(p, stream);
    default: return LaunchRows<4>(p, stream);
  }
}

}  // namespace tandem::cuda
