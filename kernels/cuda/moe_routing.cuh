// The warp-level DeepSeekMoE routing of moe_routing.h as a device function, shared by
// MoeRouting and the fused small-batch routing of moe_permute.h (not a public API).
#pragma once

#include <climits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/moe_routing.h"

namespace tandem::cuda::internal {

// (v, i) better than (bv, bi): larger value, ties to the lower index; bi == INT_MAX is "none".
__device__ __forceinline__ bool Better(float v, int i, float bv, int bi) {
  return bi == INT_MAX || v > bv || (v == bv && i < bi);
}

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

// Routes token t with the calling warp: logits = its router logits (num_experts values),
// scratch = 2 * num_experts floats of shared memory the warp owns.
// With ids_s / weights_s (shared memory, top_k each) the choice is also left there, for a
// permutation in the same block without a round trip through global memory.
__device__ __forceinline__ void RouteTokenWarp(const MoeRoutingParams& p, int t, const float* logits, float* scratch,
                                               int* ids_s = nullptr, float* weights_s = nullptr) {
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

  if (p.method != MoeTopk::kGreedy) {
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

  uint32_t taken = 0;  // bit j: expert lane + 32 j chosen
  float sum = 0.0f;
  float mine = 0.0f;  // lane k: the score of the k-th choice (top_k <= 32)
  float* w = p.weights + static_cast<int64_t>(t) * p.top_k;
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
    const bool normalize = p.normalize && p.top_k > 1;
    float v = mine;
    if (normalize) v /= sum + 1e-20f;
    if (!normalize || p.scale_normalized) v *= p.routed_scaling_factor;
    w[lane] = v;
    if (weights_s != nullptr) weights_s[lane] = v;
  }
  __syncwarp();
}


}  // namespace tandem::cuda::internal
