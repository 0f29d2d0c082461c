#include "kernels/cuda/fp8_gemm.h"

#include <algorithm>

#include <cuda.h>
#include <cuda_fp8.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/tma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace tandem::cuda {
namespace {

using internal::WarpMax;

constexpr int kTile = 128;                 // rows of a and of b per tile, and k per stage
constexpr int kTileBytes = kTile * kTile;  // one operand's stage: 16 KiB of e4m3
constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups
constexpr float kE4m3Max = 448.0f;

constexpr int kMaxGroups = kFp8GemmMaxGroups;

struct GemmArgs {
  const float* a_scales;
  int64_t a_scales_stride;
  const float* b_scales;
  void* y;
  int64_t ldy;
  int y_bf16;
  int accumulate;
  int m, n, k_blocks;
  int m_blocks, n_blocks;
  int groups;                    // 0: one product
  const int32_t* group_offsets;  // grouped: [groups + 1]
  int b_row_scales;
};

// Where one output tile (128 rows, kBn columns) reads and writes.
struct Tile {
  int a_row;     // first row of a (and of y)
  int rows_end;  // rows of a from here on belong to others
  int b_row;     // first row of b's 2-D view (groups stacked)
  int nb;        // column block of y
  int group;
};

#ifdef TANDEM_HAS_WGMMA
using namespace wgmma;  // NOLINT: the kernel below is written in these building blocks

constexpr int kGroupRows = 8;  // tiles of 8 row blocks walk the columns together (L2 reuse)

// One product: groups of kGroupRows row blocks, row block fastest, walk the column blocks.
// Grouped: the groups' tiles one group after another (tile_start: each group's first tile),
// row block fastest within a group, so tiles in flight together share b's tile.
template <int kBn>
__device__ __forceinline__ Tile TileAt(int t, const GemmArgs& g, const int* tile_start) {
  Tile tile;
  if (g.groups == 0) {
    const int per_group = kGroupRows * g.n_blocks;
    const int first = (t / per_group) * kGroupRows;
    const int rows = min(kGroupRows, g.m_blocks - first);
    const int in = t % per_group;
    const int mb = first + in % rows;
    tile.nb = in / rows;
    tile.a_row = mb * kTile;
    tile.rows_end = g.m;
    tile.b_row = tile.nb * kBn;
    tile.group = 0;
    return tile;
  }
  int lo = 0, hi = g.groups - 1;  // the last group whose first tile is at or before t
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_start[mid] <= t) lo = mid; else hi = mid - 1;
  }
  const int begin = g.group_offsets[lo], end = g.group_offsets[lo + 1];
  const int m_blocks = (end - begin + kTile - 1) / kTile, in = t - tile_start[lo];
  tile.nb = in / m_blocks;
  tile.a_row = begin + (in % m_blocks) * kTile;
  tile.rows_end = end;
  tile.b_row = lo * g.n + tile.nb * kBn;
  tile.group = lo;
  return tile;
}

// d (+)= A . B^T, A 64x32 and B 128x32 e4m3 from shared memory (K-major), float32 out.
__device__ __forceinline__ void WgmmaM64N128K32E4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
#endif  // TANDEM_HAS_WGMMA

// Shared-memory layout of a kernel whose tiles are 128 rows of a by kBn rows of b.
template <int kBn>
struct Layout {
  static constexpr int kStages = kBn == 256 ? 4 : 6;
  static constexpr int kBBytes = kBn * kTile;  // b's stage
  static constexpr int kSmem = kStages * (kTileBytes + kBBytes) + 2 * kStages * 8 + 1024;
};

template <int kBn>
__global__ void __launch_bounds__(kThreads, 1)
    Fp8GemmKernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map, GemmArgs g) {
#ifdef TANDEM_HAS_WGMMA
  using L = Layout<kBn>;
  constexpr int kStages = L::kStages, kHalves = kBn / 128;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t raw = mma::SmemAddr(smem_raw);
  const uint32_t base = (raw + 1023) & ~1023u;  // 128-byte swizzle atoms are 1 KiB aligned
  const uint32_t a_smem = base;
  const uint32_t b_smem = base + kStages * kTileBytes;
  const uint32_t full_bar = b_smem + kStages * L::kBBytes;  // [kStages] x 8 bytes
  const uint32_t empty_bar = full_bar + kStages * 8;
  const int wg = threadIdx.x / 128;
  __shared__ int tile_start[kMaxGroups + 1];
  int tiles = g.m_blocks * g.n_blocks;
  if (g.groups > 0) {
    if (threadIdx.x == 0) {
      int total = 0;
      for (int i = 0; i < g.groups; ++i) {
        tile_start[i] = total;
        total += (g.group_offsets[i + 1] - g.group_offsets[i] + kTile - 1) / kTile * g.n_blocks;
      }
      tile_start[g.groups] = total;
    }
    __syncthreads();
    tiles = tile_start[g.groups];
  }

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      tma::MbarInit(full_bar + 8 * s, 1);
      tma::MbarInit(empty_bar + 8 * s, 8);  // one arrival per consumer warp
    }
    tma::MbarInitFence();
    tma::PrefetchDescriptor(&a_map);
    tma::PrefetchDescriptor(&b_map);
  }
  __syncthreads();

  if (wg == 0) {
    tma::ShrinkRegisters<40>();
    if (threadIdx.x != 0) return;
    int it = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      const Tile tile = TileAt<kBn>(t, g, tile_start);
      for (int kb = 0; kb < g.k_blocks; ++kb, ++it) {
        const int s = it % kStages;
        const uint32_t round = it / kStages;
        tma::MbarWait(empty_bar + 8 * s, (round & 1) ^ 1);
        tma::MbarArriveExpectTx(full_bar + 8 * s, kTileBytes + L::kBBytes);
        tma::Load2d(a_smem + s * kTileBytes, &a_map, kb * kTile, tile.a_row, full_bar + 8 * s);
        tma::Load2d(b_smem + s * L::kBBytes, &b_map, kb * kTile, tile.b_row, full_bar + 8 * s);
      }
    }
    return;
  }

  tma::GrowRegisters<232>();
  const int cw = wg - 1;  // consumer: rows [64 cw, 64 cw + 64) of each tile
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32, gq = lane / 4, tq = lane % 4;
  const int n_blocks128 = (g.n + kTile - 1) / kTile;
  int it = 0;
  float part[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) part[i] = 0.0f;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    const Tile tile = TileAt<kBn>(t, g, tile_start);
    const int row0 = tile.a_row + 64 * cw + 16 * warp + gq, row1 = row0 + 8;
    const float* sa0 = g.a_scales + min(row0, tile.rows_end - 1);
    const float* sa1 = g.a_scales + min(row1, tile.rows_end - 1);
    // b's scales per 128-row half of the tile: its block (one product's block scales), or
    // the rows of its first even and odd octets (row scales).
    const float* sb_even[kHalves];
    const float* sb_odd[kHalves];
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      const int first_row = min(tile.nb * kBn + h * kTile, g.n - 1);
      if (g.b_row_scales) {
        const int64_t group_row = static_cast<int64_t>(tile.group) * g.n;
        sb_even[h] = g.b_scales + (group_row + first_row) * g.k_blocks;
        sb_odd[h] = g.b_scales + (group_row + min(first_row + 8, g.n - 1)) * g.k_blocks;
      } else {
        sb_even[h] = sb_odd[h] =
            g.b_scales + (static_cast<int64_t>(tile.group) * n_blocks128 + first_row / kTile) * g.k_blocks;
      }
    }
    float acc[kHalves][64];
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[h][i] = 0.0f;
    }
    for (int kb = 0; kb < g.k_blocks; ++kb, ++it) {
      const int s = it % kStages;
      const uint32_t round = it / kStages;
      // The scales load while the tile arrives.
      const float scale_a0 = __ldg(sa0 + kb * g.a_scales_stride), scale_a1 = __ldg(sa1 + kb * g.a_scales_stride);
      float scale_be[kHalves], scale_bo[kHalves];
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        scale_be[h] = __ldg(sb_even[h] + kb);
        scale_bo[h] = __ldg(sb_odd[h] + kb);
      }
      tma::MbarWait(full_bar + 8 * s, round & 1);
      const uint32_t a_addr = a_smem + s * kTileBytes + cw * 64 * kTile;
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        const uint32_t b_addr = b_smem + s * L::kBBytes + h * kTileBytes;
        WgmmaFence();
#pragma unroll
        for (int j = 0; j < kTile / 32; ++j) {
          WgmmaM64N128K32E4m3(part, SmemDesc(a_addr + 32 * j, 16, 1024), SmemDesc(b_addr + 32 * j, 16, 1024), j > 0);
        }
        WgmmaCommit();
        WgmmaWait<0>();
#pragma unroll
        for (int i = 0; i < 64; ++i) FenceReg(part[i]);
        // This warp is done with the stage once it has its last half's products.
        if (h == kHalves - 1 && lane == 0) tma::MbarArrive(empty_bar + 8 * s);
        // Value i is row row0 or row1 ((i >> 1) & 1) of column octet i >> 2.
        const float s0e = scale_a0 * scale_be[h], s0o = scale_a0 * scale_bo[h];
        const float s1e = scale_a1 * scale_be[h], s1o = scale_a1 * scale_bo[h];
#pragma unroll
        for (int i = 0; i < 64; ++i) {
          const bool odd = (i >> 2) & 1;
          acc[h][i] = fmaf(part[i], (i & 2) ? (odd ? s1o : s1e) : (odd ? s0o : s0e), acc[h][i]);
        }
      }
    }
    // Value 4 j + e of a half is row row0 (+8 for e >= 2), column 8 j + 2 tq + (e & 1) of it.
#pragma unroll
    for (int hh = 0; hh < kHalves; ++hh) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = h ? row1 : row0;
        if (row >= tile.rows_end) continue;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const int col = tile.nb * kBn + hh * kTile + 8 * j + 2 * tq;
          if (col >= g.n) continue;
          const float v0 = acc[hh][4 * j + 2 * h], v1 = acc[hh][4 * j + 2 * h + 1];
          const bool pair = col + 1 < g.n;
          if (g.y_bf16) {
            __nv_bfloat16* y = static_cast<__nv_bfloat16*>(g.y) + static_cast<int64_t>(row) * g.ldy + col;
            if (pair) {
              *reinterpret_cast<__nv_bfloat162*>(y) = __floats2bfloat162_rn(v0, v1);
            } else {
              *y = __float2bfloat16_rn(v0);
            }
          } else {
            float* y = static_cast<float*>(g.y) + static_cast<int64_t>(row) * g.ldy + col;
            if (pair) {
              float2 v = make_float2(v0, v1);
              if (g.accumulate) {
                const float2 old = *reinterpret_cast<float2*>(y);
                v.x += old.x;
                v.y += old.y;
              }
              *reinterpret_cast<float2*>(y) = v;
            } else {
              y[0] = g.accumulate ? y[0] + v0 : v0;
            }
          }
        }
      }
    }
  }
#else
  __trap();  // built only for sm_90a; the launcher refuses other devices
#endif
}

// One warp per (row, 128-column block): 4 values a lane.
template <typename T>
__global__ void Fp8QuantizeRowsKernel(Fp8QuantizeRowsParams p, int k_blocks) {
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= static_cast<int64_t>(p.m) * k_blocks) return;
  const int row = static_cast<int>(w / k_blocks), kb = static_cast<int>(w % k_blocks);
  const int c = kb * kTile + 4 * lane;
  const T* x = static_cast<const T*>(p.x) + static_cast<int64_t>(row) * p.ldx + c;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (c < p.k) {  // k is a multiple of 4: a lane's four are all in range or all out
    // One 8- or 16-byte load (x and ldx are aligned to four values).
    if constexpr (sizeof(T) == 2) {
      const uint2 raw = *reinterpret_cast<const uint2*>(x);
      const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
      const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
      v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
    } else {
      const float4 f = *reinterpret_cast<const float4*>(x);
      v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    }
  }
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  amax = WarpMax(amax);
  const float scale = fmaxf(amax, 1e-4f) / kE4m3Max;
  if (lane == 0) p.scales[static_cast<int64_t>(kb) * p.scales_stride + row] = scale;
  if (c >= p.k) return;
  uint32_t packed = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const uint32_t code = __nv_cvt_float_to_fp8(__fdiv_rn(v[e], scale), __NV_SATFINITE, __NV_E4M3);
    packed |= code << (8 * e);
  }
  *reinterpret_cast<uint32_t*>(p.q + static_cast<int64_t>(row) * p.ldq + c) = packed;
}

bool Aligned(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

int DeviceMajor() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    return 0;
  }
  return major;
}

}  // namespace

bool Fp8GemmSupported() { return DeviceMajor() == 9; }

cudaError_t Fp8Gemm(const Fp8GemmParams& p, cudaStream_t stream) {
  if (p.m < 0 || p.n < 0 || p.k < 0) return cudaErrorInvalidValue;
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  const int k_blocks = (p.k + kTile - 1) / kTile;
  if (p.k == 0 || p.k % 16 != 0 || p.a == nullptr || p.b == nullptr || p.a_scales == nullptr ||
      p.b_scales == nullptr || p.y == nullptr || p.lda < p.k || p.lda % 16 != 0 || p.ldb < p.k || p.ldb % 16 != 0 ||
      p.a_scales_stride < p.m || p.ldy < p.n || p.ldy % 2 != 0 || !Aligned(p.y, 8) || (p.accumulate && p.y_bf16) ||
      p.groups < 0 || p.groups > kFp8GemmMaxGroups || (p.groups > 0) != (p.group_offsets != nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (!Fp8GemmSupported()) return cudaErrorNotSupported;
  const int bn = p.wide_tiles ? 256 : 128;
  CUtensorMap a_map, b_map;
  cudaError_t err = tma::EncodeBytes2d(&a_map, p.a, p.m, p.k, p.lda, kTile, kTile);
  const uint64_t b_rows = static_cast<uint64_t>(p.n) * std::max(p.groups, 1);
  if (err == cudaSuccess) err = tma::EncodeBytes2d(&b_map, p.b, b_rows, p.k, p.ldb, bn, kTile);
  if (err != cudaSuccess) return err;
  static const cudaError_t smem_set = [] {
    const cudaError_t e = cudaFuncSetAttribute(Fp8GemmKernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               Layout<128>::kSmem);
    return e != cudaSuccess ? e
                            : cudaFuncSetAttribute(Fp8GemmKernel<256>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   Layout<256>::kSmem);
  }();
  if (smem_set != cudaSuccess) return smem_set;
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    return cudaGetLastError();
  }
  GemmArgs g{};
  g.a_scales = p.a_scales;
  g.a_scales_stride = p.a_scales_stride;
  g.b_scales = p.b_scales;
  g.y = p.y;
  g.ldy = p.ldy;
  g.y_bf16 = p.y_bf16 ? 1 : 0;
  g.accumulate = p.accumulate ? 1 : 0;
  g.m = p.m;
  g.n = p.n;
  g.k_blocks = k_blocks;
  g.m_blocks = (p.m + kTile - 1) / kTile;
  g.n_blocks = (p.n + bn - 1) / bn;
  g.groups = p.groups;
  g.group_offsets = p.group_offsets;
  g.b_row_scales = p.b_row_scales ? 1 : 0;
  // Grouped: the tile count is on the device; every multiprocessor takes part.
  const int tiles = p.groups > 0 ? sms : g.m_blocks * g.n_blocks;
  const int grid = std::min(tiles, sms);
  if (bn == 256) {
    Fp8GemmKernel<256><<<grid, kThreads, Layout<256>::kSmem, stream>>>(a_map, b_map, g);
  } else {
    Fp8GemmKernel<128><<<grid, kThreads, Layout<128>::kSmem, stream>>>(a_map, b_map, g);
  }
  return cudaGetLastError();
}

cudaError_t Fp8QuantizeRows(const Fp8QuantizeRowsParams& p, cudaStream_t stream) {
  if (p.m < 0 || p.k < 0) return cudaErrorInvalidValue;
  if (p.m == 0 || p.k == 0) return cudaSuccess;
  const int elem = p.x_bf16 ? 2 : 4;
  if (p.x == nullptr || p.q == nullptr || p.scales == nullptr || p.k % 4 != 0 || p.ldx < p.k || p.ldx % 4 != 0 ||
      p.ldq < p.k || p.ldq % 4 != 0 || p.scales_stride < p.m || !Aligned(p.x, 4 * elem) || !Aligned(p.q, 4)) {
    return cudaErrorInvalidValue;
  }
  const int k_blocks = (p.k + kTile - 1) / kTile;
  const int64_t threads = static_cast<int64_t>(p.m) * k_blocks * 32;
  const int block = 256;
  const int64_t grid = (threads + block - 1) / block;
  if (grid > 0x7fffffff) return cudaErrorInvalidValue;
  if (p.x_bf16) {
    Fp8QuantizeRowsKernel<__nv_bfloat16><<<static_cast<unsigned>(grid), block, 0, stream>>>(p, k_blocks);
  } else {
    Fp8QuantizeRowsKernel<float><<<static_cast<unsigned>(grid), block, 0, stream>>>(p, k_blocks);
  }
  return cudaGetLastError();
}

}  // namespace tandem::cuda
