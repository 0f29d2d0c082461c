#include "kernels/cuda/hyper_connections.h"

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 128;

// Rounded as the CPU reference computes it (no contraction into an FMA); expf itself is
// within 2 ulp of the host's exp.
__device__ __forceinline__ float SigmoidOf(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }
__device__ __forceinline__ float Affine(float x, float scale, float base) { return __fadd_rn(__fmul_rn(x, scale), base); }

// One thread per token: the weights are n + n + n*n values (24 for V4), and Sinkhorn's
// rounds are sequential. The order of every sum is the CPU reference's. kN > 0 fixes n at
// compile time (V4's 4 streams), so that the matrix lives in registers: with n read at run
// time it sat in local memory and a decode step's mix took ~50 us (measured on an H100).
template <int kN>
__global__ void HyperMixKernel(HyperMixParams p) {
  internal::WaitAndTrigger();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= p.tokens) return;
  const int n = kN > 0 ? kN : p.n;
  const float* mix = p.mix + t * p.mix_stride;
  float* pre = p.pre + t * n;
  if (p.head) {
#pragma unroll
    for (int j = 0; j < n; ++j) pre[j] = __fadd_rn(SigmoidOf(Affine(mix[j], p.scale[0], p.base[j])), p.eps);
    return;
  }
  float* post = p.post + t * n;
#pragma unroll
  for (int j = 0; j < n; ++j) {
    pre[j] = __fadd_rn(SigmoidOf(Affine(mix[j], p.scale[0], p.base[j])), p.eps);
    post[j] = 2.0f * SigmoidOf(Affine(mix[n + j], p.scale[1], p.base[n + j]));
  }
  float c[kMaxHyperStreams * kMaxHyperStreams];
#pragma unroll
  for (int j = 0; j < n; ++j) {
    float* row = c + j * n;
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < n; ++k) {
      row[k] = Affine(mix[2 * n + j * n + k], p.scale[2], p.base[2 * n + j * n + k]);
      m = fmaxf(m, row[k]);
    }
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < n; ++k) {
      row[k] = expf(row[k] - m);
      sum = __fadd_rn(sum, row[k]);
    }
    const float inv = 1.0f / sum;
#pragma unroll
    for (int k = 0; k < n; ++k) row[k] = __fadd_rn(__fmul_rn(row[k], inv), p.eps);
  }
  for (int it = 0; it < p.sinkhorn_iters; ++it) {
    if (it > 0) {
#pragma unroll
      for (int j = 0; j < n; ++j) {
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < n; ++k) sum = __fadd_rn(sum, c[j * n + k]);
        const float denom = __fadd_rn(sum, p.eps);
#pragma unroll
        for (int k = 0; k < n; ++k) c[j * n + k] /= denom;
      }
    }
#pragma unroll
    for (int k = 0; k < n; ++k) {
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < n; ++j) sum = __fadd_rn(sum, c[j * n + k]);
      const float denom = __fadd_rn(sum, p.eps);
#pragma unroll
      for (int j = 0; j < n; ++j) c[j * n + k] /= denom;
    }
  }
  float* comb = p.comb + t * n * n;
#pragma unroll
  for (int i = 0; i < n * n; ++i) comb[i] = c[i];
}

// The same for n = 4 (V4's streams), a warp per token and a lane per matrix entry (lanes
// 16..31 idle): the Sinkhorn rounds' sums are formed in every lane of a row (or column) in
// the CPU's order from its neighbours' values, and the 16 divisions of a round run side by
// side instead of one after another (one thread per token took ~25 us a call on an H100).
__global__ void HyperMixWarpKernel(HyperMixParams p) {
  internal::WaitAndTrigger();
  constexpr int n = 4;
  const int64_t t = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (t >= p.tokens) return;
  const float* mix = p.mix + t * p.mix_stride;
  if (lane < n) {
    p.pre[t * n + lane] = __fadd_rn(SigmoidOf(Affine(mix[lane], p.scale[0], p.base[lane])), p.eps);
    p.post[t * n + lane] = 2.0f * SigmoidOf(Affine(mix[n + lane], p.scale[1], p.base[n + lane]));
  }
  const int j = (lane / n) % n, k = lane % n;  // lanes 16..31 mirror 0..15 and write nothing
  const float v = Affine(mix[2 * n + j * n + k], p.scale[2], p.base[2 * n + j * n + k]);
  auto row_value = [&](float x, int kk) { return __shfl_sync(0xffffffffu, x, (lane & ~(n - 1)) + kk); };
  auto column_value = [&](float x, int jj) { return __shfl_sync(0xffffffffu, x, (lane & 16) + jj * n + k); };
  float m = -INFINITY;
#pragma unroll
  for (int kk = 0; kk < n; ++kk) m = fmaxf(m, row_value(v, kk));
  const float e = expf(v - m);
  float sum = 0.0f;
#pragma unroll
  for (int kk = 0; kk < n; ++kk) sum = __fadd_rn(sum, row_value(e, kk));
  const float inv = 1.0f / sum;
  float c = __fadd_rn(__fmul_rn(e, inv), p.eps);
  for (int it = 0; it < p.sinkhorn_iters; ++it) {
    if (it > 0) {
      float rs = 0.0f;
#pragma unroll
      for (int kk = 0; kk < n; ++kk) rs = __fadd_rn(rs, row_value(c, kk));
      c /= __fadd_rn(rs, p.eps);
    }
    float cs = 0.0f;
#pragma unroll
    for (int jj = 0; jj < n; ++jj) cs = __fadd_rn(cs, column_value(c, jj));
    c /= __fadd_rn(cs, p.eps);
  }
  if (lane < n * n) p.comb[t * n * n + lane] = c;
}

// Grid (channel blocks, tokens): each thread one channel of one token.
__global__ void HyperCollapseKernel(HyperCollapseParams p) {
  internal::WaitAndTrigger();
  const int64_t t = blockIdx.y;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= p.dim) return;
  const float* x = p.streams + t * p.n * p.dim + i;
  const float* pre = p.pre + t * p.n;
  float sum = 0.0f;
  for (int j = 0; j < p.n; ++j) sum = __fadd_rn(sum, __fmul_rn(pre[j], x[j * p.dim]));
  p.out[t * p.out_stride + i] = sum;
}

__global__ void HyperExpandKernel(HyperExpandParams p) {
  internal::WaitAndTrigger();
  const int64_t t = blockIdx.y;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= p.dim) return;
  const int n = p.n;
  float* s = p.streams + t * n * p.dim + i;
  const float* comb = p.comb + t * n * n;
  const float* post = p.post + t * n;
  const float f = p.f[t * p.f_stride + i];
  float x[kMaxHyperStreams];
  for (int j = 0; j < n; ++j) x[j] = s[j * p.dim];
  for (int k = 0; k < n; ++k) {
    float mixed = 0.0f;
    for (int j = 0; j < n; ++j) mixed = __fadd_rn(mixed, __fmul_rn(comb[j * n + k], x[j]));
    s[k * p.dim] = __fadd_rn(__fmul_rn(post[k], f), mixed);
  }
}

bool ChannelGridOk(int64_t tokens, int64_t dim) { return tokens <= 65535 && dim > 0 && dim <= (1LL << 30); }

dim3 ChannelGrid(int64_t tokens, int64_t dim) {
  return dim3(static_cast<unsigned>((dim + kThreads - 1) / kThreads), static_cast<unsigned>(tokens));
}

}  // namespace

cudaError_t HyperMix(const HyperMixParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  const int64_t width = p.head ? p.n : 2 * p.n + p.n * p.n;
  if (p.mix == nullptr || p.base == nullptr || p.scale == nullptr || p.pre == nullptr || p.tokens < 0 ||
      p.n < 1 || p.n > kMaxHyperStreams || p.mix_stride < width ||
      (!p.head && (p.post == nullptr || p.comb == nullptr || p.sinkhorn_iters < 1))) {
    return cudaErrorInvalidValue;
  }
  const int64_t blocks = (p.tokens + kThreads - 1) / kThreads;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  if (p.n == 4 && !p.head) {  // a warp per token
    const int64_t warp_blocks = (p.tokens + kThreads / 32 - 1) / (kThreads / 32);
    if (warp_blocks > 0x7fffffff) return cudaErrorInvalidValue;
    return internal::Launch(HyperMixWarpKernel, dim3(static_cast<unsigned>(warp_blocks)), dim3(kThreads), 0, stream,
                            p);
  }
  return p.n == 4 ? internal::Launch(HyperMixKernel<4>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream, p)
                   : internal::Launch(HyperMixKernel<0>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream, p);
}

cudaError_t HyperCollapse(const HyperCollapseParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  if (p.streams == nullptr || p.pre == nullptr || p.out == nullptr || p.tokens < 0 || p.n < 1 ||
      p.n > kMaxHyperStreams || p.out_stride < p.dim || !ChannelGridOk(p.tokens, p.dim)) {
    return cudaErrorInvalidValue;
  }
  return internal::Launch(HyperCollapseKernel, ChannelGrid(p.tokens, p.dim), dim3(kThreads), 0, stream, p);
}

cudaError_t HyperExpand(const HyperExpandParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  if (p.streams == nullptr || p.post == nullptr || p.comb == nullptr || p.f == nullptr || p.tokens < 0 ||
      p.n < 1 || p.n > kMaxHyperStreams || p.f_stride < p.dim || !ChannelGridOk(p.tokens, p.dim)) {
    return cudaErrorInvalidValue;
  }
  return internal::Launch(HyperExpandKernel, ChannelGrid(p.tokens, p.dim), dim3(kThreads), 0, stream, p);
}

}  // namespace tandem::cuda
