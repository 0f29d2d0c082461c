#include "kernels/cuda/silu_mul.h"

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void SiluMulKernel(SiluMulParams p) {
  internal::WaitAndTrigger();
  const int64_t row = blockIdx.x;
  const float* x = p.x + row * p.x_stride;
  for (int64_t i = threadIdx.x; i < p.cols; i += kThreads) {
    int64_t gate_idx, up_idx;
    if (p.interleave == 0) {
      gate_idx = i;
      up_idx = i + p.cols;
    } else {
      const int64_t block = i / p.interleave, within = i % p.interleave;
      gate_idx = block * 2 * p.interleave + within;
      up_idx = gate_idx + p.interleave;
    }
    const float v = internal::SiluMulValue(x[gate_idx], x[up_idx]);
    if (p.out != nullptr) p.out[row * p.out_stride + i] = v;
    if (p.out_bf16 != nullptr) p.out_bf16[row * p.out_stride + i] = __float2bfloat16_rn(v);
  }
}

}  // namespace

cudaError_t SiluMul(const SiluMulParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  if (p.x == nullptr || (p.out == nullptr && p.out_bf16 == nullptr) || p.rows < 0 || p.rows > 0x7fffffff ||
      p.cols < 0 || p.x_stride < 2 * p.cols || p.out_stride < p.cols || p.interleave < 0 ||
      (p.interleave > 0 && p.cols % p.interleave != 0)) {
    return cudaErrorInvalidValue;
  }
  return internal::Launch(SiluMulKernel, dim3(static_cast<unsigned>(p.rows)), dim3(kThreads), 0, stream, p);
}

}  // namespace tandem::cuda
