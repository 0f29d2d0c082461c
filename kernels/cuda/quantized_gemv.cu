#include "kernels/cuda/quantized_gemv.h"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 2;  // output rows per warp, so that x's staging is shared more
constexpr int kInFlight = 4;     // 16-byte weight loads per lane before the first use

// x is staged transposed per load: value i of load q of row r at xs[r * k + i * loads + q],
// so that the lanes of a warp, which take consecutive loads, read consecutive words
// (no shared-memory bank conflicts).

// 16 FP8 values of one 16-byte load (two a time through the hardware's e4m3x2 -> f16x2).
__device__ __forceinline__ void WidenFp8(const uint4& wv, float* w) {
  const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __half2_raw raw =
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(words[q] >> (16 * h)), __NV_E4M3);
      const float2 f = __half22float2(__half2(raw));
      w[q * 4 + h * 2] = f.x;
      w[q * 4 + h * 2 + 1] = f.y;
    }
  }
}

// 32 FP4 e2m1 values of one 16-byte load, low nibble first. Each magnitude's f16 high byte
// (0, 0.5, 1, 1.5, 2, 3, 4, 6: 00 38 3c 3e 40 42 44 46, low bytes zero) is looked up four
// codes at a time with one byte permute; the sign bits move into place with shifts.
__device__ __forceinline__ void WidenFp4(const uint4& wv, float* w) {
  constexpr uint32_t kLo = 0x3e3c3800u, kHi = 0x46444240u;
  const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t codes = words[q] >> (16 * h);  // four codes in the low 16 bits
      const uint32_t bytes = __byte_perm(kLo, kHi, codes & 0x7777u);
      const uint32_t h01 = __byte_perm(bytes, 0u, 0x1404u) | ((codes << 12) & 0x8000u) | ((codes << 24) & 0x80000000u);
      const uint32_t h23 = __byte_perm(bytes, 0u, 0x3424u) | ((codes << 4) & 0x8000u) | ((codes << 16) & 0x80000000u);
      __half2_raw r01, r23;
      r01.x = static_cast<unsigned short>(h01 & 0xffffu);
      r01.y = static_cast<unsigned short>(h01 >> 16);
      r23.x = static_cast<unsigned short>(h23 & 0xffffu);
      r23.y = static_cast<unsigned short>(h23 >> 16);
      const float2 a = __half22float2(__half2(r01)), b = __half22float2(__half2(r23));
      float* o = w + q * 8 + h * 4;
      o[0] = a.x;
      o[1] = a.y;
      o[2] = b.x;
      o[3] = b.y;
    }
  }
}

// The V weights of one load dotted with x's values of that load for each of M rows.
template <int M, int V>
__device__ __forceinline__ void Dot(const float* w, const float* xs, int64_t k, int64_t loads, int64_t q, float scale,
                                    float* acc) {
#pragma unroll
  for (int r = 0; r < M; ++r) {
    const float* x = xs + r * k + q;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < V; ++i) s = fmaf(w[i], x[i * loads], s);
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
  const int64_t loads = p.k / kValues;  // 16-byte loads per row
  for (int64_t i = threadIdx.x; i < static_cast<int64_t>(M) * p.k; i += kThreads) {
    const int64_t r = i / p.k, c = i % p.k;
    xs[r * p.k + (c % kValues) * loads + c / kValues] = p.x[r * p.ldx + c];
  }
  __syncthreads();
  internal::TriggerDependentLaunch();
  const int64_t row_bytes = F == QuantizedWeight::kFp8Block128 ? p.k : p.k / 2;
  const int64_t scale_cols = (p.k + 127) / 128;
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
        float w[kValues];
        float scale;
        if constexpr (F == QuantizedWeight::kFp8Block128) {
          scale = p.scales[(row / 128) * scale_cols + c / 128];
          WidenFp8(wv[j], w);
        } else {
          scale = p.scales[row * (p.k / 32) + c / 32];
          WidenFp4(wv[j], w);
        }
        Dot<M, kValues>(w, xs, p.k, loads, at, scale, acc);
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

// The kernel for M rows, its shared-memory limit raised once (not on every launch).
template <int M, QuantizedWeight F>
cudaError_t LaunchRows(const QuantizedGemvParams& p, dim3 grid, size_t shared, cudaStream_t stream) {
  static const cudaError_t raised = cudaFuncSetAttribute(
      QuantizedGemvKernel<M, F>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kQuantizedGemvMaxSharedBytes));
  if (raised != cudaSuccess) return raised;
  return internal::Launch(QuantizedGemvKernel<M, F>, grid, dim3(kThreads), shared, stream, p);
}

template <QuantizedWeight F>
cudaError_t LaunchFormat(const QuantizedGemvParams& p, cudaStream_t stream) {
  const size_t shared = static_cast<size_t>(p.m) * static_cast<size_t>(p.k) * sizeof(float);
  const dim3 grid(static_cast<unsigned>((p.n + kWarps * kRowsPerWarp - 1) / (kWarps * kRowsPerWarp)));
  switch (p.m) {
    case 1: return LaunchRows<1, F>(p, grid, shared, stream);
    case 2: return LaunchRows<2, F>(p, grid, shared, stream);
    case 3: return LaunchRows<3, F>(p, grid, shared, stream);
    case 4: return LaunchRows<4, F>(p, grid, shared, stream);
    case 5: return LaunchRows<5, F>(p, grid, shared, stream);
    case 6: return LaunchRows<6, F>(p, grid, shared, stream);
    case 7: return LaunchRows<7, F>(p, grid, shared, stream);
    default: return LaunchRows<8, F>(p, grid, shared, stream);
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
