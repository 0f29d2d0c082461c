#include "kernels/cuda/silu_mul.h"

#include <cstring>

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

// Eight outputs per thread where the layout allows it (the prefill's MoE and dense MLP):
// gate and up each two float4 loads, outputs one float4 pair and/or one 16-byte bf16 store.
// Needs cols % 8 == 0, interleave 0 or a multiple of 8, 16-byte aligned rows (VectorOk).
__global__ void SiluMulVec8Kernel(SiluMulParams p, int units_per_row, int64_t units) {
  internal::WaitAndTrigger();
  const int64_t u = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (u >= units) return;
  const int row = static_cast<int>(u / units_per_row);
  const int i = static_cast<int>(u % units_per_row) * 8;  // first output column
  int gate_idx = i, up_idx = i + static_cast<int>(p.cols);
  if (p.interleave != 0) {
    gate_idx = i / p.interleave * 2 * p.interleave + i % p.interleave;
    up_idx = gate_idx + p.interleave;
  }
  const float* x = p.x + static_cast<int64_t>(row) * p.x_stride;
  const float4 g0 = *reinterpret_cast<const float4*>(x + gate_idx);
  const float4 g1 = *reinterpret_cast<const float4*>(x + gate_idx + 4);
  const float4 u0 = *reinterpret_cast<const float4*>(x + up_idx);
  const float4 u1 = *reinterpret_cast<const float4*>(x + up_idx + 4);
  float v[8] = {internal::SiluMulValue(g0.x, u0.x), internal::SiluMulValue(g0.y, u0.y),
                internal::SiluMulValue(g0.z, u0.z), internal::SiluMulValue(g0.w, u0.w),
                internal::SiluMulValue(g1.x, u1.x), internal::SiluMulValue(g1.y, u1.y),
                internal::SiluMulValue(g1.z, u1.z), internal::SiluMulValue(g1.w, u1.w)};
  const int64_t at = static_cast<int64_t>(row) * p.out_stride + i;
  if (p.out != nullptr) {
    *reinterpret_cast<float4*>(p.out + at) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(p.out + at + 4) = make_float4(v[4], v[5], v[6], v[7]);
  }
  if (p.out_bf16 != nullptr) {
    uint4 packed;
    __nv_bfloat162 b[4];
    for (int k = 0; k < 4; ++k) b[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
    memcpy(&packed, b, sizeof(packed));
    *reinterpret_cast<uint4*>(p.out_bf16 + at) = packed;
  }
}

bool VectorOk(const SiluMulParams& p) {
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  return p.cols % 8 == 0 && (p.interleave == 0 || p.interleave % 8 == 0) && aligned(p.x) && p.x_stride % 4 == 0 &&
         (p.out == nullptr || (aligned(p.out) && p.out_stride % 4 == 0)) &&
         (p.out_bf16 == nullptr || (aligned(p.out_bf16) && p.out_stride % 8 == 0)) && 2 * p.cols <= 0x7fffffff &&
         p.rows * (p.cols / 8) <= 0x7fffffffLL * kThreads;
}

}  // namespace

cudaError_t SiluMul(const SiluMulParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  if (p.x == nullptr || (p.out == nullptr && p.out_bf16 == nullptr) || p.rows < 0 || p.rows > 0x7fffffff ||
      p.cols < 0 || p.x_stride < 2 * p.cols || p.out_stride < p.cols || p.interleave < 0 ||
      (p.interleave > 0 && p.cols % p.interleave != 0)) {
    return cudaErrorInvalidValue;
  }
  if (VectorOk(p)) {
    const int units_per_row = static_cast<int>(p.cols / 8);
    const int64_t units = p.rows * units_per_row;
    return internal::Launch(SiluMulVec8Kernel, dim3(static_cast<unsigned>((units + kThreads - 1) / kThreads)),
                            dim3(kThreads), 0, stream, p, units_per_row, units);
  }
  return internal::Launch(SiluMulKernel, dim3(static_cast<unsigned>(p.rows)), dim3(kThreads), 0, stream, p);
}

}  // namespace tandem::cuda
