// Device helpers shared by the CUDA kernels of this directory (not a public API): warp
// reductions, bf16 packing, the rotary angle as the CPU reference computes it.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace tandem::cuda::internal {

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over a block of kThreads threads (a multiple of 32); every thread gets the result.
// `scratch` holds kThreads / 32 floats; the call ends with the scratch free for reuse.
template <int kThreads>
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  v = WarpSum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // earlier readers of scratch are done
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) total += scratch[w];
  return total;
}

// cos/sin of position * inv_freq times attention_factor, in float as
// kernels/cpu/norm_rope_act.cc's RopeCosSin computes them (accurate cosf/sinf).
__device__ __forceinline__ void RopeCosSin(int64_t position, float inv_freq, float attention_factor, float* c,
                                           float* s) {
  const float angle = static_cast<float>(position) * inv_freq;
  *c = cosf(angle) * attention_factor;
  *s = sinf(angle) * attention_factor;
}

// Index of the two values of rotary pair i in a head of 2 * half values.
__device__ __forceinline__ int2 RopePair(int i, int half, bool interleaved) {
  return interleaved ? make_int2(2 * i, 2 * i + 1) : make_int2(i, i + half);
}

__device__ __forceinline__ float SiluMulValue(float gate, float up) { return gate / (1.0f + expf(-gate)) * up; }

}  // namespace tandem::cuda::internal
