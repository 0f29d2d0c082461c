#include "kernels/cuda/random_init.h"

#include <algorithm>

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ float NormalSample(uint64_t key, uint64_t i) {
  const uint64_t r = SplitMix64(key ^ SplitMix64(i));
  float sum = 0.0f;
  for (int j = 0; j < 4; ++j) sum = __fadd_rn(sum, __fmul_rn(static_cast<float>((r >> (16 * j)) & 0xffff), 1.0f / 65536.0f));
  return __fmul_rn(__fsub_rn(sum, 2.0f), 1.7320508f);
}

__device__ __forceinline__ float UniformSample(uint64_t key, uint64_t i) {
  const uint64_t r = SplitMix64(key ^ SplitMix64(i));
  return __fsub_rn(__fmul_rn(static_cast<float>(r >> 40), 2.0f / 16777216.0f), 1.0f);
}

__global__ void RandomInitKernel(RandomInitParams p) {
  const float root = __fsqrt_rn(static_cast<float>(p.fan_in));
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < p.n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    float v;
    switch (p.init) {
      case RandomInit::kLinear: v = __fdiv_rn(NormalSample(p.key, i), root); break;
      case RandomInit::kEmbedding: v = NormalSample(p.key, i); break;
      case RandomInit::kNorm: v = __fadd_rn(1.0f, __fmul_rn(0.25f, UniformSample(p.key, i))); break;
      default: v = __fmul_rn(0.1f, UniformSample(p.key, i)); break;
    }
    if (p.scale != 1.0f) v = __fmul_rn(v, p.scale);
    if (p.out_bf16 != nullptr) {
      p.out_bf16[i] = __float2bfloat16_rn(v);
    } else {
      p.out_f32[i] = p.round_to_bf16 ? __bfloat162float(__float2bfloat16_rn(v)) : v;
    }
  }
}

}  // namespace

cudaError_t RandomInitFill(const RandomInitParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  if ((p.out_bf16 == nullptr) == (p.out_f32 == nullptr) || p.n < 0 || p.fan_in <= 0) return cudaErrorInvalidValue;
  const int64_t blocks = std::min<int64_t>((p.n + kThreads - 1) / kThreads, 132 * 64);
  RandomInitKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
