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
// experts, whose output row it has zeroed (with accumulate: left as it is) (blocks of `threads` threads, striding by grid).
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
    if (p.accumulate) return false;  // nothing to add
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

}  // namespace tandem::cuda::internal
