// Device helpers shared by the CUDA kernels of this directory (not a public API): warp
// reductions, bf16 packing, the rotary angle as the CPU reference computes it, and the
// launch helper with programmatic dependent launch (launch_control.h).
#pragma once

#include <climits>
#include <cstdint>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/launch_control.h"

namespace tandem::cuda::internal {

// Programmatic dependent launch, device side (no-ops below sm_90 and when the kernel was
// launched without the attribute). A kernel launched through Launch() must call
// GridDependencyWait() in every thread before it touches memory that an earlier kernel
// writes or reads (weights and other constants may be read before), and before any early
// return: a successor's wait then also covers every kernel before this one.
__device__ __forceinline__ void GridDependencyWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the next kernel of the stream start (its blocks run up to their own wait).
__device__ __forceinline__ void TriggerDependentLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Both, at the top of a kernel that has nothing to do before its wait.
__device__ __forceinline__ void WaitAndTrigger() {
  GridDependencyWait();
  TriggerDependentLaunch();
}

// Weight loads meant to be in flight before GridDependencyWait(), while the previous
// kernel still runs. ptxas schedules griddepcontrol.wait above non-coherent loads
// (ld.global.nc / __ldg, volatile asm or not) of the same basic block: the SASS then waits
// first and fetches the weights after the previous kernel has finished. Coherent loads
// stay in program order before it (checked with cuobjdump -sass on sm_90a). Weights are
// read once: no L1 allocation. The address must be valid (clamp it rather than predicate
// the load).
__device__ __forceinline__ uint4 LoadWeight(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ uint32_t LoadWeight(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.global.L1::no_allocate.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The same loads of float data (the same bits).
__device__ __forceinline__ float4 LoadWeight(const float4* p) {
  const uint4 u = LoadWeight(reinterpret_cast<const uint4*>(p));
  return make_float4(__uint_as_float(u.x), __uint_as_float(u.y), __uint_as_float(u.z), __uint_as_float(u.w));
}

__device__ __forceinline__ float LoadWeight(const float* p) {
  return __uint_as_float(LoadWeight(reinterpret_cast<const uint32_t*>(p)));
}

// A streamed weight chunk: read once, not worth L1. Non-coherent, unlike LoadWeight (ptxas
// may move such loads below GridDependencyWait): a kernel that issues them before its wait
// keeps them in a branch of their own, where ptxas leaves them (moe_expert_gemv.cu, checked
// in the SASS).
__device__ __forceinline__ uint4 LoadStreamed(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint2 LoadStreamed(const uint2* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// A hint to bring the 128-byte line holding p into L2.
__device__ __forceinline__ void PrefetchL2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

// Prefetches bytes [0, bytes) from p into L2, spread over the block's threads.
__device__ __forceinline__ void PrefetchRangeL2(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  const int64_t step = static_cast<int64_t>(blockDim.x) * 128;
  for (int64_t off = static_cast<int64_t>(threadIdx.x) * 128; off < bytes; off += step) PrefetchL2(c + off);
}

// Arg-max order: (v, i) beats (bv, bi) when larger, ties to the lower index (a strict total
// order on non-NaN values: the result of a reduction does not depend on its order).
__device__ __forceinline__ int Beats(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

// The same, where bi == INT_MAX means "no candidate yet".
__device__ __forceinline__ bool Better(float v, int i, float bv, int bi) {
  return bi == INT_MAX || Beats(v, i, bv, bi);
}

// The arg-max of row[0, n) over a block of kThreads threads (NaN skipped; ties to the lower
// index), for every thread of the block; index INT_MAX when every value is NaN. Uses
// kThreads / 32 floats and ints of shared memory; contains __syncthreads.
template <int kThreads>
__device__ __forceinline__ void BlockArgmax(const float* row, int64_t n, float* value, int* index) {
  __shared__ float best_v[kThreads / 32];
  __shared__ int best_i[kThreads / 32];
  float bv = 0.0f;
  int bi = INT_MAX;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const float v = row[i];
    if (!isnan(v) && Better(v, static_cast<int>(i), bv, bi)) {
      bv = v;
      bi = static_cast<int>(i);
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, offset);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, offset);
    if (oi != INT_MAX && Better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    best_v[warp] = bv;
    best_i[warp] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) {
      if (best_i[w] != INT_MAX && Better(best_v[w], best_i[w], bv, bi)) {
        bv = best_v[w];
        bi = best_i[w];
      }
    }
    best_v[0] = bv;
    best_i[0] = bi;
  }
  __syncthreads();
  *value = best_v[0];
  *index = best_i[0];
}

// The sum over each group of kLanes consecutive lanes (a power of two up to 32), in every
// lane of the group; every lane of the warp calls it.
template <int kLanes>
__device__ __forceinline__ float LaneGroupSum(float v) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

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

// Rotates the pair (v[idx.x], v[idx.y]) by the angle whose cos and sin are c and s: one
// definition, so that every kernel applying a rope rounds alike.
__device__ __forceinline__ void RotatePair(float* v, int2 idx, float c, float s) {
  const float x0 = v[idx.x], x1 = v[idx.y];
  v[idx.x] = x0 * c - x1 * s;
  v[idx.y] = x1 * c + x0 * s;
}

__device__ __forceinline__ float SiluMulValue(float gate, float up) { return gate / (1.0f + expf(-gate)) * up; }

// Launches kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent
// launch when ProgrammaticLaunch() is on (the kernel must follow GridDependencyWait's
// rule). Returns the launch's error.
template <typename... Params, typename... Args>
cudaError_t Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  if (ProgrammaticLaunch()) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attr;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace tandem::cuda::internal
