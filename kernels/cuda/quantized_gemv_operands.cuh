// The operands of one block of a QuantizedGemv launch (quantized_gemv.cu and
// quantized_gemv_mma.cu): the plain form's, or, in the routed form, those of the problem in
// blockIdx.y, whose expert id an earlier kernel wrote (so the weights wait for it).
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/quantized_gemv.h"

namespace tandem::cuda::internal {

struct GemvOperands {
  const uint8_t* w;
  const float* scales;
  const float* x;
  float* y;
};

// False when the block has nothing more to do: a routed problem whose id is outside the
// experts, whose output row it has zeroed (blocks of `threads` threads, striding by grid).
__device__ __forceinline__ bool BlockOperands(const QuantizedGemvParams& p, int threads, GemvOperands* o) {
  *o = {p.w, p.scales, p.x, p.y};
  if (p.experts == nullptr) return true;
  GridDependencyWait();
  const int problem = blockIdx.y;
  const int32_t id = p.ids[problem];
  o->x += static_cast<int64_t>(problem / p.x_group) * p.ldx;
  o->y += static_cast<int64_t>(problem) * p.ldy;
  if (id < 0 || id >= p.num_experts) {
    TriggerDependentLaunch();
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * threads + threadIdx.x; i < p.n;
         i += static_cast<int64_t>(gridDim.x) * threads) {
      o->y[i] = 0.0f;
    }
    return false;
  }
  o->w = p.experts[id].w;
  o->scales = p.experts[id].scales;
  return true;
}

// Row r's inverse RMS into inv[r] for every row (norm_weight set; warps of a block of
// `warps` warps, then a barrier): before the staging reads XAt.
__device__ __forceinline__ void RowInverseRms(const QuantizedGemvParams& p, const float* x, int warps, float* inv) {
  if (p.norm_weight == nullptr) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < p.m; r += warps) {
    float s = 0.0f;
    for (int64_t c = lane; c < p.k; c += 32) {
      const float v = x[r * p.ldx + c];
      s = fmaf(v, v, s);
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) inv[r] = rsqrtf(s / static_cast<float>(p.k) + p.norm_eps);
  }
  __syncthreads();
}

// Activation c of row r as the kernel multiplies it (QuantizedGemvParams: x, or its RMSNorm
// with inv from RowInverseRms, or the SwiGLU of its halves).
__device__ __forceinline__ float XAt(const QuantizedGemvParams& p, const float* x, int64_t r, int64_t c,
                                     const float* inv) {
  const float* row = x + r * p.ldx;
  if (p.swiglu) {
    const float g = row[c], u = row[p.k + c];
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
  }
  if (p.norm_weight != nullptr) return p.norm_weight[c] * (row[c] * inv[r]);
  return row[c];
}

}  // namespace tandem::cuda::internal
