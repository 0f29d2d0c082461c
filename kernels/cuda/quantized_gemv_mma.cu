// Narrow GEMVs on tensor cores. Widening FP4 or FP8 weights to float32 costs quarter-rate
// f16 -> f32 conversions per weight, which bounded the scalar kernel (quantized_gemv.cu)
// near 0.4 (FP4) and 0.5 (FP8) of the copy bandwidth; here the weights are widened only to
// f16 (FP4: two codes to an f16x2 with a shift and two masks; FP8: the hardware's
// e4m3x2 -> f16x2) and mma.m16n8k16 does the products.
//
// A warp streams 16-row tiles of the weights, 64 columns at a time (one item), persistent
// over tiles as in quantized_gemv.cu; each lane's two 16-byte loads of an item are its A
// fragments for four 16-wide steps of k:
//   - FP4 tiled (fp4_tiled.h): one load, rows g and g + 8 of two 32-wide scale groups;
//   - FP8: rows g and g + 8, bytes 16 t .. 16 t + 15 of the item's 64 columns; step s takes
//     bytes 4 s .. 4 s + 3 of each (the MMA's k positions 2t, 2t+1, 2t+8, 2t+9 are then
//     columns 16 t + 4 s + 0..3: the natural order, no rearranged storage). A 128 x 128
//     scale block holds whole tiles and items.
// The activations' rows (up to 8) are the MMA's n columns. They are staged in shared
// memory as f16 pairs split in two, hi = f16(v) and lo = f16(v - hi), after scaling each
// row by a power of two that puts its largest |value| in [2^14, 2^15): hi + lo keeps 22
// bits of every value, the products of f16 weights (exact) and each half are exact in the
// MMA's float32 accumulation, and the scale is taken back off exactly. Each scale group's
// sum is multiplied by its scale once, as the scalar kernel does: agreement with the CPU's
// float32 sums to float32 rounding of the terms, deterministic (a fixed order, no atomics).
#include "kernels/cuda/quantized_gemv_mma.h"

#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/narrow_widen.cuh"
#include "kernels/cuda/quantized_gemv_operands.cuh"

namespace tandem::cuda::internal {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kDepth = 2;  // items per lane per pipeline stage (two stages in flight)

// Row stride of the staged activations, in (hi, lo) pairs: 32 bytes of padding put the
// rows' reads of one step in different banks.
__host__ __device__ constexpr int64_t XStride(int64_t k) { return k / 2 + 4; }

__device__ __forceinline__ uint32_t HalfBits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }

// One item's loads: FP4 one 16-byte load and 4 scales; FP8 two loads and one scale.
struct Loaded {
  uint4 a, b;
  float4 s;
};

template <QuantizedWeight F>
__global__ void __launch_bounds__(kThreads, 3) MmaGemvKernel(QuantizedGemvParams p) {
  constexpr bool kFp4 = F == QuantizedWeight::kFp4Tiled;
  // FP4's f16 weights are 2^-14 times their values (Fp4PairToHalf2).
  constexpr float kWeightUnscale = kFp4 ? 16384.0f : 1.0f;
  extern __shared__ uint2 xs[];
  __shared__ float x_scale[kQuantizedGemvMaxRows], y_scale[kQuantizedGemvMaxRows];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int cbs = static_cast<int>(p.k / 64);
  const int64_t stride = XStride(p.k), scale_cols = (p.k + 127) / 128;
  const int64_t tiles = (p.n + 15) / 16;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  const int items = first < tiles ? static_cast<int>((tiles - first + warps - 1) / warps) * cbs : 0;
  GemvOperands ops;
  if (!BlockOperands(p, kThreads, &ops)) return;
  const uint8_t* const weights = ops.w;
  const float* const scales = ops.scales;
  const float* const x = ops.x;
  float* const y = ops.y;

  // The stream of (tile, 64-column block) items, loads running two stages ahead of use.
  int next_item = 0, next_cb = 0;
  int64_t next_tile = first;
  auto fetch = [&](Loaded (&l)[kDepth]) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      if (next_item < items) {
        if constexpr (kFp4) {
          const int64_t item = next_tile * cbs + next_cb;
          l[d].a = LoadWeight(reinterpret_cast<const uint4*>(weights) + item * 32 + lane);
          l[d].s = LoadWeight(reinterpret_cast<const float4*>(scales) + item * 8 + g);
        } else {
          // Rows past n (the last tile) read row n - 1 and are not stored.
          const int64_t r0 = min(next_tile * 16 + g, p.n - 1), r1 = min(next_tile * 16 + g + 8, p.n - 1);
          const int64_t col = static_cast<int64_t>(next_cb) * 64 + 16 * t;
          l[d].a = LoadWeight(reinterpret_cast<const uint4*>(weights + r0 * p.k + col));
          l[d].b = LoadWeight(reinterpret_cast<const uint4*>(weights + r1 * p.k + col));
          l[d].s.x = LoadWeight(scales + (next_tile * 16 / 128) * scale_cols + next_cb / 2);
        }
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
  // The activation pairs (hi, lo) of columns 2 pair, 2 pair + 1 and of the 8 columns after.
  auto x_pairs = [&](int pair, int after, uint2& b0, uint2& b1) {
    b0 = make_uint2(0u, 0u);
    b1 = make_uint2(0u, 0u);
    if (has_x) {
      b0 = x_row[pair];
      b1 = x_row[pair + after];
    }
  };
  auto consume = [&](const Loaded (&l)[kDepth]) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      if (use_item < items) {
        if constexpr (kFp4) {
          const uint32_t words[4] = {l[d].a.x, l[d].a.y, l[d].a.z, l[d].a.w};
          const float sc[4] = {l[d].s.x, l[d].s.y, l[d].s.z, l[d].s.w};
#pragma unroll
          for (int c = 0; c < 2; ++c) {  // the item's two 32-wide scale groups
            // hi and lo products in two accumulators: two short dependent chains of MMAs.
            float group[4] = {0.0f, 0.0f, 0.0f, 0.0f}, group_lo[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // their two 16-wide steps
              const uint32_t a[4] = {Fp4PairToHalf2(words[2 * c], 2 * h), Fp4PairToHalf2(words[2 * c + 1], 2 * h),
                                     Fp4PairToHalf2(words[2 * c], 2 * h + 1),
                                     Fp4PairToHalf2(words[2 * c + 1], 2 * h + 1)};
              uint2 b0, b1;
              x_pairs(use_cb * 32 + c * 16 + h * 8 + t, 4, b0, b1);
              mma::Mma16816F16(group, a, b0.x, b1.x);     // hi halves
              mma::Mma16816F16(group_lo, a, b0.y, b1.y);  // lo halves
            }
            acc[0] = fmaf(group[0] + group_lo[0], sc[2 * c], acc[0]);
            acc[1] = fmaf(group[1] + group_lo[1], sc[2 * c], acc[1]);
            acc[2] = fmaf(group[2] + group_lo[2], sc[2 * c + 1], acc[2]);
            acc[3] = fmaf(group[3] + group_lo[3], sc[2 * c + 1], acc[3]);
          }
        } else {
          const uint32_t row_g[4] = {l[d].a.x, l[d].a.y, l[d].a.z, l[d].a.w};
          const uint32_t row_g8[4] = {l[d].b.x, l[d].b.y, l[d].b.z, l[d].b.w};
          // Four accumulators (hi and lo, even and odd steps): short dependent chains of MMAs.
          float group[4][4] = {};
#pragma unroll
          for (int s = 0; s < 4; ++s) {  // columns 16 t + 4 s .. + 3 of the item
            const uint32_t a[4] = {Fp8PairToHalf2(row_g[s], 0), Fp8PairToHalf2(row_g8[s], 0),
                                   Fp8PairToHalf2(row_g[s], 1), Fp8PairToHalf2(row_g8[s], 1)};
            uint2 b0, b1;
            x_pairs(use_cb * 32 + 8 * t + 2 * s, 1, b0, b1);
            mma::Mma16816F16(group[2 * (s % 2)], a, b0.x, b1.x);
            mma::Mma16816F16(group[2 * (s % 2) + 1], a, b0.y, b1.y);
          }
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            acc[i] = fmaf((group[0][i] + group[1][i]) + (group[2][i] + group[3][i]), l[d].s.x, acc[i]);
          }
        }
        ++use_item;
        if (++use_cb == cbs) {  // the tile is done: rows g and g + 8 of activation rows 2t, 2t + 1
          const int64_t row = use_tile * 16 + g;
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int r = 2 * t + j;
            if (r < p.m) {
              float* out = y + r * p.ldy + row;
              if (row < p.n) out[0] = p.accumulate ? out[0] + acc[j] * y_scale[r] : acc[j] * y_scale[r];
              if (row + 8 < p.n) out[8] = p.accumulate ? out[8] + acc[2 + j] * y_scale[r] : acc[2 + j] * y_scale[r];
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

  Loaded la[kDepth], lb[kDepth];
  fetch(la);  // plain weights need no wait: in flight while the previous kernel finishes
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
      y_scale[r] = ldexpf(kWeightUnscale, -e);
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
    fetch(lb);
    consume(la);
    fetch(la);
    consume(lb);
  }
}

template <QuantizedWeight F>
cudaError_t LaunchMma(const QuantizedGemvParams& p, cudaStream_t stream) {
  static int resident = [] {
    if (cudaFuncSetAttribute(MmaGemvKernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(kQuantizedGemvMaxSharedBytes)) != cudaSuccess) {
      return 0;
    }
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, MmaGemvKernel<F>, kThreads, 0) != cudaSuccess) return 0;
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
  return Launch(MmaGemvKernel<F>, dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(problems)),
                dim3(kThreads), shared, stream, p);
}

}  // namespace

cudaError_t LaunchFp4TiledGemv(const QuantizedGemvParams& p, cudaStream_t stream) {
  return LaunchMma<QuantizedWeight::kFp4Tiled>(p, stream);
}

cudaError_t LaunchFp8MmaGemv(const QuantizedGemvParams& p, cudaStream_t stream) {
  return LaunchMma<QuantizedWeight::kFp8Block128>(p, stream);
}

}  // namespace tandem::cuda::internal
