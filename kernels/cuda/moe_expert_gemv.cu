#include "kernels/cuda/moe_expert_gemv.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <type_traits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/narrow_widen.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// A chunk is 8 weights of a row: 16 bytes in bf16, 8 in FP8. Chunks per lane and row in
// flight: the same registers (and twice the chunks) for FP8.
template <bool kFp8>
inline constexpr int kUnroll = kFp8 ? 16 : 8;
// A row pair's lanes: a warp in bf16, a half-warp in FP8. (A warp's 16 chunks of 8 codes a
// lane would span 4096 columns, twice a decode expert's width: half of them idle. A
// half-warp's span, 2048, is one pass of a 2048-wide row with every load in use.)
template <bool kFp8>
inline constexpr int kLanes = kFp8 ? 16 : 32;
template <bool kFp8>
inline constexpr int kPairs = kThreads / kLanes<kFp8>;  // row pairs of a block
template <bool kFp8>
inline constexpr int kTileRows = 2 * kPairs<kFp8>;  // weight rows of a block's tile: two per pair
template <bool kFp8>
inline constexpr int kPassChunks = kLanes<kFp8> * kUnroll<kFp8>;  // chunks of a weight row per pass
template <bool kFp8>
using Word = std::conditional_t<kFp8, uint2, uint4>;  // one chunk's weights
// A pass's loads in parts: FP8 in two, so that one part's loads are in flight while the
// other's products are made (the FP8 kernel was latency-bound, ncu: no pipe busy, DRAM at
// 37-47 %); bf16 in one (it reads at the copy rate as it is).
template <bool kFp8>
inline constexpr int kParts = kFp8 ? 2 : 1;
template <bool kFp8>
inline constexpr int kPartChunks = kUnroll<kFp8> / kParts<kFp8>;
constexpr int kMaxActive = kMoeExpertGemvMaxActive;
constexpr int kMaxRows = kMoeExpertGemvMaxRows;
constexpr size_t kStagedBytes = 96 * 1024;  // staged_rows up to this: still two blocks per SM

// One group of the tile list. Slot m of a group: its m-th row, or with a_row_count its A
// row m (the staged rows), so that every group's products use the same staged rows.
struct Entry {
  int group;
  int begin;  // first permuted row
  int rows;   // at most the kernel's row bound
  int a_row[kMaxRows];   // A row of slot m (without a_row_count)
  int row_of[kMaxRows];  // permuted row of slot m; -1: none
  int dst_row[kMaxRows];
  float scale[kMaxRows];
};

// Eight E4M3 codes (low byte first) as floats (exact).
__device__ __forceinline__ void Unpack(uint2 w, float* f) {
  internal::WidenFp8Word(w.x, f);
  internal::WidenFp8Word(w.y, f + 4);
}

// Eight bf16 weights as floats.
__device__ __forceinline__ void Unpack(uint4 w, float* f) { internal::WidenBf16(w, f); }

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

// The two weight rows of row pair `pair` in tile `tile`: a gate row and its up row
// (interleave blocks of 8: pair 8b + i has gate row 16b + i, up row 16b + 8 + i, i.e. the
// output column tile * kTileRows / 2 + pair), or two adjacent rows (adjacent output columns
// of the scatter-add).
template <bool kFp8>
__device__ __forceinline__ int2 PairRows(bool silu, int tile, int pair) {
  const int r0 = tile * kTileRows<kFp8>;
  if (!silu) return make_int2(r0 + 2 * pair, r0 + 2 * pair + 1);
  const int gate = r0 + 16 * (pair / 8) + pair % 8;
  return make_int2(gate, gate + 8);
}

// Issues this row pair's loads of part `part` of one pass over its two rows of (group, tile).
template <bool kFp8, int kPart>
__device__ __forceinline__ void LoadPass(const MoeExpertGemvParams& p, int group, int tile, int pass, bool silu,
                                         Word<kFp8> (&wv)[2][kPartChunks<kFp8>]) {
  const int pair = threadIdx.x / kLanes<kFp8>, lane = threadIdx.x % kLanes<kFp8>;
  const int2 r = PairRows<kFp8>(silu, tile, pair);
  const Word<kFp8>* w0;
  const Word<kFp8>* w1;
  if constexpr (kFp8) {
    const uint8_t* base = p.b_fp8 + static_cast<int64_t>(group) * p.b_group_stride;
    w0 = reinterpret_cast<const uint2*>(base + static_cast<int64_t>(r.x) * p.k);
    w1 = reinterpret_cast<const uint2*>(base + static_cast<int64_t>(r.y) * p.k);
  } else {
    const __nv_bfloat16* base = p.b + static_cast<int64_t>(group) * p.b_group_stride;
    w0 = reinterpret_cast<const uint4*>(base + static_cast<int64_t>(r.x) * p.k);
    w1 = reinterpret_cast<const uint4*>(base + static_cast<int64_t>(r.y) * p.k);
  }
  const int kc = p.k / 8;
#pragma unroll
  for (int u = 0; u < kPartChunks<kFp8>; ++u) {
    const int ch = pass * kPassChunks<kFp8> + (kPart * kPartChunks<kFp8> + u) * kLanes<kFp8> + lane;
    if (ch < kc) {
      wv[0][u] = internal::LoadStreamed(w0 + ch);
      wv[1][u] = internal::LoadStreamed(w1 + ch);
    } else {
      wv[0][u] = Word<kFp8>{};
      wv[1][u] = Word<kFp8>{};
    }
  }
}

// acc[c][m] += this lane's part of row c's product with A row m over one pass. xs holds
// the A rows as float4 halves of 8-weight chunks, [m][half][kc] (conflict-free reads).
// FP8: each chunk's sum times its row's scale for its 128 columns (scales[c][ch / 16]).
template <int kRows, bool kFp8, int kPart>
__device__ __forceinline__ void ComputePass(const float4* xs, int kc, int pass, int rows,
                                            const Word<kFp8> (&wv)[2][kPartChunks<kFp8>],
                                            const float* const (&scales)[2], float (&acc)[2][kRows]) {
  const int lane = threadIdx.x % kLanes<kFp8>;
#pragma unroll
  for (int u = 0; u < kPartChunks<kFp8>; ++u) {
    const int ch = pass * kPassChunks<kFp8> + (kPart * kPartChunks<kFp8> + u) * kLanes<kFp8> + lane;
    if (ch < kc) {
      float w0[8], w1[8];
      Unpack(wv[0][u], w0);
      Unpack(wv[1][u], w1);
      float s0 = 1.0f, s1 = 1.0f;
      if constexpr (kFp8) {
        s0 = __ldg(scales[0] + ch / 16);
        s1 = __ldg(scales[1] + ch / 16);
      }
#pragma unroll
      for (int m = 0; m < kRows; ++m) {
        if (m < rows) {
          const float4 a = xs[(2 * m) * kc + ch], b = xs[(2 * m + 1) * kc + ch];
          if constexpr (kFp8) {
            acc[0][m] = fmaf(s0, Dot8(w0, a, b), acc[0][m]);
            acc[1][m] = fmaf(s1, Dot8(w1, a, b), acc[1][m]);
          } else {
            acc[0][m] += Dot8(w0, a, b);
            acc[1][m] += Dot8(w1, a, b);
          }
        }
      }
    }
  }
}

// FP8: the scale rows of this pair's two weight rows of (group, tile); bf16: unused.
template <bool kFp8>
__device__ __forceinline__ void ScaleRows(const MoeExpertGemvParams& p, int group, int tile, bool silu,
                                          const float* (&rows)[2]) {
  rows[0] = rows[1] = nullptr;
  if constexpr (!kFp8) return;
  const int2 r = PairRows<kFp8>(silu, tile, threadIdx.x / kLanes<kFp8>);
  const int64_t kb = (p.k + 127) / 128;
  const float* base = p.b_row_scales + (static_cast<int64_t>(group) * p.n) * kb;
  rows[0] = base + r.x * kb;
  rows[1] = base + r.y * kb;
}

template <int kRows, bool kFp8>
__device__ __forceinline__ void Epilogue(const MoeExpertGemvParams& p, const Entry& e, int tile, bool silu,
                                         float (&acc)[2][kRows]) {
  constexpr int kTile = kTileRows<kFp8>;
  const int pair = threadIdx.x / kLanes<kFp8>, lane = threadIdx.x % kLanes<kFp8>;
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const int row = e.row_of[m];
    if (row < 0) continue;  // warp-uniform
    const float v0 = internal::LaneGroupSum<kLanes<kFp8>>(acc[0][m]);
    const float v1 = internal::LaneGroupSum<kLanes<kFp8>>(acc[1][m]);
    if (lane != m) continue;
    if (silu) {
      const int64_t at = static_cast<int64_t>(row) * p.ldo + tile * (kTile / 2) + pair;
      const float v = internal::SiluMulValue(v0, v1);
      const __nv_bfloat16 hi = __float2bfloat16_rn(v);
      static_cast<__nv_bfloat16*>(p.out)[at] = hi;
      if (p.out_lo != nullptr) p.out_lo[at] = __float2bfloat16_rn(v - __bfloat162float(hi));
    } else if (p.partial != nullptr) {  // summed in order by FinishColumnTiles
      const float s = e.scale[m];
      *reinterpret_cast<float2*>(p.partial + static_cast<int64_t>(row) * p.ldo + tile * kTile + 2 * pair) =
          make_float2(s * v0, s * v1);
    } else {
      float* dst =
          static_cast<float*>(p.out) + static_cast<int64_t>(e.dst_row[m]) * p.ldo + tile * kTile + 2 * pair;
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

// MoeExpertGemvParams::partial: each (group, column tile) of a block counts itself on the
// tile's counter right after its Epilogue; the last of a tile's `contributors` (every active
// group) adds the tile's partial rows into out, at the end of its block's work. Thread 0's
// acq_rel atomic comes after a barrier that orders the block's partial stores before it;
// it keeps the tiles it finished last in `last_tiles` (shared) without making the block wait
// for the atomic's round trip (only thread 0's warp waits, while its next weights are in
// flight); the sums in FinishColumnTiles come after a barrier, i.e. after that acquire.
constexpr int kMaxLastTiles = 128;  // column tiles a block may finish last (the launcher checks)

struct LastTiles {
  int count;
  int tile[kMaxLastTiles];
};

__device__ __forceinline__ void CountColumnTile(const MoeExpertGemvParams& p, int tile, int contributors,
                                                LastTiles& last) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned prev;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(prev) : "l"(p.tile_counters + tile) : "memory");
    if (prev == static_cast<unsigned>(contributors - 1)) last.tile[last.count++] = tile;
  }
}

template <bool kFp8>
__device__ __forceinline__ void FinishColumnTiles(const MoeExpertGemvParams& p, LastTiles& last) {
  constexpr int kTile = kTileRows<kFp8>;
  __syncthreads();
  const int n = last.count;
  if (n == 0) return;
  const int rows = __ldcg(p.group_offsets + p.num_groups);
  for (int i = threadIdx.x; i < n * p.out_row_count * kTile; i += kThreads) {
    const int tile = last.tile[i / (p.out_row_count * kTile)];
    const int at = i % (p.out_row_count * kTile);
    const int t = at / kTile, c = tile * kTile + at % kTile;
    float s = 0.0f;
    // Eight rows' loads in flight at once (a decode step's token has 8 or so: one round
    // trip, where a load per addition cost 8), then their sums in ascending row order.
    constexpr int kBatch = 8;
    for (int r0 = 0; r0 < rows; r0 += kBatch) {
      int dst[kBatch];
      float v[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int r = min(r0 + u, rows - 1);
        dst[u] = r0 + u >= rows ? -1 : p.out_rows != nullptr ? __ldcg(p.out_rows + r) : r;
        v[u] = __ldcg(p.partial + static_cast<int64_t>(r) * p.ldo + c);
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (dst[u] == t) s += v[u];
      }
    }
    static_cast<float*>(p.out)[static_cast<int64_t>(t) * p.ldo + c] += s;
  }
  // Every contributor has counted: ready for the next launch.
  for (int i = threadIdx.x; i < n; i += kThreads) p.tile_counters[last.tile[i]] = 0u;
}

// Row m of A (bf16 value + optional remainder, read from L2) into the staged rows as float32.
__device__ __forceinline__ void StageChunk(const MoeExpertGemvParams& p, float4* xs, int kc, int m, int a_row, int ch) {
  const int64_t at = static_cast<int64_t>(a_row) * p.lda + ch * 8;
  float f[8];
  Unpack(__ldcg(reinterpret_cast<const uint4*>(p.a + at)), f);
  if (p.a_lo != nullptr) {
    float g[8];
    Unpack(__ldcg(reinterpret_cast<const uint4*>(p.a_lo + at)), g);
#pragma unroll
    for (int q = 0; q < 8; ++q) f[q] += g[q];
  }
  xs[(2 * m) * kc + ch] = make_float4(f[0], f[1], f[2], f[3]);
  xs[(2 * m + 1) * kc + ch] = make_float4(f[4], f[5], f[6], f[7]);
}

// The A rows of an early launch (norm_x): RMSNorm of norm_x's rows with MoeFusedRoute's
// arithmetic (its thread mapping, warp sums and order of the warp totals: the same bits),
// staged as the bf16 value plus, with a_lo, its bf16 remainder, as StageChunk stages that
// kernel's h_bf16 / h_lo. Before the wait: norm_x is complete (the previous kernel waited
// for its writer before letting this one start), read through L2; the norm weights are
// constants.
__device__ __forceinline__ void StageNormalizedRows(const MoeExpertGemvParams& p, float4* xs, int kc,
                                                    float (&red)[kWarps][kMaxRows]) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, K = p.k;
  for (int t = 0; t < p.a_row_count; ++t) {
    const float* x = p.norm_x + static_cast<int64_t>(t) * p.norm_x_stride;
    float s = 0.0f;
    for (int i = tid; i < K; i += kThreads) {
      const float v = __ldcg(x + i);
      s += v * v;
    }
    s = internal::WarpSum(s);
    if (lane == 0) red[warp][t] = s;
  }
  __syncthreads();
  for (int i = tid; i < p.a_row_count * kc; i += kThreads) {
    const int m = i / kc, ch = i % kc;
    float total = 0.0f;
    for (int w = 0; w < kWarps; ++w) total += red[w][m];
    const float inv = rsqrtf(total / static_cast<float>(K) + p.norm_eps);
    const float4* x = reinterpret_cast<const float4*>(p.norm_x + static_cast<int64_t>(m) * p.norm_x_stride + ch * 8);
    const float4* nw = reinterpret_cast<const float4*>(p.norm_weight + ch * 8);
    const float4 x0 = __ldcg(x), x1 = __ldcg(x + 1), w0 = internal::LoadWeight(nw), w1 = internal::LoadWeight(nw + 1);
    const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    const float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
    float f[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const float v = wv[q] * (xv[q] * inv);
      const __nv_bfloat16 hi = __float2bfloat16_rn(v);
      f[q] = __bfloat162float(hi);
      if (p.a_lo != nullptr) f[q] += __bfloat162float(__float2bfloat16_rn(v - __bfloat162float(hi)));
    }
    xs[(2 * m) * kc + ch] = make_float4(f[0], f[1], f[2], f[3]);
    xs[(2 * m + 1) * kc + ch] = make_float4(f[4], f[5], f[6], f[7]);
  }
  __syncthreads();
}

// The slots of entry e (its begin and rows set): A rows, permuted rows, epilogue rows.
template <int kRows>
__device__ __forceinline__ void FillSlots(const MoeExpertGemvParams& p, bool silu, Entry& e) {
#pragma unroll
  for (int m = 0; m < kMaxRows; ++m) {
    e.a_row[m] = -1;
    e.row_of[m] = -1;
    e.dst_row[m] = 0;
    e.scale[m] = 0.0f;
  }
  for (int i = 0; i < e.rows; ++i) {
    const int r = e.begin + i;
    const int a_row = p.a_rows != nullptr ? p.a_rows[r] : r;
    const int m = p.a_row_count > 0 ? a_row : i;
    if (m < 0 || m >= (p.a_row_count > 0 ? p.a_row_count : kRows)) continue;  // outside the contract
    e.a_row[m] = a_row;
    e.row_of[m] = r;
    if (!silu) {
      e.dst_row[m] = p.out_rows != nullptr ? p.out_rows[r] : r;
      e.scale[m] = p.row_scale != nullptr ? p.row_scale[r] : 1.0f;
    }
  }
}

template <int kRows, bool kFp8>
__global__ void __launch_bounds__(kThreads, 2) MoeExpertGemvKernel(MoeExpertGemvParams p) {
  extern __shared__ float4 xs[];  // [kRows][2][kc]: the staged A rows, float32
  __shared__ Entry table[kMaxActive];
  __shared__ int routed_group[kMaxActive];
  __shared__ LastTiles last_tiles;
  __shared__ float red[kWarps][kMaxRows];
  const int tid = threadIdx.x;
  const bool silu = p.epilogue == GemmEpilogue::kSiluMulBf16;
  const bool all_rows = p.a_row_count > 0;
  const bool staged = !all_rows && p.staged_rows > 0;  // every group's rows staged up front
  const int kc = p.k / 8;
  const int passes = (kc + kPassChunks<kFp8> - 1) / kPassChunks<kFp8>;
  const int tiles = p.n / kTileRows<kFp8>;
  const int first_static = p.num_groups - p.num_static;
  const int static_tiles = p.num_static * tiles;
  const int stride = static_cast<int>(gridDim.x);

  // Before the wait: the first tile's loads if it is a static group's. (Also asking the
  // block's later static tiles into L2 slowed the step: their traffic delays the routing
  // kernel that runs meanwhile, 12 us a step at batch 1 on the H200.)
  Word<kFp8> wv[2][kPartChunks<kFp8>], wv1[2][kPartChunks<kFp8>];  // parts 0 and 1 of a pass
  int j = static_cast<int>(blockIdx.x);
  bool loaded = j < static_tiles;  // wv holds part 0 of tile j's first pass
  if (loaded) LoadPass<kFp8, 0>(p, first_static + j / tiles, j % tiles, 0, silu, wv);
  // Early static tiles (norm_x): every static tile of this block (the tiles j, j + stride,
  // ... below static_tiles come first in its list) before the wait, from rows it stages
  // itself; the static entries of the table are known.
  const bool early = p.norm_x != nullptr && loaded;  // block-uniform
  if (early) {
    StageNormalizedRows(p, xs, kc, red);
    if (tid < p.num_static) {
      Entry& e = table[tid];
      e.group = first_static + tid;
      e.begin = p.static_begin + tid * p.a_row_count;
      e.rows = p.a_row_count;
#pragma unroll
      for (int m = 0; m < kMaxRows; ++m) {
        e.a_row[m] = m < e.rows ? m : -1;
        e.row_of[m] = m < e.rows ? e.begin + m : -1;
      }
    }
    __syncthreads();
  }

  int routed = 0;
  int total = static_tiles;  // the tiles known so far (before the wait: the static ones)
  bool waited = false;
  auto group_of = [&](int v) { return v < p.num_static ? first_static + v : routed_group[v - p.num_static]; };
  bool table_ready = false;
  auto complete_table = [&]() {  // block-uniform, after the wait
    if (table_ready) return;
    if (tid < p.num_static) FillSlots<kRows>(p, silu, table[tid]);
    const int slot = p.num_static + tid;
    if (tid < routed && slot < kMaxActive) {
      Entry& e = table[slot];
      e.group = routed_group[tid];
      e.begin = p.group_offsets[e.group];
      e.rows = max(min(p.group_offsets[e.group + 1] - e.begin, kRows), 0);
      FillSlots<kRows>(p, silu, e);
    }
    __syncthreads();
    table_ready = true;
  };

  float acc[2][kRows];
#pragma unroll
  for (int m = 0; m < kRows; ++m) acc[0][m] = acc[1][m] = 0.0f;
  int staged_begin = -1, staged_rows = -1;  // the group rows staged (without a_row_count; block-uniform)
  int pass = 0;
  while (true) {
    if (!waited && (!early || j >= static_tiles)) {  // block-uniform; between tiles (pass 0)
      if (early) __syncthreads();  // the early tiles' readers of the table are done
      internal::WaitAndTrigger();
      waited = true;
      if (tid == 0) last_tiles.count = 0;  // read after CountColumnTile's barrier
      // One round trip after the wait: the active groups (ascending, so the routed ones
      // come first; the static groups are the highest), the static groups' rows and, with
      // a_row_count, the staged A rows. The rest of the table (routed groups' rows, every
      // group's slots) is read later, while weights are in flight.
      const int active = min(*p.num_active, p.max_active);
      const int g = tid < p.max_active ? p.active_groups[tid] : INT_MAX;  // entries past *num_active: unused
      int begin = 0, end = 0;
      if (tid < p.num_static) {
        begin = p.group_offsets[first_static + tid];
        end = p.group_offsets[first_static + tid + 1];
        // The early tiles assumed these rows: a permutation that disagrees breaks the contract.
        if (p.norm_x != nullptr && (begin != p.static_begin + tid * p.a_row_count || end - begin != p.a_row_count)) {
          __trap();
        }
      }
      if (early) {
        // The rows are staged already (the same values as A).
      } else if (all_rows) {
        for (int i = tid; i < p.a_row_count * kc; i += kThreads) StageChunk(p, xs, kc, i / kc, i / kc, i % kc);
      } else if (staged) {
        for (int i = tid; i < p.staged_rows * kc; i += kThreads) StageChunk(p, xs, kc, i / kc, i / kc, i % kc);
      }
      if (tid < kMaxActive) routed_group[tid] = g;
      if (tid < p.num_static) {
        table[tid].group = first_static + tid;
        table[tid].begin = begin;
        table[tid].rows = max(min(end - begin, kRows), 0);
      }
      routed = __syncthreads_count(tid < active && g < first_static);
      total = min(p.num_static + routed, kMaxActive) * tiles;
      if (j < total && !loaded) LoadPass<kFp8, 0>(p, group_of(j / tiles), j % tiles, 0, silu, wv);
    }
    if (j >= total) break;
    const int v = j / tiles, tile = j % tiles;
    // Part 1's loads in flight during part 0's staging and products.
    if constexpr (kParts<kFp8> == 2) LoadPass<kFp8, 1>(p, group_of(v), tile, pass, silu, wv1);
    int rows = p.a_row_count;
    const float4* xt = xs;  // the tile's group's staged rows
    if (staged) {
      if (v >= p.num_static) complete_table();
      rows = table[v].rows;
      xt = xs + static_cast<int64_t>(table[v].begin) * 2 * kc;
    } else if (!all_rows) {
      // The group's rows: a static group's are known; a routed group's, or A rows through
      // a_rows, need the rest of the table.
      if (v >= p.num_static || p.a_rows != nullptr) complete_table();
      const int begin = table[v].begin;
      rows = table[v].rows;
      if (pass == 0 && (begin != staged_begin || rows != staged_rows)) {
        __syncthreads();  // the previous rows' readers are done
        for (int i = tid; i < rows * kc; i += kThreads) {
          const int m = i / kc;
          StageChunk(p, xs, kc, m, p.a_rows != nullptr ? table[v].a_row[m] : begin + m, i % kc);
        }
        __syncthreads();
        staged_begin = begin;
        staged_rows = rows;
      }
    }
    const float* scale_rows[2];
    ScaleRows<kFp8>(p, group_of(v), tile, silu, scale_rows);
    ComputePass<kRows, kFp8, 0>(xt, kc, pass, rows, wv, scale_rows, acc);
    // Part 0's registers are free: the next pass's first loads go out before part 1's
    // products (FP8) and this tile's reduction.
    int next = j, next_pass = pass + 1;
    if (next_pass == passes) {
      next_pass = 0;
      next = j + stride;
    }
    if (next < total) LoadPass<kFp8, 0>(p, group_of(next / tiles), next % tiles, next_pass, silu, wv);
    loaded = next < total;
    if constexpr (kParts<kFp8> == 2) ComputePass<kRows, kFp8, 1>(xt, kc, pass, rows, wv1, scale_rows, acc);
    if (next_pass == 0) {
      if (waited) complete_table();  // before the wait: an early static tile, its entry set
      Epilogue<kRows, kFp8>(p, table[v], tile, silu, acc);
#pragma unroll
      for (int m = 0; m < kRows; ++m) acc[0][m] = acc[1][m] = 0.0f;
      if (!silu && p.partial != nullptr) CountColumnTile(p, tile, min(p.num_static + routed, kMaxActive), last_tiles);
    }
    j = next;
    pass = next_pass;
  }
  if (!silu && p.partial != nullptr) FinishColumnTiles<kFp8>(p, last_tiles);
}

template <int kRows, bool kFp8>
cudaError_t LaunchRows(MoeExpertGemvParams p, cudaStream_t stream) {
  if (p.a_row_count > 0 || p.a_rows != nullptr ||
      static_cast<size_t>(p.staged_rows) * p.k * sizeof(float) > kStagedBytes) {
    p.staged_rows = 0;
  }
  const size_t smem = static_cast<size_t>(std::max(kRows, p.staged_rows)) * p.k * sizeof(float);
  static std::atomic<size_t> configured{0};  // the kernel's dynamic shared memory limit, raised as needed
  if (smem > configured.load(std::memory_order_relaxed)) {
    const cudaError_t e = cudaFuncSetAttribute(MoeExpertGemvKernel<kRows, kFp8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
    if (e != cudaSuccess) return e;
    configured.store(smem, std::memory_order_relaxed);
  }
  // Two blocks per multiprocessor (the register bound of __launch_bounds__) where shared
  // memory allows: every block of the grid is resident at once, none waits for a second wave.
  const int per_sm = smem <= 96 * 1024 ? 2 : 1;
  const int64_t tiles = static_cast<int64_t>(p.max_active) * (p.n / kTileRows<kFp8>);
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>(tiles, static_cast<int64_t>(per_sm) * CurrentDeviceMultiprocessors()));
  if (p.partial != nullptr && (tiles + blocks - 1) / blocks > kMaxLastTiles) return cudaErrorInvalidValue;
  return internal::Launch(MoeExpertGemvKernel<kRows, kFp8>, dim3(blocks), dim3(kThreads), smem, stream, p);
}

}  // namespace

cudaError_t MoeExpertGemv(const MoeExpertGemvParams& p, cudaStream_t stream) {
  const bool silu = p.epilogue == GemmEpilogue::kSiluMulBf16;
  const bool scatter = p.epilogue == GemmEpilogue::kScatterAddF32;
  const bool fp8 = p.b_fp8 != nullptr;
  if (p.a == nullptr || (p.b == nullptr) == !fp8 || (fp8 && p.b_row_scales == nullptr) || p.out == nullptr ||
      p.group_offsets == nullptr ||
      p.active_groups == nullptr || p.num_active == nullptr || p.a_row_count < 0 || p.staged_rows < 0 ||
      p.a_row_count > p.max_rows || (p.a_row_count > 0 && p.a_rows == nullptr) ||
      !MoeExpertGemvSupports(p.n, p.k, p.max_rows, p.max_active, p.num_static) || p.num_groups <= 0 ||
      p.num_static > p.num_groups || p.lda < p.k || p.lda % 8 != 0 || p.b_group_stride % 8 != 0 ||
      p.b_group_stride < 0 || reinterpret_cast<uintptr_t>(p.a) % 16 != 0 ||
      (p.a_lo != nullptr && reinterpret_cast<uintptr_t>(p.a_lo) % 16 != 0) ||
      reinterpret_cast<uintptr_t>(fp8 ? static_cast<const void*>(p.b_fp8) : p.b) % (fp8 ? 8 : 16) != 0 ||
      (fp8 && p.n % kTileRows<true> != 0) ||
      (!silu && !scatter) || (silu && p.ldo < p.n / 2) ||
      (!silu && p.out_lo != nullptr) ||
      (scatter && (p.ldo < p.n || p.ldo % 2 != 0 || reinterpret_cast<uintptr_t>(p.out) % 8 != 0)) ||
      (p.partial != nullptr && (!scatter || p.tile_counters == nullptr || p.out_row_count < 1 ||
                                p.out_row_count > 64 || reinterpret_cast<uintptr_t>(p.partial) % 8 != 0)) ||
      (p.norm_x != nullptr && (!silu || p.a_row_count < 1 || p.norm_weight == nullptr ||
                               p.norm_x_stride < p.k || p.norm_x_stride % 4 != 0 || p.static_begin < 0 ||
                               !(p.norm_eps >= 0.0f) || reinterpret_cast<uintptr_t>(p.norm_x) % 16 != 0 ||
                               reinterpret_cast<uintptr_t>(p.norm_weight) % 16 != 0))) {
    return cudaErrorInvalidValue;
  }
  if (p.b_fp8 != nullptr) {
    switch (p.max_rows) {
      case 1: return LaunchRows<1, true>(p, stream);
      case 2: return LaunchRows<2, true>(p, stream);
      default: return LaunchRows<4, true>(p, stream);
    }
  }
  switch (p.max_rows) {
    case 1: return LaunchRows<1, false>(p, stream);
    case 2: return LaunchRows<2, false>(p, stream);
    default: return LaunchRows<4, false>(p, stream);
  }
}

}  // namespace tandem::cuda
