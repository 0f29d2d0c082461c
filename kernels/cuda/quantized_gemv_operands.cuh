// What QuantizedGemv's kernels share (quantized_gemv.cu, quantized_gemv_mma.cu,
// fp4_expert_gemv.cu): the FP4 widening, and the operands of one block of a launch (the
// plain form's, or, in the routed form, those of the problem in blockIdx.y, whose expert id
// an earlier kernel wrote, so the weights wait for it).
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/quantized_gemv.h"

namespace tandem::cuda::internal {

__device__ __forceinline__ float2 Half2Bits(uint32_t bits) {
  __half2_raw raw;
  raw.x = static_cast<unsigned short>(bits & 0xffffu);
  raw.y = static_cast<unsigned short>(bits >> 16);
  return __half22float2(__half2(raw));
}

// Nibbles i and i + 4 of w (FP4 e2m1, low nibble first) as an f16x2, each 2^-14 times its
// value: codes i and i + 4 of a word sit 16 bits apart, as the halves of an f16x2 do, so one
// shift puts both codes' exponent and mantissa bits (e1 e0 m) at an f16's bits 11..9
// (exponent 0..3, the e2m1 subnormal 0.5 becoming f16's subnormal 2^-15) and their signs at
// bit 12, which moves to bit 15. The 2^14 is multiplied back with the scale.
__device__ __forceinline__ uint32_t Fp4PairToHalf2(uint32_t w, int i) {
  const uint32_t t = i < 3 ? w << (9 - 4 * i) : w >> 3;
  return (t & 0x0e000e00u) | ((t & 0x10001000u) << 3);
}

// The 8 FP4 values of a word as float32 (2^-14 times their values), in column order.
__device__ __forceinline__ void WidenFp4Word(uint32_t word, float* w) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = Half2Bits(Fp4PairToHalf2(word, i));
    w[i] = f.x;
    w[i + 4] = f.y;
  }
}

// The 32 FP4 values of a 16-byte load as float32 (2^-14 times their values).
__device__ __forceinline__ void WidenFp4(const uint4& wv, float* w) {
  WidenFp4Word(wv.x, w);
  WidenFp4Word(wv.y, w + 8);
  WidenFp4Word(wv.z, w + 16);
  WidenFp4Word(wv.w, w + 24);
}

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
