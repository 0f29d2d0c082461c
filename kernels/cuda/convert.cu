#include "kernels/cuda/convert.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include <cuda_fp8.h>

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

template <typename Src, typename Dst>
__device__ __forceinline__ Dst ConvertValue(Src v);
template <>
__device__ __forceinline__ __nv_bfloat16 ConvertValue<float, __nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ float ConvertValue<__nv_bfloat16, float>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

// Grid: x covers columns, y (and z for many rows) rows.
template <typename Src, typename Dst>
__global__ void ConvertKernel(ConvertParams p) {
  internal::WaitAndTrigger();
  const int64_t row = static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y;
  if (row >= p.rows) return;
  const Src* src = static_cast<const Src*>(p.src) + row * p.src_stride;
  Dst* dst = static_cast<Dst*>(p.dst) + row * p.dst_stride;
  Dst* lo = p.dst_lo != nullptr ? static_cast<Dst*>(p.dst_lo) + row * p.dst_stride : nullptr;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; c < p.cols;
       c += static_cast<int64_t>(gridDim.x) * kThreads) {
    const Dst v = ConvertValue<Src, Dst>(src[c]);
    dst[c] = v;
    if constexpr (std::is_same_v<Src, float>) {
      if (lo != nullptr) lo[c] = ConvertValue<Src, Dst>(src[c] - __bfloat162float(v));
    }
  }
}

// float -> bf16 four values a thread (a float4 load, 8-byte stores) where rows are
// 16-byte aligned (Vec4Ok); the same values as ConvertKernel.
__global__ void ConvertF32ToBf16Vec4Kernel(ConvertParams p) {
  internal::WaitAndTrigger();
  const int64_t row = static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y;
  if (row >= p.rows) return;
  const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(p.src) + row * p.src_stride);
  uint2* dst = reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(p.dst) + row * p.dst_stride);
  uint2* lo = p.dst_lo != nullptr
                  ? reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(p.dst_lo) + row * p.dst_stride)
                  : nullptr;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; c < p.cols / 4;
       c += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float4 v = src[c];
    const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    uint2 out;
    memcpy(&out.x, &a, 4);
    memcpy(&out.y, &b, 4);
    dst[c] = out;
    if (lo != nullptr) {
      const __nv_bfloat162 la = __floats2bfloat162_rn(v.x - __low2float(a), v.y - __high2float(a));
      const __nv_bfloat162 lb = __floats2bfloat162_rn(v.z - __low2float(b), v.w - __high2float(b));
      memcpy(&out.x, &la, 4);
      memcpy(&out.y, &lb, 4);
      lo[c] = out;
    }
  }
}

bool Vec4Ok(const ConvertParams& p) {
  auto aligned = [](const void* ptr, size_t n) { return ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % n == 0; };
  return p.cols % 4 == 0 && p.src_stride % 4 == 0 && p.dst_stride % 4 == 0 && aligned(p.src, 16) &&
         aligned(p.dst, 8) && aligned(p.dst_lo, 8);
}

template <typename Src, typename Dst>
cudaError_t LaunchConvert(const ConvertParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  if (p.src == nullptr || p.dst == nullptr || p.rows < 0 || p.cols < 0 || p.src_stride < p.cols ||
      p.dst_stride < p.cols || (p.dst_lo != nullptr && !std::is_same_v<Src, float>)) {
    return cudaErrorInvalidValue;
  }
  constexpr bool kToBf16 = std::is_same_v<Src, float> && std::is_same_v<Dst, __nv_bfloat16>;
  const bool vec4 = kToBf16 && Vec4Ok(p);
  const int64_t per_thread = vec4 ? 4 : 1;
  const int64_t col_blocks = std::min<int64_t>((p.cols / per_thread + kThreads - 1) / kThreads, 64);
  const int64_t y = std::min<int64_t>(p.rows, 32768);
  const int64_t z = (p.rows + y - 1) / y;
  if (z > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(y), static_cast<unsigned>(z));
  if (vec4) return internal::Launch(ConvertF32ToBf16Vec4Kernel, grid, dim3(kThreads), 0, stream, p);
  return internal::Launch(ConvertKernel<Src, Dst>, grid, dim3(kThreads), 0, stream, p);
}

// Grid: x covers 4-byte words of a row, y rows.
__global__ void ZeroRowsKernel(ZeroRowsParams p) {
  internal::WaitAndTrigger();
  char* row = static_cast<char*>(p.dst) + static_cast<int64_t>(blockIdx.y) * p.pitch_bytes;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < p.row_bytes / 4;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    reinterpret_cast<uint32_t*>(row)[i] = 0u;
  }
}

template <typename P>
__global__ void DequantizeFp8Kernel(P p) {
  internal::WaitAndTrigger();
  const int64_t n = p.rows * p.cols;
  const int64_t scale_cols = (p.cols + 127) / 128;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t r = i / p.cols, c = i % p.cols;
    __nv_fp8_e4m3 q;
    q.__x = p.src[i];
    const float v = static_cast<float>(q) * p.scales[(r / 128) * scale_cols + c / 128];
    if constexpr (std::is_same_v<P, DequantizeFp8Params>) {
      p.dst[i] = __float2bfloat16_rn(v);
    } else {
      p.dst[i] = v;
    }
  }
}

// One thread per byte (two values).
__global__ void DequantizeFp4Kernel(DequantizeFp4ToF32Params p) {
  internal::WaitAndTrigger();
  constexpr float kValues[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const int64_t n = p.rows * p.cols / 2;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t first = 2 * i;  // element index of the low nibble
    const float scale = p.scales[first / 32];  // rows are whole groups: [r][c / 32] = (r * cols + c) / 32
    const uint8_t byte = p.src[i];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint8_t code = static_cast<uint8_t>((byte >> (4 * h)) & 0xf);
      const float v = kValues[code & 7] * scale;
      p.dst[first + h] = (code & 8) != 0 ? -v : v;
    }
  }
}

template <typename P>
cudaError_t LaunchDequantizeFp8(const P& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  if (p.src == nullptr || p.scales == nullptr || p.dst == nullptr || p.rows < 0 || p.cols < 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t blocks = std::min<int64_t>((p.rows * p.cols + kThreads - 1) / kThreads, 65536);
  return internal::Launch(DequantizeFp8Kernel<P>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream, p);
}

// One block per 128x128 block of the matrix: the block's absolute maximum, then its codes.
__global__ void QuantizeFp8Kernel(QuantizeFp8Params p) {
  __shared__ float warp_max[kThreads / 32];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * 128, c0 = static_cast<int64_t>(blockIdx.x) * 128;
  const int64_t rows = p.rows - r0 < 128 ? p.rows - r0 : 128, cols = p.cols - c0 < 128 ? p.cols - c0 : 128;
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < rows * cols; i += kThreads) {
    amax = fmaxf(amax, fabsf(p.src[(r0 + i / cols) * p.cols + c0 + i % cols]));
  }
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
  const float scale = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
  if (threadIdx.x == 0) p.scales[static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x] = scale;
  for (int64_t i = threadIdx.x; i < rows * cols; i += kThreads) {
    const int64_t at = (r0 + i / cols) * p.cols + c0 + i % cols;
    p.codes[at] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fdiv_rn(p.src[at], scale), __NV_SATFINITE, __NV_E4M3));
  }
}

__global__ void ExpandRowScalesKernel(ExpandRowScalesParams p) {
  const int64_t total = p.groups * p.rows * p.cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t c = i % p.cols, r = (i / p.cols) % p.rows, g = i / (p.cols * p.rows);
    int64_t o = r;
    if (p.gate_up_interleaved) {
      const int64_t block = r / 16, at = r % 16;
      o = at < 8 ? block * 8 + at : p.rows / 2 + block * 8 + (at - 8);
    }
    const int64_t src_rows = (p.rows + 127) / 128;
    p.dst[i] = p.src[(g * src_rows + o / 128) * p.cols + c];
  }
}

}  // namespace

cudaError_t ConvertF32ToBf16(const ConvertParams& p, cudaStream_t stream) {
  return LaunchConvert<float, __nv_bfloat16>(p, stream);
}

cudaError_t ConvertBf16ToF32(const ConvertParams& p, cudaStream_t stream) {
  return LaunchConvert<__nv_bfloat16, float>(p, stream);
}

cudaError_t ZeroRows(const ZeroRowsParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.row_bytes == 0) return cudaSuccess;
  if (p.dst == nullptr || p.rows < 0 || p.rows > 65535 || p.row_bytes < 0 || p.row_bytes % 4 != 0 ||
      p.pitch_bytes % 4 != 0 || p.pitch_bytes < p.row_bytes || reinterpret_cast<uintptr_t>(p.dst) % 4 != 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t x = std::min<int64_t>((p.row_bytes / 4 + kThreads - 1) / kThreads, 64);
  return internal::Launch(ZeroRowsKernel, dim3(static_cast<unsigned>(x), static_cast<unsigned>(p.rows)),
                          dim3(kThreads), 0, stream, p);
}

cudaError_t DequantizeFp8ToBf16(const DequantizeFp8Params& p, cudaStream_t stream) {
  return LaunchDequantizeFp8(p, stream);
}

cudaError_t DequantizeFp8ToF32(const DequantizeFp8ToF32Params& p, cudaStream_t stream) {
  return LaunchDequantizeFp8(p, stream);
}

cudaError_t DequantizeFp4ToF32(const DequantizeFp4ToF32Params& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  if (p.src == nullptr || p.scales == nullptr || p.dst == nullptr || p.rows < 0 || p.cols < 0 || p.cols % 32 != 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t blocks = std::min<int64_t>((p.rows * p.cols / 2 + kThreads - 1) / kThreads, 65536);
  return internal::Launch(DequantizeFp4Kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream, p);
}

cudaError_t QuantizeFp8Block(const QuantizeFp8Params& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  if (p.src == nullptr || p.codes == nullptr || p.scales == nullptr || p.rows < 0 || p.cols < 0 ||
      (p.rows + 127) / 128 > 65535) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>((p.cols + 127) / 128), static_cast<unsigned>((p.rows + 127) / 128));
  QuantizeFp8Kernel<<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t ExpandRowScales(const ExpandRowScalesParams& p, cudaStream_t stream) {
  if (p.groups == 0 || p.rows == 0 || p.cols == 0) return cudaSuccess;
  if (p.src == nullptr || p.dst == nullptr || p.groups < 0 || p.rows < 0 || p.cols < 0 ||
      (p.gate_up_interleaved && (p.rows % 16 != 0 || (p.rows / 2) % 128 != 0))) {
    return cudaErrorInvalidValue;
  }
  const int64_t blocks = std::min<int64_t>((p.groups * p.rows * p.cols + kThreads - 1) / kThreads, 65536);
  ExpandRowScalesKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
