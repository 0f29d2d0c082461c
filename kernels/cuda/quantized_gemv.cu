#include "kernels/cuda/quantized_gemv.h"

#include <cuda_fp8.h>

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 2;  // output rows per warp, so that x's staging is shared more
constexpr int kInFlight = 4;     // 16-byte weight loads per lane before the first use

__device__ __forceinline__ float Fp4Value(uint32_t code) {
  // e2m1: sign, 2 exponent bits, 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
  const uint32_t mag = code & 7u;
  const float v = mag < 2u ? 0.5f * static_cast<float>(mag)
                           : static_cast<float>(2u + (mag & 1u)) * static_cast<float>(1u << ((mag >> 1) - 1u)) * 0.5f;
  return (code & 8u) ? -v : v;
}

// 16 FP8 values of one 16-byte load, dotted with xs[0..16) for each of m rows.
template <int M>
__device__ __forceinline__ void DotFp8(const uint4& wv, const float* xs, int64_t ldx_s, float scale, float* acc) {
  float w[16];
  const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      __nv_fp8_e4m3 v;
      v.__x = static_cast<__nv_fp8_storage_t>((words[q] >> (8 * b)) & 0xffu);
      w[q * 4 + b] = static_cast<float>(v);
    }
  }
#pragma unroll
  for (int r = 0; r < M; ++r) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) s = fmaf(w[i], xs[r * ldx_s + i], s);
    acc[r] = fmaf(s, scale, acc[r]);
  }
}

// 32 FP4 values of one 16-byte load (low nibble first), dotted with xs[0..32).
template <int M>
__device__ __forceinline__ void DotFp4(const uint4& wv, const float* xs, int64_t ldx_s, float scale, float* acc) {
  float w[32];
  const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
#pragma unroll
    for (int b = 0; b < 8; ++b) w[q * 8 + b] = Fp4Value((words[q] >> (4 * b)) & 0xfu);
  }
#pragma unroll
  for (int r = 0; r < M; ++r) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) s = fmaf(w[i], xs[r * ldx_s + i], s);
    acc[r] = fmaf(s, scale, acc[r]);
  }
}

template <int M, QuantizedWeight F>
__global__ void __launch_bounds__(kThreads) QuantizedGemvKernel(QuantizedGemvParams p) {
  extern __shared__ float4 shared_x4[];
  float* xs = reinterpret_cast<float*>(shared_x4);
  constexpr int kValues = F == QuantizedWeight::kFp8Block128 ? 16 : 32;  // weights per 16-byte load
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  internal::GridDependencyWait();
  for (int64_t i = threadIdx.x; i < static_cast<int64_t>(M) * p.k; i += kThreads) {
    xs[i] = p.x[(i / p.k) * p.ldx + i % p.k];
  }
  __syncthreads();
  internal::TriggerDependentLaunch();
  const int64_t row_bytes = F == QuantizedWeight::kFp8Block128 ? p.k : p.k / 2;
  const int64_t scale_cols = (p.k + 127) / 128;
  const int64_t loads = p.k / kValues;  // 16-byte loads per row
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t row = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kRowsPerWarp + rr;
    if (row >= p.n) break;
    const uint4* wrow = reinterpret_cast<const uint4*>(p.w + row * row_bytes);
    float acc[M];
#pragma unroll
    for (int r = 0; r < M; ++r) acc[r] = 0.0f;
    for (int64_t base = lane; base < loads; base += 32 * kInFlight) {
      uint4 wv[kInFlight];
#pragma unroll
      for (int j = 0; j < kInFlight; ++j) {
        const int64_t at = base + j * 32;
        if (at < loads) wv[j] = internal::LoadWeight(wrow + at);
      }
#pragma unroll
      for (int j = 0; j < kInFlight; ++j) {
        const int64_t at = base + j * 32;
        if (at >= loads) break;
        const int64_t c = at * kValues;  // first input column of this load
        if constexpr (F == QuantizedWeight::kFp8Block128) {
          const float scale = p.scales[(row / 128) * scale_cols + c / 128];
          DotFp8<M>(wv[j], xs + c, p.k, scale, acc);
        } else {
          const float scale = p.scales[row * (p.k / 32) + c / 32];
          DotFp4<M>(wv[j], xs + c, p.k, scale, acc);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < M; ++r) {
      float v = acc[r];
#pragma unroll
      for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) p.y[r * p.ldy + row] = v;
    }
  }
}

template <QuantizedWeight F>
cudaError_t LaunchFormat(const QuantizedGemvParams& p, cudaStream_t stream) {
  const size_t shared = static_cast<size_t>(p.m) * static_cast<size_t>(p.k) * sizeof(float);
  const dim3 grid(static_cast<unsigned>((p.n + kWarps * kRowsPerWarp - 1) / (kWarps * kRowsPerWarp)));
  auto launch = [&](auto kernel) -> cudaError_t {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(kQuantizedGemvMaxSharedBytes));
    if (e != cudaSuccess) return e;
    return internal::Launch(kernel, grid, dim3(kThreads), shared, stream, p);
  };
  switch (p.m) {
    case 1: return launch(QuantizedGemvKernel<1, F>);
    case 2: return launch(QuantizedGemvKernel<2, F>);
    case 3: return launch(QuantizedGemvKernel<3, F>);
    case 4: return launch(QuantizedGemvKernel<4, F>);
    case 5: return launch(QuantizedGemvKernel<5, F>);
    case 6: return launch(QuantizedGemvKernel<6, F>);
    case 7: return launch(QuantizedGemvKernel<7, F>);
    default: return launch(QuantizedGemvKernel<8, F>);
  }
}

}  // namespace

cudaError_t QuantizedGemv(const QuantizedGemvParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  const int64_t vec = p.format == QuantizedWeight::kFp8Block128 ? 16 : 32;
  const auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  if (p.w == nullptr || p.scales == nullptr || p.x == nullptr || p.y == nullptr || p.m < 1 ||
      p.m > kQuantizedGemvMaxRows || p.n < 0 || p.n > (int64_t{1} << 30) || p.k <= 0 || p.k % vec != 0 ||
      p.ldx < p.k || p.ldy < p.n || !aligned(p.w) ||
      static_cast<int64_t>(p.m) * p.k * static_cast<int64_t>(sizeof(float)) > kQuantizedGemvMaxSharedBytes) {
    return cudaErrorInvalidValue;
  }
  if (p.format == QuantizedWeight::kFp8Block128) return LaunchFormat<QuantizedWeight::kFp8Block128>(p, stream);
  if (p.format == QuantizedWeight::kFp4Group32) return LaunchFormat<QuantizedWeight::kFp4Group32>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace tandem::cuda
