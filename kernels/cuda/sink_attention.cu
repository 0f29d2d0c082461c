#include "kernels/cuda/sink_attention.h"

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float BlockMax(float v, float* red) {
  v = internal::WarpMax(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float m = red[0];
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, red[w]);
  return m;
}

// Grid (heads, tokens). Shared: the scores [max_keys], then the reduction scratch.
__global__ void SinkAttentionKernel(SinkAttentionParams p) {
  extern __shared__ float smem[];
  internal::WaitAndTrigger();
  const int h = blockIdx.x;
  const int64_t t = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* scores = smem;
  float* red = smem + p.max_keys;
  const int d = p.head_dim;
  const float* q = p.q + (t * p.heads + h) * d;
  float* out = p.out + (t * p.heads + h) * d;
  const int n = p.num_keys[t];
  const float* const* keys = p.keys + t * p.max_keys;
  bool bad = n < 0 || n > p.max_keys;
  for (int j = threadIdx.x; !bad && j < n; j += kThreads) {
    bad = keys[j] == nullptr || reinterpret_cast<uintptr_t>(keys[j]) % 16 != 0;  // float4 loads below
  }
  if (__syncthreads_or(bad)) {
    for (int i = threadIdx.x; i < d; i += kThreads) out[i] = 0.0f;
    if (threadIdx.x == 0 && p.bad_input != nullptr) atomicExch(p.bad_input, 1);
    return;
  }
  // Scores: a warp per key, lanes over the channels.
  for (int j = warp; j < n; j += kWarps) {
    const float* k = keys[j];
    float s = 0.0f;
    for (int i = lane * 4; i < d; i += 128) {
      const float4 a = *reinterpret_cast<const float4*>(q + i);
      const float4 b = *reinterpret_cast<const float4*>(k + i);
      s = fmaf(a.x, b.x, s);
      s = fmaf(a.y, b.y, s);
      s = fmaf(a.z, b.z, s);
      s = fmaf(a.w, b.w, s);
    }
    s = internal::WarpSum(s);
    if (lane == 0) scores[j] = s * p.scale;
  }
  __syncthreads();
  const float sink = p.sinks[h];
  float m = sink;
  for (int j = threadIdx.x; j < n; j += kThreads) m = fmaxf(m, scores[j]);
  m = BlockMax(m, red);
  __syncthreads();
  for (int j = threadIdx.x; j < n; j += kThreads) scores[j] = expf(scores[j] - m);
  __syncthreads();
  // The denominator in list order (one thread: n is at most a few thousand), the sink first
  // as on the CPU.
  if (threadIdx.x == 0) {
    float sum = expf(sink - m);
    for (int j = 0; j < n; ++j) sum += scores[j];
    red[kWarps] = sum;
  }
  __syncthreads();
  // Each weight divided by the sum, as AttendWithSink's Axpy(e_j / sum) (a multiply by
  // 1 / sum would round differently).
  const float sum = red[kWarps];
  for (int j = threadIdx.x; j < n; j += kThreads) scores[j] = __fdiv_rn(scores[j], sum);
  __syncthreads();
  // Each channel sums its keys in list order, one fma per key as the CPU's Axpy.
  for (int i = threadIdx.x; i < d; i += kThreads) {
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) acc = fmaf(scores[j], keys[j][i], acc);
    out[i] = acc;
  }
}

}  // namespace

cudaError_t SinkAttention(const SinkAttentionParams& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.heads == 0) return cudaSuccess;
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  if (p.q == nullptr || p.keys == nullptr || p.num_keys == nullptr || p.sinks == nullptr || p.out == nullptr ||
      p.tokens < 0 || p.tokens > 65535 || p.heads < 0 || p.head_dim <= 0 || p.head_dim % 4 != 0 ||
      p.head_dim > 1024 || p.max_keys < 0 || p.max_keys > kMaxSinkAttentionKeys || !aligned(p.q)) {
    return cudaErrorInvalidValue;
  }
  const size_t smem = (static_cast<size_t>(p.max_keys) + kWarps + 1) * sizeof(float);
  if (smem > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(SinkAttentionKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  return internal::Launch(SinkAttentionKernel, dim3(static_cast<unsigned>(p.heads), static_cast<unsigned>(p.tokens)),
                          dim3(kThreads), smem, stream, p);
}

}  // namespace tandem::cuda
