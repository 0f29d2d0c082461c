#include "kernels/cuda/quantized_gemv.h"

#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/fp4_expert_gemv.h"
#include "kernels/cuda/narrow_widen.cuh"
#include "kernels/cuda/quantized_gemv_mma.h"
#include "kernels/cuda/quantized_gemv_operands.cuh"

namespace tandem::cuda {
namespace {

constexpr int kWarps = 8;
// FP8 products of fewer activation rows take the scalar kernel.
constexpr int kFp8MmaMinRows = 2;
constexpr int kThreads = kWarps * 32;
// Blocks of one- and two-row products a multiprocessor keeps resident (registers capped to
// fit; more rows would spill): one 512-thread block (100 registers a thread) left 16 warps
// a multiprocessor and the DRAM at 39 % of its peak (ncu, H100, docs/performance.md).
template <int M>
inline constexpr int kMinBlocks = M <= 2 ? 3 : 1;
constexpr int kDepth = 4;  // 16-byte weight loads per lane per pipeline stage (two stages in flight)

// x lives in shared memory as float4s, row r's float4 f at xs[r * stride + Swizzle(f)]
// (stride: k / 4 rounded up to 8, as QuantizedGemvSharedBytes counts). A lane reads the
// float4s of its own 16-byte weight load, and the lanes of a warp take consecutive loads;
// the XOR spreads their reads of one step over distinct banks (without it, eight lanes
// would hit the same four banks).
__device__ __forceinline__ int Swizzle(int f) { return f ^ ((f >> 3) & 7); }

// 16 FP8 values of one 16-byte load (two a time through the hardware's e4m3x2 -> f16x2).
__device__ __forceinline__ void WidenFp8(const uint4& wv, float* w) {
  const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) internal::WidenFp8Word(words[q], w + 4 * q);
}

template <QuantizedWeight F>
struct Format {
  // weights per 16-byte load
  static constexpr int kValues = F == QuantizedWeight::kFp8Block128 ? 16 : (F == QuantizedWeight::kFp4Group32 ? 32 : 8);
  static constexpr float kUnscale = F == QuantizedWeight::kFp4Group32 ? 16384.0f : 1.0f;  // see WidenFp4
  static constexpr bool kScaled = F != QuantizedWeight::kBf16;
};

// One warp's stream of 16-byte loads: its rows (warp, warp + warps, ...) one after the
// other, each row as `per_lane` loads per lane (lane + 32 j; those past the row's end are
// skipped). Loads and their uses walk the same stream two stages apart, so a row's first
// loads are in flight while the previous row is reduced.
struct Cursor {
  int item = 0;  // position in the stream
  int j = 0;     // load of the current row, per lane
  int64_t row = 0;
};

template <int M, QuantizedWeight F>
__global__ void __launch_bounds__(kThreads, kMinBlocks<M>) QuantizedGemvKernel(QuantizedGemvParams p) {
  extern __shared__ float4 xs[];
  constexpr int kValues = Format<F>::kValues;
  constexpr int kQuads = kValues / 4;  // float4s of x per load
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int loads = static_cast<int>(p.k / kValues);  // per row
  const int per_lane = (loads + 31) / 32;
  const int k4 = static_cast<int>(p.k / 4), stride = (k4 + 7) & ~7;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  const int rows = first_row < p.n ? static_cast<int>((p.n - first_row + warps - 1) / warps) : 0;
  const int items = rows * per_lane;
  const int64_t row_bytes =
      F == QuantizedWeight::kFp8Block128 ? p.k : (F == QuantizedWeight::kFp4Group32 ? p.k / 2 : 2 * p.k);
  const int scale_cols = static_cast<int>((p.k + 127) / 128);
  // This block's problem (blockIdx.y): the one product of the plain form, or a routed
  // expert's, whose id an earlier kernel wrote (so the weights wait for it).
  internal::GemvOperands ops;
  if (!internal::BlockOperands(p, kThreads, &ops)) return;
  const uint8_t* const weights = ops.w;
  const float* const scales = ops.scales;
  const float* const x = ops.x;
  float* const y = ops.y;

  Cursor next{.row = first_row}, use{.row = first_row};
  // Issues the next stage's loads (weights and their scales; addresses clamped in range).
  auto fetch = [&](uint4 (&w)[kDepth], float (&s)[kDepth]) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      if (next.item < items) {
        const int at = min(lane + 32 * next.j, loads - 1);
        w[d] = internal::LoadWeight(reinterpret_cast<const uint4*>(weights + next.row * row_bytes) + at);
        if constexpr (F == QuantizedWeight::kFp8Block128) {
          s[d] = internal::LoadWeight(scales + (next.row / 128) * scale_cols + at / 8);
        } else if constexpr (F == QuantizedWeight::kFp4Group32) {
          s[d] = internal::LoadWeight(scales + next.row * loads + at);
        } else {
          s[d] = 1.0f;
        }
        ++next.item;
        if (++next.j == per_lane) {
          next.j = 0;
          next.row += warps;
        }
      }
    }
  };
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.0f;
  // Multiplies a stage's loads into acc; writes each row as it completes.
  auto consume = [&](const uint4 (&w)[kDepth], const float (&s)[kDepth]) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      if (use.item < items) {
        const int at = lane + 32 * use.j;
        if (at < loads) {
          float wf[kValues];
          if constexpr (F == QuantizedWeight::kFp8Block128) {
            WidenFp8(w[d], wf);
          } else if constexpr (F == QuantizedWeight::kFp4Group32) {
            internal::WidenFp4(w[d], wf);
          } else {
            internal::WidenBf16(w[d], wf);
          }
          const float scale = s[d] * Format<F>::kUnscale;
#pragma unroll
          for (int r = 0; r < M; ++r) {
            float sum = 0.0f;
#pragma unroll
            for (int q = 0; q < kQuads; ++q) {
              const float4 x = xs[r * stride + Swizzle(at * kQuads + q)];
              sum = fmaf(wf[4 * q], x.x, sum);
              sum = fmaf(wf[4 * q + 1], x.y, sum);
              sum = fmaf(wf[4 * q + 2], x.z, sum);
              sum = fmaf(wf[4 * q + 3], x.w, sum);
            }
            acc[r] = Format<F>::kScaled ? fmaf(sum, scale, acc[r]) : acc[r] + sum;
          }
        }
        ++use.item;
        if (++use.j == per_lane) {  // the same for every lane of the warp
#pragma unroll
          for (int r = 0; r < M; ++r) {
            float v = acc[r];
#pragma unroll
            for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) {
              float* out = y + r * p.ldy + use.row;
              *out = p.accumulate ? *out + v : v;
            }
            acc[r] = 0.0f;
          }
          use.j = 0;
          use.row += warps;
        }
      }
    }
  };

  uint4 wa[kDepth], wb[kDepth];
  float sa[kDepth], sb[kDepth];
  fetch(wa, sa);  // plain weights need no wait: in flight while the previous kernel finishes
  if (p.experts == nullptr) internal::GridDependencyWait();
  for (int i = threadIdx.x; i < M * k4; i += kThreads) {
    const int r = i / k4, f = i - r * k4;
    const float* src = x + r * p.ldx + 4 * f;
    xs[r * stride + Swizzle(f)] = make_float4(src[0], src[1], src[2], src[3]);
  }
  __syncthreads();
  internal::TriggerDependentLaunch();
  while (use.item < items) {
    fetch(wb, sb);
    consume(wa, sa);
    fetch(wa, sa);
    consume(wb, sb);
  }
}

template <int M, QuantizedWeight F>
cudaError_t LaunchRows(const QuantizedGemvParams& p, size_t shared, cudaStream_t stream) {
  // The shared-memory limit raised and the register-limited residency read once.
  static int resident = [] {
    if (cudaFuncSetAttribute(QuantizedGemvKernel<M, F>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(kQuantizedGemvMaxSharedBytes)) != cudaSuccess ||
        cudaFuncSetAttribute(QuantizedGemvKernel<M, F>, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared) != cudaSuccess) {
      return 0;
    }
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, QuantizedGemvKernel<M, F>, kThreads, 0) != cudaSuccess) {
      return 0;
    }
    return blocks;
  }();
  if (resident == 0) return cudaErrorInvalidValue;
  // Shared memory per multiprocessor on sm_90 / sm_100: 228 KiB, 1 KiB of it per block reserved.
  const int by_shared = static_cast<int>((228 * 1024) / (shared + 1024));
  const int per_sm = std::max(1, std::min(resident, by_shared));
  // The routed form's problems share the resident blocks (a grid column each).
  const int problems = p.experts != nullptr ? p.problems : 1;
  const int64_t wanted = (p.n + kWarps - 1) / kWarps;
  const int64_t slots = static_cast<int64_t>(CurrentDeviceMultiprocessors()) * per_sm;
  const int64_t blocks = std::min<int64_t>(wanted, std::max<int64_t>(1, (slots + problems - 1) / problems));
  return internal::Launch(QuantizedGemvKernel<M, F>,
                          dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(problems)), dim3(kThreads),
                          shared, stream, p);
}

template <QuantizedWeight F>
cudaError_t LaunchFormat(const QuantizedGemvParams& p, cudaStream_t stream) {
  const size_t shared = static_cast<size_t>(QuantizedGemvSharedBytes(p.m, p.k));
  switch (p.m) {
    case 1: return LaunchRows<1, F>(p, shared, stream);
    case 2: return LaunchRows<2, F>(p, shared, stream);
    case 3: return LaunchRows<3, F>(p, shared, stream);
    case 4: return LaunchRows<4, F>(p, shared, stream);
    case 5: return LaunchRows<5, F>(p, shared, stream);
    case 6: return LaunchRows<6, F>(p, shared, stream);
    case 7: return LaunchRows<7, F>(p, shared, stream);
    default: return LaunchRows<8, F>(p, shared, stream);
  }
}

}  // namespace

cudaError_t QuantizedGemv(const QuantizedGemvParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  const int64_t vec = p.format == QuantizedWeight::kFp8Block128 ? 16
                      : p.format == QuantizedWeight::kFp4Group32 ? 32
                      : p.format == QuantizedWeight::kFp4Tiled   ? 64
                                                                 : 8;
  const bool scaled = p.format != QuantizedWeight::kBf16;
  const auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  if ((p.experts == nullptr && (p.w == nullptr || (scaled && p.scales == nullptr))) || p.x == nullptr || p.y == nullptr || p.m < 1 ||
      p.m > kQuantizedGemvMaxRows || p.n < 0 || p.n > (int64_t{1} << 30) || p.k <= 0 || p.k % vec != 0 ||
      p.ldx < p.k || p.ldy < p.n || (p.experts == nullptr && !aligned(p.w)) ||
      (p.format == QuantizedWeight::kFp4Tiled && p.experts == nullptr && !aligned(p.scales)) ||
      (p.experts != nullptr && (p.m != 1 || p.ids == nullptr || p.num_experts < 1 || p.problems < 1 ||
                                p.problems > 65535 || p.x_group < 1)) ||
      QuantizedGemvSharedBytes(p.m, p.k) > kQuantizedGemvMaxSharedBytes) {
    return cudaErrorInvalidValue;
  }
  if (p.format == QuantizedWeight::kFp8Block128) {
    // The tensor-core form streams whole 16-row tiles a warp: it needs many tiles to keep
    // the memory busy (measured on an H100: 2048 tiles beat the scalar kernel at 2-8 rows,
    // 448 tiles of k 7168 reached half its rate). At one row the scalar kernel is as fast
    // or faster (docs/performance.md, FP8 decode of V2/V3 checkpoints).
    const int64_t tiles = (p.n + 15) / 16 * (p.experts != nullptr ? p.problems : 1);
    return p.k % 64 == 0 && !p.scalar && p.m >= kFp8MmaMinRows &&
                   tiles >= 8 * static_cast<int64_t>(CurrentDeviceMultiprocessors())
               ? internal::LaunchFp8MmaGemv(p, stream)
               : LaunchFormat<QuantizedWeight::kFp8Block128>(p, stream);
  }
  if (p.format == QuantizedWeight::kFp4Group32) {
    return internal::Fp4ExpertGemvApplies(p) ? internal::LaunchFp4ExpertGemv(p, stream)
                                              : LaunchFormat<QuantizedWeight::kFp4Group32>(p, stream);
  }
  if (p.format == QuantizedWeight::kBf16) return LaunchFormat<QuantizedWeight::kBf16>(p, stream);
  if (p.format == QuantizedWeight::kFp4Tiled) return internal::LaunchFp4TiledGemv(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace tandem::cuda
