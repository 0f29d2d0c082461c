// FP4 GEMV on tensor cores. Widening e2m1 to float32 costs a quarter-rate conversion per
// weight (f16 -> f32), which bounded the scalar kernel near 0.4 of the copy bandwidth;
// here two codes become one f16x2 with a shift and two masks and mma.m16n8k16 does the
// products, so the integer work per weight is about two instructions.
//
// A warp streams 16-row tiles of the weights (fp4_tiled.h: each lane's 16-byte load is its
// A fragments for four 16-wide steps of k), persistent over tiles as in quantized_gemv.cu.
// The activations' rows (up to 8) are the MMA's n columns. They are staged in shared
// memory as f16 pairs split in two, hi = f16(v) and lo = f16(v - hi), after scaling each
// row by a power of two that puts its largest |value| in [2^14, 2^15): hi + lo keeps 22
// bits of every value, the products of f16 weights (exact) and each half are exact in the
// MMA's float32 accumulation, and the scale is taken back off exactly. Each 32-wide group's
// sum (four MMAs: two steps, hi and lo) is multiplied by its scale once, as the scalar
// kernel does: agreement with the CPU's float32 sums to float32 rounding of the terms,
// deterministic (a fixed order, no atomics).
#include "kernels/cuda/quantized_gemv_fp4_mma.h"

#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/mma_sync.cuh"

namespace tandem::cuda::internal {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kDepth = 4;  // 16-byte loads (and their scales) per lane per pipeline stage

// Row stride of the staged activations, in (hi, lo) pairs: 32 bytes of padding put the
// rows' reads of one step in different banks.
__host__ __device__ constexpr int64_t XStride(int64_t k) { return k / 2 + 4; }

// Nibbles i and i + 4 of w as an f16x2, each 2^-14 times its e2m1 value: one shift puts
// both codes' exponent and mantissa bits at an f16's bits 11..9 (the e2m1 subnormal 0.5
// becoming f16's subnormal 2^-15) and their signs at bit 12, which moves to bit 15.
__device__ __forceinline__ uint32_t Fp4PairToHalf2(uint32_t w, int i) {
  const uint32_t t = i < 3 ? w << (9 - 4 * i) : w >> 3;
  return (t & 0x0e000e00u) | ((t & 0x10001000u) << 3);
}

__device__ __forceinline__ uint32_t HalfBits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }

__global__ void __launch_bounds__(kThreads) Fp4MmaGemvKernel(QuantizedGemvParams p) {
  extern __shared__ uint2 xs[];
  __shared__ float x_scale[kQuantizedGemvMaxRows], y_scale[kQuantizedGemvMaxRows];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int cbs = static_cast<int>(p.k / 64);
  const int64_t stride = XStride(p.k);
  const int64_t tiles = (p.n + 15) / 16;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  const int items = first < tiles ? static_cast<int>((tiles - first + warps - 1) / warps) * cbs : 0;
  const uint8_t* weights = p.w;
  const float* scales = p.scales;
  const float* x = p.x;
  float* y = p.y;
  if (p.experts != nullptr) {  // the routed form: this column's expert, written by an earlier kernel
    GridDependencyWait();
    const int problem = blockIdx.y;
    const int32_t id = p.ids[problem];
    x += static_cast<int64_t>(problem / p.x_group) * p.ldx;
    y += static_cast<int64_t>(problem) * p.ldy;
    if (id < 0 || id >= p.num_experts) {
      TriggerDependentLaunch();
      for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < p.n;
           i += static_cast<int64_t>(gridDim.x) * kThreads) {
        y[i] = 0.0f;
      }
      return;
    }
    weights = p.experts[id].w;
    scales = p.experts[id].scales;
  }

  // The stream of (tile, 64-column block) items, loads running two stages ahead of use.
  int next_item = 0, next_cb = 0;
  int64_t next_tile = first;
  auto fetch = [&](uint4 (&w)[kDepth], float4 (&s)[kDepth]) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      if (next_item < items) {
        const int64_t item = next_tile * cbs + next_cb;
        w[d] = LoadWeight(reinterpret_cast<const uint4*>(weights) + item * 32 + lane);
        s[d] = LoadWeight(reinterpret_cast<const float4*>(scales) + item * 8 + g);
        ++next_item;
        if (++next_cb == cbs) {
          next_cb = 0;
          next_tile += warps;
        }
      }
    }
  };
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int use_item = 0, use_cb = 0;
  int64_t use_tile = first;
  const bool has_x = g < p.m;  // lane g supplies activation row g (the MMA's column g)
  const uint2* x_row = xs + g * stride;
  auto consume = [&](const uint4 (&w)[kDepth], const float4 (&s)[kDepth]) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      if (use_item < items) {
        const uint32_t words[4] = {w[d].x, w[d].y, w[d].z, w[d].w};
        const float sc[4] = {s[d].x, s[d].y, s[d].z, s[d].w};
#pragma unroll
        for (int c = 0; c < 2; ++c) {  // the block's two 32-wide scale groups
          float group[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int h = 0; h < 2; ++h) {  // their two 16-wide MMA steps
            const uint32_t a[4] = {Fp4PairToHalf2(words[2 * c], 2 * h), Fp4PairToHalf2(words[2 * c + 1], 2 * h),
                                   Fp4PairToHalf2(words[2 * c], 2 * h + 1),
                                   Fp4PairToHalf2(words[2 * c + 1], 2 * h + 1)};
            uint2 b0 = make_uint2(0u, 0u), b1 = make_uint2(0u, 0u);
            if (has_x) {
              const int pair = use_cb * 32 + c * 16 + h * 8 + t;  // cols 2 pair, 2 pair + 1
              b0 = x_row[pair];
              b1 = x_row[pair + 4];
            }
            mma::Mma16816F16(group, a, b0.x, b1.x);  // hi halves
            mma::Mma16816F16(group, a, b0.y, b1.y);  // lo halves
          }
          acc[0] = fmaf(group[0], sc[2 * c], acc[0]);
          acc[1] = fmaf(group[1], sc[2 * c], acc[1]);
          acc[2] = fmaf(group[2], sc[2 * c + 1], acc[2]);
          acc[3] = fmaf(group[3], sc[2 * c + 1], acc[3]);
        }
        ++use_item;
        if (++use_cb == cbs) {  // the tile is done: rows g and g + 8 of activation rows 2t, 2t + 1
          const int64_t row = use_tile * 16 + g;
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int r = 2 * t + j;
            if (r < p.m) {
              if (row < p.n) y[r * p.ldy + row] = acc[j] * y_scale[r];
              if (row + 8 < p.n) y[r * p.ldy + row + 8] = acc[2 + j] * y_scale[r];
            }
          }
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[i] = 0.0f;
          use_cb = 0;
          use_tile += warps;
        }
      }
    }
  };

  uint4 wa[kDepth], wb[kDepth];
  float4 sa[kDepth], sb[kDepth];
  fetch(wa, sa);  // plain weights need no wait: in flight while the previous kernel finishes
  if (p.experts == nullptr) GridDependencyWait();
  // Each activation row's power-of-two scale, then its split f16 pairs.
  for (int r = warp; r < p.m; r += kWarps) {
    float most = 0.0f;
    for (int64_t i = lane; i < p.k; i += 32) most = fmaxf(most, fabsf(x[r * p.ldx + i]));
#pragma unroll
    for (int o = 16; o > 0; o /= 2) most = fmaxf(most, __shfl_xor_sync(0xffffffffu, most, o));
    if (lane == 0) {
      const int e = most > 0.0f && isfinite(most) ? max(-100, min(100, 14 - ilogbf(most))) : 0;
      x_scale[r] = ldexpf(1.0f, e);
      y_scale[r] = ldexpf(1.0f, 14 - e);  // also takes back the weights' 2^-14
    }
  }
  __syncthreads();
  const int64_t pairs = p.k / 2;
  for (int64_t i = threadIdx.x; i < p.m * pairs; i += kThreads) {
    const int64_t r = i / pairs, q = i - r * pairs;
    const float v0 = x[r * p.ldx + 2 * q] * x_scale[r], v1 = x[r * p.ldx + 2 * q + 1] * x_scale[r];
    const __half2 hi = __floats2half2_rn(v0, v1);
    const float2 back = __half22float2(hi);
    xs[r * stride + q] = make_uint2(HalfBits(hi), HalfBits(__floats2half2_rn(v0 - back.x, v1 - back.y)));
  }
  __syncthreads();
  TriggerDependentLaunch();
  while (use_item < items) {
    fetch(wb, sb);
    consume(wa, sa);
    fetch(wa, sa);
    consume(wb, sb);
  }
}

}  // namespace

cudaError_t LaunchFp4TiledGemv(const QuantizedGemvParams& p, cudaStream_t stream) {
  static int resident = [] {
    if (cudaFuncSetAttribute(Fp4MmaGemvKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(kQuantizedGemvMaxSharedBytes)) != cudaSuccess) {
      return 0;
    }
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, Fp4MmaGemvKernel, kThreads, 0) != cudaSuccess) return 0;
    return blocks;
  }();
  if (resident == 0) return cudaErrorInvalidValue;
  const size_t shared = static_cast<size_t>(p.m * XStride(p.k)) * sizeof(uint2);
  if (static_cast<int64_t>(shared) > kQuantizedGemvMaxSharedBytes) return cudaErrorInvalidValue;
  // Shared memory per multiprocessor on sm_90 / sm_100: 228 KiB, 1 KiB of it per block reserved.
  const int by_shared = static_cast<int>((228 * 1024) / (shared + 1024 + 64));
  const int per_sm = std::max(1, std::min(resident, by_shared));
  const int problems = p.experts != nullptr ? p.problems : 1;
  const int64_t wanted = ((p.n + 15) / 16 + kWarps - 1) / kWarps;
  const int64_t slots = static_cast<int64_t>(CurrentDeviceMultiprocessors()) * per_sm;
  const int64_t blocks = std::min<int64_t>(wanted, std::max<int64_t>(1, (slots + problems - 1) / problems));
  return Launch(Fp4MmaGemvKernel, dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(problems)),
                dim3(kThreads), shared, stream, p);
}

}  // namespace tandem::cuda::internal
