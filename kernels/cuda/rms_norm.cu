#include "kernels/cuda/rms_norm.h"

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row. delta (optional) is added into x first; x is read from row
// in_row and the sum written back there when delta is set.
__global__ void RmsNormKernel(const float* x_in, float* x_out, const float* delta, int64_t delta_stride,
                              const int32_t* row_index, const float* weight, float* out,
                              __nv_bfloat16* out_bf16, __nv_bfloat16* out_lo, int64_t dim, int64_t x_stride,
                              int64_t out_stride, float eps) {
  __shared__ float scratch[kThreads / 32];
  internal::WaitAndTrigger();
  const int64_t row = blockIdx.x;
  const int64_t in_row = row_index != nullptr ? row_index[row] : row;
  const float* x = x_in + in_row * x_stride;
  float sum = 0.0f;
  if (delta != nullptr) {
    const float* d = delta + row * delta_stride;
    float* xo = x_out + in_row * x_stride;
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
      const float v = x[i] + d[i];
      xo[i] = v;
      sum += v * v;
    }
  } else {
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) sum += x[i] * x[i];
  }
  // Each thread re-reads only the elements it wrote itself: no barrier needed for x.
  sum = internal::BlockSum<kThreads>(sum, scratch);
  const float inv = rsqrtf(sum / static_cast<float>(dim) + eps);
  const float* xr = delta != nullptr ? x_out + in_row * x_stride : x;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    const float v = weight[i] * (xr[i] * inv);
    if (out != nullptr) out[row * out_stride + i] = v;
    if (out_bf16 != nullptr) {
      const __nv_bfloat16 hi = __float2bfloat16_rn(v);
      out_bf16[row * out_stride + i] = hi;
      if (out_lo != nullptr) out_lo[row * out_stride + i] = __float2bfloat16_rn(v - __bfloat162float(hi));
    }
  }
}

}  // namespace

cudaError_t RmsNorm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.x == nullptr || p.weight == nullptr || (p.out == nullptr && p.out_bf16 == nullptr) ||
      (p.out_bf16_lo != nullptr && p.out_bf16 == nullptr) || p.dim <= 0 ||
      p.x_stride < p.dim || p.out_stride < p.dim || p.rows < 0 || p.rows > 0x7fffffff) {
    return cudaErrorInvalidValue;
  }
  return internal::Launch(RmsNormKernel, dim3(static_cast<unsigned>(p.rows)), dim3(kThreads), 0, stream, p.x,
                          static_cast<float*>(nullptr), static_cast<const float*>(nullptr), int64_t{0}, p.row_index,
                          p.weight, p.out, p.out_bf16, p.out_bf16_lo, p.dim, p.x_stride, p.out_stride, p.eps);
}

cudaError_t AddRmsNorm(const AddRmsNormParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.x == nullptr || p.delta == nullptr || p.weight == nullptr || (p.out == nullptr && p.out_bf16 == nullptr) ||
      (p.out_bf16_lo != nullptr && p.out_bf16 == nullptr) ||
      p.dim <= 0 || p.x_stride < p.dim || p.delta_stride < p.dim || p.out_stride < p.dim || p.rows < 0 ||
      p.rows > 0x7fffffff) {
    return cudaErrorInvalidValue;
  }
  return internal::Launch(RmsNormKernel, dim3(static_cast<unsigned>(p.rows)), dim3(kThreads), 0, stream,
                          static_cast<const float*>(p.x), p.x, p.delta, p.delta_stride,
                          static_cast<const int32_t*>(nullptr), p.weight, p.out, p.out_bf16, p.out_bf16_lo, p.dim,
                          p.x_stride, p.out_stride, p.eps);
}

}  // namespace tandem::cuda
