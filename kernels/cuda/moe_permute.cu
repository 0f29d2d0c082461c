#include "kernels/cuda/moe_permute.h"

#include <algorithm>
#include <atomic>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/moe_routing.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBatch = 16;  // PermuteBlockChunks: steps of 32 pairs whose loads a warp issues together
// Up to this many pairs PermuteBlockRounds (measured on the H200: a 64-token decode step's
// 512 pairs 5.7 us a layer vs 11.1 by chunks; an 8K-token prefill's 65 536 pairs 230 vs
// 165 us).
constexpr int kRoundsMaxPairs = 4096;

// Exclusive prefix sum over the block (one value per thread); *total gets the sum.
__device__ int BlockExclusiveScan(int v, int* warp_totals, int* total) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int inclusive = v;
  for (int offset = 1; offset < 32; offset *= 2) {
    const int o = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += o;
  }
  __syncthreads();
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int t = warp_totals[lane];
    for (int offset = 1; offset < 32; offset *= 2) {
      const int o = __shfl_up_sync(0xffffffffu, t, offset);
      if (lane >= offset) t += o;
    }
    warp_totals[lane] = t;  // inclusive over warps
  }
  __syncthreads();
  *total = warp_totals[kWarps - 1];
  return inclusive - v + (warp > 0 ? warp_totals[warp - 1] : 0);
}

// Group offsets, active groups and the tile list from each group's count (thread g holds
// group g's; every thread calls it); returns thread g's group offset.
__device__ int WriteGroupOffsets(const MoePermuteParams& p, int groups, int count, int* warp_totals) {
  const int tid = threadIdx.x;
  int total = 0;
  const int offset = BlockExclusiveScan(count, warp_totals, &total);
  if (tid < groups) p.group_offsets[tid] = offset;
  if (tid == 0) p.group_offsets[groups] = total;
  int num_active = 0;
  const int active_pos = BlockExclusiveScan(count > 0 ? 1 : 0, warp_totals, &num_active);
  if (count > 0) p.active_groups[active_pos] = tid;
  if (tid == 0) *p.num_active = num_active;
  if (p.tile_rows > 0) {
    const int tiles = (count + p.tile_rows - 1) / p.tile_rows;
    int total_tiles = 0;
    const int first = BlockExclusiveScan(tiles, warp_totals, &total_tiles);
    for (int c = 0; c < tiles; ++c) {
      p.tile_group[first + c] = tid;
      p.tile_row[first + c] = offset + c * p.tile_rows;
    }
    if (tid == 0) *p.num_tiles = total_tiles;
  }
  return offset;
}

// The permutation by one block of kThreads threads, kThreads pairs a round (three
// block-wide barriers each): the cheaper form for a decode step's few pairs.
__device__ void PermuteBlockRounds(const MoePermuteParams& p) {
  __shared__ int counts[kMoeMaxGroups];
  __shared__ int base[kMoeMaxGroups];
  __shared__ uint8_t warp_counts[kWarps][kMoeMaxGroups];
  __shared__ int warp_totals[kWarps];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int groups = p.num_experts + p.num_shared;
  const int per_token = p.top_k + p.num_shared;
  const int n = p.num_tokens * per_token;

  for (int g = tid; g < kMoeMaxGroups; g += kThreads) counts[g] = 0;
  for (int i = tid; i < kWarps * kMoeMaxGroups; i += kThreads) (&warp_counts[0][0])[i] = 0;
  __syncthreads();
  auto expert_of = [&](int i) {
    const int t = i / per_token, j = i % per_token;
    return j < p.top_k ? p.expert_ids[t * p.top_k + j] : p.num_experts + (j - p.top_k);
  };
  for (int i = tid; i < n; i += kThreads) atomicAdd(&counts[expert_of(i)], 1);
  __syncthreads();

  const int offset = WriteGroupOffsets(p, groups, tid < groups ? counts[tid] : 0, warp_totals);
  if (tid < groups) base[tid] = offset;
  __syncthreads();

  // Stable placement, kThreads pairs per round: rank = earlier pairs of the same group.
  for (int round = 0; round < n; round += kThreads) {
    const int i = round + tid;
    const bool valid = i < n;
    const int e = valid ? expert_of(i) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int lane_rank = __popc(peers & ((1u << lane) - 1u));
    if (valid && lane == __ffs(peers) - 1) warp_counts[warp][e] = static_cast<uint8_t>(__popc(peers));
    __syncthreads();
    if (valid) {
      int before = 0;
      for (int w = 0; w < warp; ++w) before += warp_counts[w][e];
      const int pos = base[e] + before + lane_rank;
      const int t = i / per_token, j = i % per_token;
      p.sorted_token[pos] = t;
      p.sorted_weight[pos] = j < p.top_k ? p.weights[t * p.top_k + j] : 1.0f;
      p.entry_row[i] = pos;
    }
    __syncthreads();
    for (int g = tid; g < groups; g += kThreads) {
      int s = 0;
      for (int w = 0; w < kWarps; ++w) {
        s += warp_counts[w][g];
        warp_counts[w][g] = 0;
      }
      base[g] += s;
    }
    __syncthreads();
  }
}

// The same permutation for many pairs (a prefill chunk's): a stable counting sort of the
// (token, expert) pairs by group, over the pairs [lo, hi) of a block. Warp w takes a
// contiguous chunk of them; it counts its chunk's pairs per group (its own row of
// warp_base, no atomics: CountChunk), the counts become each (warp, group)'s first row
// (groups in order, warps in order within a group), and each warp places its chunk again
// in pair order (PlaceChunk): pairs of a group keep their order, as one pass over all
// pairs would give. warp_base: shared memory, [kWarps][groups].
struct ChunkPairs {
  const MoePermuteParams& p;
  int groups, per_token;
  int lo, hi;  // this warp's pairs

  __device__ ChunkPairs(const MoePermuteParams& params, int block_lo, int block_hi)
      : p(params), groups(params.num_experts + params.num_shared), per_token(params.top_k + params.num_shared) {
    const int chunk = (block_hi - block_lo + kWarps - 1) / kWarps;
    lo = min(block_hi, block_lo + static_cast<int>(threadIdx.x / 32) * chunk);
    hi = min(block_hi, lo + chunk);
  }
  __device__ int ExpertOf(int i) const {
    const int t = i / per_token, j = i % per_token;
    return j < p.top_k ? p.expert_ids[t * p.top_k + j] : p.num_experts + (j - p.top_k);
  }
  // warp_base = every warp's counts per group (the whole block calls it; barriers around).
  __device__ void CountWarps(int* warp_base) const {
    for (int i = threadIdx.x; i < kWarps * groups; i += kThreads) warp_base[i] = 0;
    __syncthreads();
    CountChunk(warp_base);
    __syncthreads();
  }
  // warp_base (zeroed) += this warp's counts, in its own row.
  __device__ void CountChunk(int* warp_base) const {
    const int lane = threadIdx.x % 32;
    int* mine = warp_base + static_cast<int>(threadIdx.x / 32) * groups;
    // kBatch steps' loads at once: one round trip per batch, not per step.
    for (int b0 = lo; b0 < hi; b0 += 32 * kBatch) {
      int ex[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = b0 + 32 * u + lane;
        ex[u] = i < hi ? ExpertOf(i) : -1;
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const unsigned peers = __match_any_sync(0xffffffffu, ex[u]);
        if (ex[u] >= 0 && lane == __ffs(peers) - 1) mine[ex[u]] += __popc(peers);
        __syncwarp();
      }
    }
  }
  // Placement from warp_base's first rows, in pair order: rank = earlier pairs of the group.
  __device__ void PlaceChunk(int* warp_base) const {
    const int lane = threadIdx.x % 32;
    int* mine = warp_base + static_cast<int>(threadIdx.x / 32) * groups;
    for (int b0 = lo; b0 < hi; b0 += 32 * kBatch) {
      int ex[kBatch];
      float wt[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = b0 + 32 * u + lane;
        ex[u] = i < hi ? ExpertOf(i) : -1;
        const int t = i / per_token, j = i % per_token;
        wt[u] = i < hi && j < p.top_k ? p.weights[t * p.top_k + j] : 1.0f;
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = b0 + 32 * u + lane;
        const bool valid = ex[u] >= 0;
        const unsigned peers = __match_any_sync(0xffffffffu, ex[u]);
        const int pos = valid ? mine[ex[u]] + __popc(peers & ((1u << lane) - 1u)) : 0;
        __syncwarp();  // every lane has read mine[e] before its leader moves it on
        if (valid && lane == __ffs(peers) - 1) mine[ex[u]] += __popc(peers);
        __syncwarp();
        if (valid) {
          p.sorted_token[pos] = i / per_token;
          p.sorted_weight[pos] = wt[u];
          p.entry_row[i] = pos;
        }
      }
    }
  }
};

// Thread g (< groups): warp_base's counts of group g -> each warp's first row, from `row`.
__device__ void WarpFirstRows(int* warp_base, int groups, int row) {
  const int g = threadIdx.x;
  if (g >= groups) return;
  for (int w = 0; w < kWarps; ++w) {
    const int c = warp_base[w * groups + g];
    warp_base[w * groups + g] = row;
    row += c;
  }
}

// The whole permutation by one block (no scratch).
__device__ void PermuteBlockChunks(const MoePermuteParams& p, int* warp_base) {
  __shared__ int warp_totals[kWarps];
  const int tid = threadIdx.x;
  const ChunkPairs pairs(p, 0, p.num_tokens * (p.top_k + p.num_shared));
  const int groups = pairs.groups;
  pairs.CountWarps(warp_base);
  int count = 0;
  if (tid < groups) {
    for (int w = 0; w < kWarps; ++w) count += warp_base[w * groups + tid];
  }
  const int offset = WriteGroupOffsets(p, groups, count, warp_totals);
  WarpFirstRows(warp_base, groups, offset);
  __syncthreads();
  pairs.PlaceChunk(warp_base);
}

// The same over kMoePermuteBlocks blocks with p.scratch ([blocks][groups]), in three
// launches: each block counts its contiguous range of pairs per group into the scratch;
// one block turns the counts into group offsets and each block's first row per group;
// each block counts again per warp and places its range.
__device__ __forceinline__ void BlockPairs(const MoePermuteParams& p, int* lo, int* hi) {
  const int n = p.num_tokens * (p.top_k + p.num_shared);
  const int per = (n + gridDim.x - 1) / gridDim.x;
  *lo = min(n, static_cast<int>(blockIdx.x) * per);
  *hi = min(n, *lo + per);
}

__global__ void __launch_bounds__(kThreads) MoePermuteCountKernel(MoePermuteParams p) {
  extern __shared__ int warp_base[];  // [kWarps][groups]
  internal::WaitAndTrigger();
  int lo, hi;
  BlockPairs(p, &lo, &hi);
  const ChunkPairs pairs(p, lo, hi);
  const int groups = pairs.groups;
  pairs.CountWarps(warp_base);
  for (int g = threadIdx.x; g < groups; g += kThreads) {
    int count = 0;
    for (int w = 0; w < kWarps; ++w) count += warp_base[w * groups + g];
    p.scratch[static_cast<int64_t>(blockIdx.x) * groups + g] = count;
  }
}

__global__ void __launch_bounds__(kThreads) MoePermuteScanKernel(MoePermuteParams p) {
  __shared__ int warp_totals[kWarps];
  internal::WaitAndTrigger();
  const int groups = p.num_experts + p.num_shared, g = threadIdx.x;
  int c[kMoePermuteBlocks];  // group g's count in each block, all loads in flight at once
  int count = 0;
#pragma unroll
  for (int b = 0; b < kMoePermuteBlocks; ++b) {
    c[b] = g < groups ? p.scratch[static_cast<int64_t>(b) * groups + g] : 0;
  }
#pragma unroll
  for (int b = 0; b < kMoePermuteBlocks; ++b) count += c[b];
  int row = WriteGroupOffsets(p, groups, count, warp_totals);
  if (g < groups) {
#pragma unroll
    for (int b = 0; b < kMoePermuteBlocks; ++b) {
      p.scratch[static_cast<int64_t>(b) * groups + g] = row;
      row += c[b];
    }
  }
}

__global__ void __launch_bounds__(kThreads) MoePermutePlaceKernel(MoePermuteParams p) {
  extern __shared__ int warp_base[];  // [kWarps][groups]
  internal::WaitAndTrigger();
  int lo, hi;
  BlockPairs(p, &lo, &hi);
  const ChunkPairs pairs(p, lo, hi);
  const int groups = pairs.groups;
  pairs.CountWarps(warp_base);
  WarpFirstRows(warp_base, groups, threadIdx.x < groups ? p.scratch[static_cast<int64_t>(blockIdx.x) * groups + threadIdx.x] : 0);
  __syncthreads();
  pairs.PlaceChunk(warp_base);
}

// The same permutation for at most kSmallPairs (token, expert) pairs, without block-wide
// scans: each pair counts the pairs before it directly (a decode step of a few tokens).
constexpr int kSmallPairs = 64;

// The routing is read from ids_s / weights_s (shared memory, [num_tokens][top_k]: the same
// block routed just before), not from p.expert_ids / p.weights.
__device__ void SmallPermuteBlock(const MoePermuteParams& p, const int* ids_s, const float* weights_s) {
  __shared__ int expert_s[kSmallPairs], count_s[kSmallPairs], before_s[kSmallPairs], rank_s[kSmallPairs];
  __shared__ bool first_s[kSmallPairs];
  const int tid = threadIdx.x;
  const int groups = p.num_experts + p.num_shared;
  const int per_token = p.top_k + p.num_shared;
  const int n = p.num_tokens * per_token;
  if (tid < n) {
    const int t = tid / per_token, j = tid % per_token;
    expert_s[tid] = j < p.top_k ? ids_s[t * p.top_k + j] : p.num_experts + (j - p.top_k);
  }
  __syncthreads();
  if (tid < n) {
    const int e = expert_s[tid];
    int count = 0, before = 0, rank = 0;
    for (int k = 0; k < n; ++k) {
      const int ek = expert_s[k];
      count += ek == e;
      before += ek < e;
      rank += k < tid && ek == e;
    }
    count_s[tid] = count;
    before_s[tid] = before;
    rank_s[tid] = rank;
    first_s[tid] = rank == 0;
  }
  __syncthreads();
  for (int g = tid; g <= groups; g += blockDim.x) {
    int c = 0;
    for (int k = 0; k < n; ++k) c += expert_s[k] < g;
    p.group_offsets[g] = c;
  }
  const auto tiles_of = [&](int k) { return p.tile_rows > 0 ? (count_s[k] + p.tile_rows - 1) / p.tile_rows : 0; };
  if (tid < n) {
    const int t = tid / per_token, j = tid % per_token, e = expert_s[tid];
    const int pos = before_s[tid] + rank_s[tid];
    p.sorted_token[pos] = t;
    p.sorted_weight[pos] = j < p.top_k ? weights_s[t * p.top_k + j] : 1.0f;
    p.entry_row[tid] = pos;
    if (first_s[tid]) {
      int active = 0, tile0 = 0;
      for (int k = 0; k < n; ++k) {
        if (first_s[k] && expert_s[k] < e) {
          ++active;
          tile0 += tiles_of(k);
        }
      }
      p.active_groups[active] = e;
      for (int c = 0; c < tiles_of(tid); ++c) {
        p.tile_group[tile0 + c] = e;
        p.tile_row[tile0 + c] = before_s[tid] + c * p.tile_rows;
      }
    }
  }
  if (tid == 0) {
    int active = 0, tiles = 0;
    for (int k = 0; k < n; ++k) {
      if (first_s[k]) {
        ++active;
        tiles += tiles_of(k);
      }
    }
    *p.num_active = active;
    if (p.tile_rows > 0) *p.num_tiles = tiles;
  }
}

__global__ void __launch_bounds__(kThreads) MoePermuteKernel(MoePermuteParams p) {
  extern __shared__ int warp_base[];  // [kWarps][groups], for PermuteBlockChunks
  internal::WaitAndTrigger();
  if (p.num_tokens * (p.top_k + p.num_shared) <= kRoundsMaxPairs) {
    PermuteBlockRounds(p);
  } else {
    PermuteBlockChunks(p, warp_base);
  }
}

// Whether the fused route kernel permutes by bit masks (MaskPermuteBlock): the routing is
// by rank, and each group's rows fit one tile.
__host__ __device__ inline bool PermuteByMask(int num_tokens, int num_experts, int tile_rows) {
  return num_experts <= internal::kRankRoutingExperts && (tile_rows == 0 || tile_rows >= num_tokens);
}

// The permutation of a fused routing with at most kRankRoutingExperts experts, from each
// token's chosen experts as a bit mask (masks[t]) and ids_s / weights_s as for
// SmallPermuteBlock: every output is a few population counts, no scan and no block-wide
// step. Every group has at most tile_rows rows (num_tokens <= tile_rows): one tile each.
__device__ void MaskPermuteBlock(const MoePermuteParams& p, const int* ids_s, const float* weights_s,
                                 const unsigned long long* masks) {
  const int T = p.num_tokens, E = p.num_experts, S = p.num_shared, K = p.top_k;
  const int per_token = K + S, groups = E + S;
  unsigned long long any = 0;
  for (int t = 0; t < T; ++t) any |= masks[t];
  const int routed_active = __popcll(any);
  const auto below = [](int g) { return g >= 64 ? ~0ull : (1ull << g) - 1ull; };
  const auto offset_of = [&](int g) {  // the first permuted row of group g
    if (g >= E) return T * K + (g - E) * T;
    int o = 0;
    for (int t = 0; t < T; ++t) o += __popcll(masks[t] & below(g));
    return o;
  };
  for (int g = threadIdx.x; g <= groups; g += blockDim.x) {
    const int offset = offset_of(g);
    p.group_offsets[g] = offset;
    if (g == groups || (g < E && !((any >> g) & 1ull))) continue;
    const int a = g < E ? __popcll(any & below(g)) : routed_active + (g - E);
    p.active_groups[a] = g;
    if (p.tile_rows > 0) {
      p.tile_group[a] = g;
      p.tile_row[a] = offset;
    }
  }
  if (threadIdx.x == 0) {
    *p.num_active = routed_active + S;
    if (p.tile_rows > 0) *p.num_tiles = routed_active + S;
  }
  for (int i = threadIdx.x; i < T * per_token; i += blockDim.x) {
    const int t = i / per_token, j = i % per_token;
    int pos;
    float w = 1.0f;
    if (j < K) {
      const int e = ids_s[t * K + j];
      pos = offset_of(e);
      for (int u = 0; u < t; ++u) pos += static_cast<int>((masks[u] >> e) & 1ull);
      w = weights_s[t * K + j];
    } else {
      pos = offset_of(E + j - K) + t;
    }
    p.sorted_token[pos] = t;
    p.sorted_weight[pos] = w;
    p.entry_row[i] = pos;
  }
}

// Fused front end (MoeFusedRoute): block b computes the router logits of experts
// [b * kFusedExperts, +kFusedExperts) for every token, kFusedSlices warps per expert
// each over a slice of the hidden dimension (its router values in registers, loaded
// before the wait); the last block to finish routes (one warp per token) and permutes.
// Blocks of 256 threads: they fit beside the previous kernel's blocks, so that their
// weight loads overlap it.
constexpr int kFusedThreads = 256;
constexpr int kFusedWarps = kFusedThreads / 32;
constexpr int kFusedExperts = 4;
constexpr int kFusedSlices = kFusedWarps / kFusedExperts;
constexpr int kFusedPre = 8;  // float4 router values per lane held in registers (hidden <= 2048)
constexpr int kNormPre = 8;   // norm weights per thread held in registers (hidden <= 2048)

// Floats of dynamic shared memory per token: its normalized row, later its logits and
// routing scratch.
int FusedFloatsPerToken(int hidden, int experts) {
  const int routing = (experts + 3) / 4 * 4 + internal::RouteScratchFloats(experts);
  return std::max(hidden, routing);
}

__global__ void __launch_bounds__(kFusedThreads) MoeFusedRouteKernel(MoeFusedRouteParams p) {
  extern __shared__ __align__(16) float dyn[];  // [T][per_token floats]
  __shared__ float red[kFusedWarps][kMoeFusedMaxTokens];
  __shared__ bool last_block;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int T = p.routing.num_tokens, E = p.routing.num_experts, K = p.hidden;
  const int e = static_cast<int>(blockIdx.x) * kFusedExperts + warp / kFusedSlices;
  const int slice = K / kFusedSlices;  // a multiple of 4
  const int n4 = slice / 4;
  const float4* wrow = reinterpret_cast<const float4*>(p.router + static_cast<int64_t>(min(e, E - 1)) * K +
                                                       (warp % kFusedSlices) * slice);
  float4 wr[kFusedPre];
#pragma unroll
  for (int i = 0; i < kFusedPre; ++i) {
    const int idx = lane + 32 * i;
    // Before the wait: a valid address for every lane (the dot product skips idx >= n4 and
    // the logits of e >= E are not stored).
    wr[i] = internal::LoadWeight(wrow + min(idx, n4 - 1));
  }
  // This thread's norm weights too (hidden <= kFusedThreads * kNormPre; the rest is read after).
  float nw[kNormPre];
#pragma unroll
  for (int i = 0; i < kNormPre; ++i) {
    nw[i] = internal::LoadWeight(p.norm_weight + min(tid + i * kFusedThreads, K - 1));
  }
  internal::WaitAndTrigger();

  // The normalized rows (RmsNorm's arithmetic); block 0 also stores them in bf16 + remainder.
  for (int t = 0; t < T; ++t) {
    const float* x = p.x + static_cast<int64_t>(t) * p.x_stride;
    float s = 0.0f;
    for (int i = tid; i < K; i += kFusedThreads) {
      const float v = x[i];
      dyn[t * K + i] = v;
      s += v * v;
    }
    s = internal::WarpSum(s);
    if (lane == 0) red[warp][t] = s;
  }
  __syncthreads();
  for (int t = 0; t < T; ++t) {
    float total = 0.0f;
    for (int w = 0; w < kFusedWarps; ++w) total += red[w][t];
    const float inv = rsqrtf(total / static_cast<float>(K) + p.norm_eps);
    const auto normalize = [&](int i, float weight) {
      const float v = weight * (dyn[t * K + i] * inv);
      dyn[t * K + i] = v;
      if (blockIdx.x == 0) {
        const __nv_bfloat16 hi = __float2bfloat16_rn(v);
        p.h_bf16[t * p.h_stride + i] = hi;
        if (p.h_lo != nullptr) p.h_lo[t * p.h_stride + i] = __float2bfloat16_rn(v - __bfloat162float(hi));
      }
    };
#pragma unroll
    for (int j = 0; j < kNormPre; ++j) {
      if (tid + j * kFusedThreads < K) normalize(tid + j * kFusedThreads, nw[j]);
    }
    for (int i = tid + kNormPre * kFusedThreads; i < K; i += kFusedThreads) normalize(i, p.norm_weight[i]);
  }
  __syncthreads();

  // This block's router logits.
  for (int t = 0; t < T; ++t) {
    const float4* xs = reinterpret_cast<const float4*>(dyn + t * K + (warp % kFusedSlices) * slice);
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < kFusedPre; ++i) {
      const int idx = lane + 32 * i;
      if (idx < n4) {
        const float4 xv = xs[idx];
        acc = fmaf(wr[i].x, xv.x, acc);
        acc = fmaf(wr[i].y, xv.y, acc);
        acc = fmaf(wr[i].z, xv.z, acc);
        acc = fmaf(wr[i].w, xv.w, acc);
      }
    }
    for (int idx = lane + 32 * kFusedPre; idx < n4 && e < E; idx += 32) {  // hidden beyond the registers
      const float4 w = __ldg(wrow + idx), xv = xs[idx];
      acc = fmaf(w.x, xv.x, acc);
      acc = fmaf(w.y, xv.y, acc);
      acc = fmaf(w.z, xv.z, acc);
      acc = fmaf(w.w, xv.w, acc);
    }
    acc = internal::WarpSum(acc);
    if (lane == 0) red[warp][t] = acc;  // the sums of squares were consumed above
  }
  __syncthreads();
  if (tid < kFusedExperts * T) {
    const int el = tid / T, t = tid % T;
    const int ee = static_cast<int>(blockIdx.x) * kFusedExperts + el;
    if (ee < E) {
      float s = 0.0f;
      for (int k = 0; k < kFusedSlices; ++k) s += red[el * kFusedSlices + k][t];
      p.router_logits[t * E + ee] = s;
    }
  }

  // The last block routes and permutes. One thread counts for the block with an
  // acquire-release atomic: its release publishes the block's logits (ordered before it by
  // the barrier), its acquire in the last block orders the logits reads after every other
  // block's writes (as CUTLASS's semaphores do, without a full fence on each side).
  __syncthreads();
  if (tid == 0) {
    unsigned prev;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(prev) : "l"(p.counter) : "memory");
    last_block = prev == gridDim.x - 1;
  }
  __syncthreads();
  if (!last_block) return;
  const int logit_floats = (E + 3) / 4 * 4, scratch_floats = internal::RouteScratchFloats(E);
  float* logits = dyn;                      // [T][logit_floats]
  float* scratch = dyn + T * logit_floats;  // [T][scratch_floats], 16-byte aligned
  __shared__ int ids_s[kMoeFusedMaxTokens * 32];
  __shared__ float weights_s[kMoeFusedMaxTokens * 32];
  __shared__ unsigned long long masks_s[kMoeFusedMaxTokens];
  for (int i = tid; i < T * E; i += kFusedThreads) logits[(i / E) * logit_floats + i % E] = __ldcg(p.router_logits + i);
  if (tid == 0) *p.counter = 0u;  // every block has counted: ready for the next launch
  __syncthreads();
  const int top_k = p.routing.top_k;
  const bool by_mask = PermuteByMask(T, E, p.permute.tile_rows);
  if (warp < T) {
    internal::RouteTokenWarp(p.routing, warp, logits + warp * logit_floats, scratch + warp * scratch_floats,
                             ids_s + warp * top_k, weights_s + warp * top_k, by_mask ? masks_s + warp : nullptr);
  }
  __syncthreads();
  if (by_mask) {
    MaskPermuteBlock(p.permute, ids_s, weights_s, masks_s);
  } else {
    SmallPermuteBlock(p.permute, ids_s, weights_s);
  }
}

__global__ void GatherRowsKernel(GatherRowsParams p) {
  internal::WaitAndTrigger();
  const int64_t row = blockIdx.x;
  const uint4* src = reinterpret_cast<const uint4*>(p.src + static_cast<int64_t>(p.rows[row]) * p.src_stride);
  uint4* dst = reinterpret_cast<uint4*>(p.dst + row * p.dst_stride);
  for (int64_t i = threadIdx.x; i < p.cols / 8; i += blockDim.x) dst[i] = src[i];
}

__global__ void MoeCombineKernel(MoeCombineParams p) {
  internal::WaitAndTrigger();
  const int t = blockIdx.x;
  const int32_t* rows = p.entry_row + static_cast<int64_t>(t) * p.entries_per_token;
  float* out = p.out + static_cast<int64_t>(t) * p.out_stride;
  for (int64_t d = threadIdx.x; d < p.dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < p.entries_per_token; ++j) {
      const int32_t r = rows[j];
      acc += p.sorted_weight[r] * p.y[static_cast<int64_t>(r) * p.y_stride + d];
    }
    out[d] += acc;
  }
}

}  // namespace

cudaError_t MoePermute(const MoePermuteParams& p, cudaStream_t stream) {
  const int groups = p.num_experts + p.num_shared;
  if (p.expert_ids == nullptr || p.weights == nullptr || p.group_offsets == nullptr ||
      p.active_groups == nullptr || p.num_active == nullptr || p.sorted_token == nullptr ||
      p.sorted_weight == nullptr || p.entry_row == nullptr || p.num_tokens < 0 || p.top_k <= 0 || p.tile_rows < 0 ||
      (p.tile_rows > 0 && (p.tile_group == nullptr || p.tile_row == nullptr || p.num_tiles == nullptr)) ||
      p.num_experts <= 0 || p.num_shared < 0 || groups > kMoeMaxGroups ||
      static_cast<int64_t>(p.num_tokens) * (p.top_k + p.num_shared) > 0x7fffffff) {
    return cudaErrorInvalidValue;
  }
  static const cudaError_t attr = [] {
    const int bytes = static_cast<int>(kWarps * kMoeMaxGroups * sizeof(int));
    for (const void* k : {reinterpret_cast<const void*>(MoePermuteKernel),
                          reinterpret_cast<const void*>(MoePermuteCountKernel),
                          reinterpret_cast<const void*>(MoePermutePlaceKernel)}) {
      const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }();
  if (attr != cudaSuccess) return attr;
  const int64_t pairs = static_cast<int64_t>(p.num_tokens) * (p.top_k + p.num_shared);
  const size_t warp_base_bytes = kWarps * groups * sizeof(int);
  if (pairs > kMoePermuteOneBlockPairs && p.scratch != nullptr) {
    cudaError_t e = internal::Launch(MoePermuteCountKernel, dim3(kMoePermuteBlocks), dim3(kThreads), warp_base_bytes,
                                     stream, p);
    if (e == cudaSuccess) e = internal::Launch(MoePermuteScanKernel, dim3(1), dim3(kThreads), 0, stream, p);
    if (e == cudaSuccess) e = internal::Launch(MoePermutePlaceKernel, dim3(kMoePermuteBlocks), dim3(kThreads),
                                               warp_base_bytes, stream, p);
    return e;
  }
  const bool chunks = pairs > kRoundsMaxPairs;
  return internal::Launch(MoePermuteKernel, dim3(1), dim3(kThreads), chunks ? warp_base_bytes : 0, stream, p);
}

bool MoeFusedRouteSupports(int num_tokens, int num_experts, int top_k, int num_shared, int tile_rows) {
  if (num_tokens < 0 || num_tokens > kMoeFusedMaxTokens) return false;
  // The permutation by masks has no bound on the pairs; SmallPermuteBlock's is kSmallPairs.
  return PermuteByMask(num_tokens, num_experts, tile_rows) || num_tokens * (top_k + num_shared) <= kSmallPairs;
}

cudaError_t MoeFusedRoute(const MoeFusedRouteParams& p, cudaStream_t stream) {
  const MoeRoutingParams& r = p.routing;
  const MoePermuteParams& q = p.permute;
  if (r.num_tokens == 0) return cudaSuccess;
  if (p.x == nullptr || p.norm_weight == nullptr || p.router == nullptr || p.h_bf16 == nullptr ||
      p.router_logits == nullptr || p.counter == nullptr || r.num_tokens < 0 || r.num_tokens > kMoeFusedMaxTokens ||
      p.hidden <= 0 || p.hidden % (4 * kFusedSlices) != 0 || p.x_stride < p.hidden || p.h_stride < p.hidden ||
      reinterpret_cast<uintptr_t>(p.router) % 16 != 0 || r.expert_ids == nullptr || r.weights == nullptr ||
      r.num_experts <= 0 || r.num_experts > 1024 || r.num_groups <= 0 || r.num_groups > 32 ||
      r.num_experts % r.num_groups != 0 || r.topk_groups <= 0 || r.topk_groups > r.num_groups || r.top_k <= 0 ||
      r.top_k > 32 || r.top_k > r.num_experts || q.expert_ids != r.expert_ids || q.weights != r.weights ||
      q.num_tokens != r.num_tokens || q.top_k != r.top_k || q.num_experts != r.num_experts ||
      q.group_offsets == nullptr || q.active_groups == nullptr || q.num_active == nullptr ||
      q.sorted_token == nullptr || q.sorted_weight == nullptr || q.entry_row == nullptr || q.tile_rows < 0 ||
      (q.tile_rows > 0 && (q.tile_group == nullptr || q.tile_row == nullptr || q.num_tiles == nullptr)) ||
      q.num_shared < 0 || q.num_experts + q.num_shared > kMoeMaxGroups ||
      !MoeFusedRouteSupports(r.num_tokens, r.num_experts, r.top_k, q.num_shared, q.tile_rows)) {
    return cudaErrorInvalidValue;
  }
  const size_t smem =
      static_cast<size_t>(r.num_tokens) * FusedFloatsPerToken(p.hidden, r.num_experts) * sizeof(float);
  // With the permutation's static shared memory, even a small dynamic part passes the
  // default 48 KB limit: raise the kernel's limit whenever a launch needs more than before.
  static std::atomic<size_t> configured{0};
  if (smem > configured.load(std::memory_order_relaxed)) {
    const cudaError_t e =
        cudaFuncSetAttribute(MoeFusedRouteKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
    configured.store(smem, std::memory_order_relaxed);
  }
  const unsigned blocks = static_cast<unsigned>((r.num_experts + kFusedExperts - 1) / kFusedExperts);
  return internal::Launch(MoeFusedRouteKernel, dim3(blocks), dim3(kFusedThreads), smem, stream, p);
}

cudaError_t GatherRows(const GatherRowsParams& p, cudaStream_t stream) {
  if (p.num_rows == 0) return cudaSuccess;
  if (p.src == nullptr || p.rows == nullptr || p.dst == nullptr || p.num_rows < 0 || p.num_rows > 0x7fffffff ||
      p.cols % 8 != 0 || p.src_stride % 8 != 0 || p.dst_stride % 8 != 0 || p.src_stride < p.cols ||
      p.dst_stride < p.cols || reinterpret_cast<uintptr_t>(p.src) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(p.dst) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  return internal::Launch(GatherRowsKernel, dim3(static_cast<unsigned>(p.num_rows)), dim3(128), 0, stream, p);
}

cudaError_t MoeCombine(const MoeCombineParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  if (p.y == nullptr || p.entry_row == nullptr || p.sorted_weight == nullptr || p.out == nullptr ||
      p.num_tokens < 0 || p.entries_per_token <= 0 || p.dim <= 0 || p.y_stride < p.dim || p.out_stride < p.dim) {
    return cudaErrorInvalidValue;
  }
  return internal::Launch(MoeCombineKernel, dim3(static_cast<unsigned>(p.num_tokens)), dim3(256), 0, stream, p);
}

}  // namespace tandem::cuda
