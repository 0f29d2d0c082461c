#include "kernels/cuda/v4_moe_routing.h"

#include <climits>

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxExperts = 1024;
constexpr int kMaxTopK = 32;

// torch's softplus (threshold 20), then its square root; IEEE-rounded as the host's.
__device__ __forceinline__ float SqrtSoftplus(float x) { return __fsqrt_rn(x > 20.0f ? x : log1pf(expf(x))); }

// Scratch per warp: the scores and the biased choice values.
__global__ void V4MoeRoutingKernel(V4MoeRoutingParams p) {
  extern __shared__ float smem[];
  internal::WaitAndTrigger();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = blockIdx.x * kWarps + warp;
  if (t >= p.num_tokens) return;
  const int e = p.num_experts, k = p.top_k;
  float* scores = smem + warp * 2 * kMaxExperts;
  float* choice = scores + kMaxExperts;
  const float* logits = p.logits + static_cast<int64_t>(t) * p.logits_stride;
  for (int i = lane; i < e; i += 32) {
    scores[i] = SqrtSoftplus(logits[i]);
    if (p.tid2eid == nullptr) {
      const float c = __fadd_rn(scores[i], p.correction_bias[i]);
      choice[i] = c != c ? -INFINITY : c;  // a NaN ranks last, as -inf
    }
  }
  __syncwarp();
  // Lane j < k ends up holding the j-th chosen expert (best first, then sorted).
  int mine = -1;
  bool bad = false;
  if (p.tid2eid != nullptr) {
    const int32_t token = p.tokens[t];
    if (token < 0 || token >= p.vocab_size) {
      bad = true;
    } else if (lane < k) {
      mine = p.tid2eid[static_cast<int64_t>(token) * k + lane];
      if (mine < 0 || mine >= e) bad = true;
    }
    bad = __any_sync(0xffffffffu, bad);
  } else {
    // k rounds of a warp-wide arg-max; lane holds experts lane + 32 m, bit m of `taken`.
    uint32_t taken = 0;
    for (int r = 0; r < k; ++r) {
      float bv = -INFINITY;
      int bi = INT_MAX;
      for (int i = lane, m = 0; i < e; i += 32, ++m) {
        if (!((taken >> m) & 1u) && internal::Better(choice[i], i, bv, bi)) {
          bv = choice[i];
          bi = i;
        }
      }
      for (int offset = 16; offset > 0; offset /= 2) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, offset);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, offset);
        if (oi != INT_MAX && internal::Better(ov, oi, bv, bi)) {
          bv = ov;
          bi = oi;
        }
      }
      if (lane == r) mine = bi;
      if (bi % 32 == lane) taken |= 1u << (bi / 32);
    }
  }
  int32_t* ids = p.expert_ids + static_cast<int64_t>(t) * k;
  float* weights = p.weights + static_cast<int64_t>(t) * k;
  if (bad) {
    if (lane < k) {
      ids[lane] = -1;
      weights[lane] = 0.0f;
    }
    if (lane == 0 && p.bad_input != nullptr) atomicExch(p.bad_input, 1);
    return;
  }
  // Ascending order: a chosen id's place is the number of chosen ids below it.
  int place = lane;  // a hash row keeps its order, as the CPU copies it
  if (p.tid2eid == nullptr) {
    place = 0;
    for (int j = 0; j < k; ++j) place += __shfl_sync(0xffffffffu, mine, j) < mine;
  }
  int* sorted = reinterpret_cast<int*>(choice);  // the choice values are no longer needed
  __syncwarp();
  if (lane < k) sorted[place] = mine;
  __syncwarp();
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) sum = __fadd_rn(sum, scores[sorted[j]]);
  if (lane < k) {
    const int id = sorted[lane];
    ids[lane] = id;
    weights[lane] = __fmul_rn(__fdiv_rn(scores[id], __fadd_rn(sum, 1e-20f)), p.routed_scaling_factor);
  }
}

}  // namespace

cudaError_t V4MoeRouting(const V4MoeRoutingParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  const bool hashed = p.tid2eid != nullptr;
  if (p.logits == nullptr || p.expert_ids == nullptr || p.weights == nullptr || p.num_tokens < 0 ||
      p.num_experts <= 0 || p.num_experts > kMaxExperts || p.logits_stride < p.num_experts || p.top_k <= 0 ||
      p.top_k > kMaxTopK || p.top_k > p.num_experts || (hashed && (p.tokens == nullptr || p.vocab_size <= 0)) ||
      (!hashed && p.correction_bias == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const size_t smem = static_cast<size_t>(kWarps) * 2 * kMaxExperts * sizeof(float);
  const unsigned blocks = static_cast<unsigned>((p.num_tokens + kWarps - 1) / kWarps);
  return internal::Launch(V4MoeRoutingKernel, dim3(blocks), dim3(kWarps * 32), smem, stream, p);
}

}  // namespace tandem::cuda
