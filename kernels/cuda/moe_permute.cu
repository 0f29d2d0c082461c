#include "kernels/cuda/moe_permute.h"

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

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

__global__ void __launch_bounds__(kThreads) MoePermuteKernel(MoePermuteParams p) {
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

  // Offsets and the list of active groups.
  int total = 0;
  const int count = tid < groups ? counts[tid] : 0;
  const int offset = BlockExclusiveScan(count, warp_totals, &total);
  if (tid < groups) {
    p.group_offsets[tid] = offset;
    base[tid] = offset;
  }
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

__global__ void GatherRowsKernel(GatherRowsParams p) {
  const int64_t row = blockIdx.x;
  const uint4* src = reinterpret_cast<const uint4*>(p.src + static_cast<int64_t>(p.rows[row]) * p.src_stride);
  uint4* dst = reinterpret_cast<uint4*>(p.dst + row * p.dst_stride);
  for (int64_t i = threadIdx.x; i < p.cols / 8; i += blockDim.x) dst[i] = src[i];
}

__global__ void MoeCombineKernel(MoeCombineParams p) {
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
  MoePermuteKernel<<<1, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t GatherRows(const GatherRowsParams& p, cudaStream_t stream) {
  if (p.num_rows == 0) return cudaSuccess;
  if (p.src == nullptr || p.rows == nullptr || p.dst == nullptr || p.num_rows < 0 || p.num_rows > 0x7fffffff ||
      p.cols % 8 != 0 || p.src_stride % 8 != 0 || p.dst_stride % 8 != 0 || p.src_stride < p.cols ||
      p.dst_stride < p.cols || reinterpret_cast<uintptr_t>(p.src) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(p.dst) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  GatherRowsKernel<<<static_cast<unsigned>(p.num_rows), 128, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t MoeCombine(const MoeCombineParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  if (p.y == nullptr || p.entry_row == nullptr || p.sorted_weight == nullptr || p.out == nullptr ||
      p.num_tokens < 0 || p.entries_per_token <= 0 || p.dim <= 0 || p.y_stride < p.dim || p.out_stride < p.dim) {
    return cudaErrorInvalidValue;
  }
  MoeCombineKernel<<<static_cast<unsigned>(p.num_tokens), 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
