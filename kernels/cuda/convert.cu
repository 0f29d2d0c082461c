#include "kernels/cuda/convert.h"

#include <algorithm>
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

template <typename Src, typename Dst>
cudaError_t LaunchConvert(const ConvertParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  if (p.src == nullptr || p.dst == nullptr || p.rows < 0 || p.cols < 0 || p.src_stride < p.cols ||
      p.dst_stride < p.cols || (p.dst_lo != nullptr && !std::is_same_v<Src, float>)) {
    return cudaErrorInvalidValue;
  }
  const int64_t col_blocks = std::min<int64_t>((p.cols + kThreads - 1) / kThreads, 64);
  const int64_t y = std::min<int64_t>(p.rows, 32768);
  const int64_t z = (p.rows + y - 1) / y;
  if (z > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(y), static_cast<unsigned>(z));
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

__global__ void DequantizeFp8Kernel(DequantizeFp8Params p) {
  const int64_t n = p.rows * p.cols;
  const int64_t scale_cols = (p.cols + 127) / 128;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t r = i / p.cols, c = i % p.cols;
    __nv_fp8_e4m3 q;
    q.__x = p.src[i];
    const float v = static_cast<float>(q) * p.scales[(r / 128) * scale_cols + c / 128];
    p.dst[i] = __float2bfloat16_rn(v);
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
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  if (p.src == nullptr || p.scales == nullptr || p.dst == nullptr || p.rows < 0 || p.cols < 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t blocks = std::min<int64_t>((p.rows * p.cols + kThreads - 1) / kThreads, 65536);
  DequantizeFp8Kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
