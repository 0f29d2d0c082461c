#include "kernels/cuda/invariant_gemm.h"

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kTile = 64;     // output rows and columns per block
constexpr int kStepK = 16;    // k per shared-memory step
constexpr int kThreads = 256; // 16 x 16 threads, 4 x 4 outputs each

__device__ __forceinline__ float Load(const void* base, bool bf16, int64_t index) {
  if (bf16) return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
  return static_cast<const float*>(base)[index];
}

__global__ void __launch_bounds__(kThreads) InvariantGemmKernel(InvariantGemmParams p) {
  __shared__ float as[kStepK][kTile + 1];
  __shared__ float bs[kStepK][kTile + 1];
  internal::WaitAndTrigger();
  const int batch = blockIdx.z;
  const int i0 = blockIdx.y * kTile, j0 = blockIdx.x * kTile;
  const int tid = threadIdx.x, ti = tid / 16, tj = tid % 16;
  const char* a = static_cast<const char*>(p.a) + batch * p.a_batch * (p.a_bf16 ? 2 : 4);
  const char* b = static_cast<const char*>(p.b) + batch * p.b_batch * (p.b_bf16 ? 2 : 4);
  float acc[4][4] = {};
  for (int k0 = 0; k0 < p.k; k0 += kStepK) {
    // 64 x 16 values of A and of B, 4 per thread; B's threads walk its unit stride.
    for (int e = tid; e < kTile * kStepK; e += kThreads) {
      const int r = e / kStepK, kk = e % kStepK;
      const int i = i0 + r, k = k0 + kk;
      as[kk][r] = i < p.m && k < p.k ? Load(a, p.a_bf16, static_cast<int64_t>(i) * p.lda + k) : 0.0f;
      const bool k_fast = p.ldb_k == 1;
      const int bj = k_fast ? r : e % kTile, bk = k_fast ? kk : e / kTile;
      const int j = j0 + bj, kb = k0 + bk;
      bs[bk][bj] = j < p.n && kb < p.k ? Load(b, p.b_bf16, static_cast<int64_t>(j) * p.ldb_n + kb * p.ldb_k) : 0.0f;
    }
    __syncthreads();
    const int steps = min(kStepK, p.k - k0);  // past k: no multiply-add at all (not + 0 * 0)
    for (int kk = 0; kk < steps; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        av[x] = as[kk][ti + 16 * x];
        bv[x] = bs[kk][tj + 16 * x];
      }
#pragma unroll
      for (int x = 0; x < 4; ++x) {
#pragma unroll
        for (int y = 0; y < 4; ++y) acc[x][y] = fmaf(av[x], bv[y], acc[x][y]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int x = 0; x < 4; ++x) {
    const int i = i0 + ti + 16 * x;
    if (i >= p.m) continue;
#pragma unroll
    for (int y = 0; y < 4; ++y) {
      const int j = j0 + tj + 16 * y;
      if (j >= p.n) continue;
      const int64_t at = batch * p.c_batch + static_cast<int64_t>(i) * p.ldc + j;
      if (p.c_bf16) {
        static_cast<__nv_bfloat16*>(p.c)[at] = __float2bfloat16_rn(acc[x][y]);
      } else if (p.accumulate) {
        static_cast<float*>(p.c)[at] += acc[x][y];
      } else {
        static_cast<float*>(p.c)[at] = acc[x][y];
      }
    }
  }
}

}  // namespace

cudaError_t InvariantGemm(const InvariantGemmParams& p, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0 || p.batch == 0) return cudaSuccess;
  if (p.a == nullptr || p.b == nullptr || p.c == nullptr || p.m < 0 || p.n < 0 || p.k <= 0 || p.batch < 0 ||
      p.batch > 65535 || (p.c_bf16 && p.accumulate) || (p.m + kTile - 1) / kTile > 65535) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid((p.n + kTile - 1) / kTile, (p.m + kTile - 1) / kTile, p.batch);
  return internal::Launch(InvariantGemmKernel, grid, dim3(kThreads), 0, stream, p);
}

}  // namespace tandem::cuda
