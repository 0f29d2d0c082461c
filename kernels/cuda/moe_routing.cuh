// The warp-level DeepSeekMoE routing of moe_routing.h as a device function, shared by
// MoeRouting and the fused small-batch routing of moe_permute.h (not a public API).
#pragma once

#include <climits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/moe_routing.h"

namespace tandem::cuda::internal {

// The best (value, index) over the warp; every lane gets it.
__device__ __forceinline__ void WarpBest(float* v, int* i) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, *v, offset);
    const int oi = __shfl_xor_sync(0xffffffffu, *i, offset);
    if (oi != INT_MAX && Better(ov, oi, *v, *i)) {
      *v = ov;
      *i = oi;
    }
  }
}

// Up to this many experts a warp selects by rank (two experts per lane, in registers):
// a few dependent steps instead of top_k rounds of warp-wide arg-max.
constexpr int kRankRoutingExperts = 64;

// Floats of shared scratch RouteTokenWarp needs per warp (a multiple of 4).
__host__ __device__ constexpr int RouteScratchFloats(int num_experts) {
  const int f = 2 * num_experts > 96 ? 2 * num_experts : 96;
  return (f + 3) / 4 * 4;
}

// The group-limited masks of DeepSeek's routing: choice = the warp's num_experts values
// (shared memory); experts outside the topk_groups best groups set to -inf.
__device__ __forceinline__ void MaskGroups(const MoeRoutingParams& p, float* choice) {
  const int lane = threadIdx.x % 32;
  const int e = p.num_experts;
  const int per_group = e / p.num_groups;
  float group_score = -INFINITY;
  if (lane < p.num_groups) {
    const float* c = choice + lane * per_group;
    if (p.method == MoeTopk::kNoauxTc) {
      float best = -INFINITY, second = -INFINITY;
      for (int i = 0; i < per_group; ++i) {
        if (c[i] > best) {
          second = best;
          best = c[i];
        } else if (c[i] > second) {
          second = c[i];
        }
      }
      group_score = best + second;
    } else {
      group_score = c[0];
      for (int i = 1; i < per_group; ++i) group_score = fmaxf(group_score, c[i]);
    }
  }
  uint32_t keep = 0;
  for (int k = 0; k < p.topk_groups; ++k) {
    float v = group_score;
    int i = (lane < p.num_groups && !((keep >> lane) & 1u)) ? lane : INT_MAX;
    WarpBest(&v, &i);
    keep |= 1u << i;
  }
  __syncwarp();
  for (int i = lane; i < e; i += 32) {
    if (!((keep >> (i / per_group)) & 1u)) choice[i] = -INFINITY;
  }
  __syncwarp();
}

// The routing weight of lane k's choice (score s), given the sum of the chosen scores.
__device__ __forceinline__ float RoutingWeight(const MoeRoutingParams& p, float s, float sum) {
  const bool normalize = p.normalize && p.top_k > 1;
  if (normalize) s /= sum + 1e-20f;
  if (!normalize || p.scale_normalized) s *= p.routed_scaling_factor;
  return s;
}

// RouteTokenWarp for at most kRankRoutingExperts experts: lane holds experts lane and
// lane + 32; an expert's rank is the number of experts that beat it, and the top_k ranks
// are the choice, best first (the arg-max order of RouteTokenWarpIterative).
__device__ __forceinline__ void RouteTokenWarpByRank(const MoeRoutingParams& p, int t, const float* logits,
                                                     float* scratch, int* ids_s, float* weights_s,
                                                     unsigned long long* chosen) {
  const int lane = threadIdx.x % 32;
  const int e = p.num_experts, top_k = p.top_k;
  const int i0 = lane, i1 = lane + 32;
  const bool v0 = i0 < e, v1 = i1 < e;
  const float l0 = v0 ? logits[i0] : -INFINITY, l1 = v1 ? logits[i1] : -INFINITY;
  float s0, s1;
  if (p.scoring == MoeScoring::kSoftmax) {
    const float m = WarpMax(fmaxf(l0, l1));
    const float x0 = v0 ? expf(l0 - m) : 0.0f, x1 = v1 ? expf(l1 - m) : 0.0f;
    const float inv = 1.0f / WarpSum(x0 + x1);
    s0 = x0 * inv;
    s1 = x1 * inv;
  } else {
    s0 = 1.0f / (1.0f + expf(-l0));
    s1 = 1.0f / (1.0f + expf(-l1));
  }
  const float* bias = p.correction_bias;
  float c0 = v0 ? s0 + (bias != nullptr ? bias[i0] : 0.0f) : -INFINITY;
  float c1 = v1 ? s1 + (bias != nullptr ? bias[i1] : 0.0f) : -INFINITY;
  float* choice = scratch;    // [64]
  float* picked = scratch + 64;  // [top_k]: the chosen scores, best first
  if (p.method != MoeTopk::kGreedy) {
    if (v0) choice[i0] = c0;
    if (v1) choice[i1] = c1;
    __syncwarp();
    MaskGroups(p, choice);
    if (v0) c0 = choice[i0];
    if (v1) c1 = choice[i1];
  }
  // A NaN would beat nothing and be beaten by nothing: ranked as -inf, so that the ranks
  // stay a permutation. Experts past e are -inf with higher indices: ranked last.
  if (c0 != c0) c0 = -INFINITY;
  if (c1 != c1) c1 = -INFINITY;
  __syncwarp();
  choice[i0] = c0;
  choice[i1] = c1;
  __syncwarp();
  int r0 = 0, r1 = 0;
#pragma unroll 4
  for (int j = 0; j < 64; j += 4) {
    const float4 c = *reinterpret_cast<const float4*>(choice + j);
    r0 += Beats(c.x, j, c0, i0) + Beats(c.y, j + 1, c0, i0) + Beats(c.z, j + 2, c0, i0) + Beats(c.w, j + 3, c0, i0);
    r1 += Beats(c.x, j, c1, i1) + Beats(c.y, j + 1, c1, i1) + Beats(c.z, j + 2, c1, i1) + Beats(c.w, j + 3, c1, i1);
  }
  const bool pick0 = v0 && r0 < top_k, pick1 = v1 && r1 < top_k;
  int32_t* ids = p.expert_ids + static_cast<int64_t>(t) * top_k;
  if (pick0) {
    ids[r0] = i0;
    picked[r0] = s0;
    if (ids_s != nullptr) ids_s[r0] = i0;
  }
  if (pick1) {
    ids[r1] = i1;
    picked[r1] = s1;
    if (ids_s != nullptr) ids_s[r1] = i1;
  }
  const unsigned b0 = __ballot_sync(0xffffffffu, pick0), b1 = __ballot_sync(0xffffffffu, pick1);
  if (chosen != nullptr && lane == 0) *chosen = b0 | (static_cast<unsigned long long>(b1) << 32);
  __syncwarp();
  float sum = 0.0f;  // in choice order, as RouteTokenWarpIterative adds them
  for (int k = 0; k < top_k; ++k) sum += picked[k];
  if (lane < top_k) {
    const float v = RoutingWeight(p, picked[lane], sum);
    p.weights[static_cast<int64_t>(t) * top_k + lane] = v;
    if (weights_s != nullptr) weights_s[lane] = v;
  }
  __syncwarp();
}

// RouteTokenWarp for any number of experts: top_k rounds of a warp-wide arg-max.
__device__ __forceinline__ void RouteTokenWarpIterative(const MoeRoutingParams& p, int t, const float* logits,
                                                        float* scratch, int* ids_s, float* weights_s) {
  const int lane = threadIdx.x % 32;
  const int e = p.num_experts;
  float* scores = scratch;
  float* choice = scores + e;

  if (p.scoring == MoeScoring::kSoftmax) {
    float m = -INFINITY;
    for (int i = lane; i < e; i += 32) m = fmaxf(m, logits[i]);
    m = internal::WarpMax(m);
    float sum = 0.0f;
    for (int i = lane; i < e; i += 32) {
      const float x = expf(logits[i] - m);
      scores[i] = x;
      sum += x;
    }
    const float inv = 1.0f / internal::WarpSum(sum);
    for (int i = lane; i < e; i += 32) scores[i] *= inv;
  } else {
    for (int i = lane; i < e; i += 32) scores[i] = 1.0f / (1.0f + expf(-logits[i]));
  }
  for (int i = lane; i < e; i += 32) {
    choice[i] = scores[i] + (p.correction_bias != nullptr ? p.correction_bias[i] : 0.0f);
  }
  __syncwarp();
  if (p.method != MoeTopk::kGreedy) MaskGroups(p, choice);

  uint32_t taken = 0;  // bit j: expert lane + 32 j chosen
  float sum = 0.0f;
  float mine = 0.0f;  // lane k: the score of the k-th choice (top_k <= 32)
  int32_t* ids = p.expert_ids + static_cast<int64_t>(t) * p.top_k;
  for (int k = 0; k < p.top_k; ++k) {
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int j = 0, i = lane; i < e; ++j, i += 32) {
      if (!((taken >> j) & 1u) && Better(choice[i], i, bv, bi)) {
        bv = choice[i];
        bi = i;
      }
    }
    WarpBest(&bv, &bi);
    if (bi % 32 == lane) taken |= 1u << (bi / 32);
    const float s = scores[bi];
    sum += s;  // every lane, in the same order
    if (lane == k) {
      mine = s;
      ids[k] = bi;
      if (ids_s != nullptr) ids_s[k] = bi;
    }
  }
  // Each lane its own choice's weight: no read back of what was just written.
  if (lane < p.top_k) {
    const float v = RoutingWeight(p, mine, sum);
    p.weights[static_cast<int64_t>(t) * p.top_k + lane] = v;
    if (weights_s != nullptr) weights_s[lane] = v;
  }
  __syncwarp();
}

// Routes token t with the calling warp: logits = its router logits (num_experts values),
// scratch = RouteScratchFloats(num_experts) floats of shared memory the warp owns, 16-byte
// aligned. With ids_s / weights_s (shared memory, top_k each) the choice is also left
// there, for a permutation in the same block without a round trip through global memory;
// with `chosen` (at most kRankRoutingExperts experts) also as a bit mask of experts.
__device__ __forceinline__ void RouteTokenWarp(const MoeRoutingParams& p, int t, const float* logits, float* scratch,
                                               int* ids_s = nullptr, float* weights_s = nullptr,
                                               unsigned long long* chosen = nullptr) {
  if (p.num_experts <= kRankRoutingExperts) {
    RouteTokenWarpByRank(p, t, logits, scratch, ids_s, weights_s, chosen);
  } else {
    RouteTokenWarpIterative(p, t, logits, scratch, ids_s, weights_s);
  }
}

}  // namespace tandem::cuda::internal
