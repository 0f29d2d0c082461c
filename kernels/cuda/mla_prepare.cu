#include "kernels/cuda/mla_prepare.h"

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) MlaPrepareKernel(MlaPrepareParams p) {
  __shared__ float cos_s[128], sin_s[128];
  __shared__ float scratch[kThreads / 32];
  const int64_t t = blockIdx.x;
  const int half = p.rope_dim / 2;
  const int64_t position = p.positions[t];
  for (int i = threadIdx.x; i < half; i += kThreads) {
    internal::RopeCosSin(position, p.inv_freq[i], p.attention_factor, &cos_s[i], &sin_s[i]);
  }

  // Latent: RMSNorm, then into the cache with the rotated key.
  const float* kv = p.kv + t * p.kv_stride;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < p.kv_lora_rank; i += kThreads) sum += kv[i] * kv[i];
  sum = internal::BlockSum<kThreads>(sum, scratch);  // also orders the cos/sin writes
  const int64_t slot = p.slots[t];
  if (slot >= 0 && slot < p.num_slots) {
    const float inv = rsqrtf(sum / static_cast<float>(p.kv_lora_rank) + p.kv_norm_eps);
    __nv_bfloat16* entry = p.kv_cache + slot * (p.kv_lora_rank + p.rope_dim);
    for (int i = threadIdx.x; i < p.kv_lora_rank; i += kThreads) {
      entry[i] = __float2bfloat16_rn(p.kv_norm_weight[i] * (kv[i] * inv));
    }
    const float* k_rope = kv + p.kv_lora_rank;
    for (int i = threadIdx.x; i < half; i += kThreads) {
      const int2 idx = internal::RopePair(i, half, p.interleaved);
      const float x0 = k_rope[idx.x], x1 = k_rope[idx.y];
      entry[p.kv_lora_rank + idx.x] = __float2bfloat16_rn(x0 * cos_s[i] - x1 * sin_s[i]);
      entry[p.kv_lora_rank + idx.y] = __float2bfloat16_rn(x1 * cos_s[i] + x0 * sin_s[i]);
    }
  }

  // Queries: nope parts converted, rope parts rotated and converted.
  const int head_dim = p.nope_dim + p.rope_dim;
  const float* q = p.q + t * p.q_stride;
  __nv_bfloat16* q_out = p.q_out + t * p.q_out_stride;
  const bool rope_out = p.q_rope_out != nullptr && t < p.q_rope_out_rows;
  const int per_head = p.nope_dim + half;  // jobs: nope values, then rotary pairs
  for (int job = threadIdx.x; job < p.num_heads * per_head; job += kThreads) {
    const int h = job / per_head, j = job % per_head;
    const float* qh = q + h * head_dim;
    __nv_bfloat16* oh = q_out + h * head_dim;
    if (j < p.nope_dim) {
      oh[j] = __float2bfloat16_rn(qh[j]);
      continue;
    }
    const int i = j - p.nope_dim;
    const int2 idx = internal::RopePair(i, half, p.interleaved);
    const float x0 = qh[p.nope_dim + idx.x], x1 = qh[p.nope_dim + idx.y];
    const __nv_bfloat16 y0 = __float2bfloat16_rn(x0 * cos_s[i] - x1 * sin_s[i]);
    const __nv_bfloat16 y1 = __float2bfloat16_rn(x1 * cos_s[i] + x0 * sin_s[i]);
    oh[p.nope_dim + idx.x] = y0;
    oh[p.nope_dim + idx.y] = y1;
    if (rope_out) {
      __nv_bfloat16* r = p.q_rope_out + t * p.q_rope_out_stride + h * p.q_rope_out_head_stride;
      r[idx.x] = y0;
      r[idx.y] = y1;
    }
  }
}

}  // namespace

cudaError_t MlaPrepare(const MlaPrepareParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  if (p.positions == nullptr || p.slots == nullptr || p.q == nullptr || p.q_out == nullptr || p.kv == nullptr ||
      p.kv_norm_weight == nullptr || p.kv_cache == nullptr || p.inv_freq == nullptr || p.num_tokens < 0 ||
      p.num_tokens > 0x7fffffff || p.num_heads <= 0 || p.nope_dim < 0 || p.rope_dim <= 0 || p.rope_dim % 2 != 0 ||
      p.rope_dim > 256 || p.kv_lora_rank <= 0 || p.q_stride < p.num_heads * (p.nope_dim + p.rope_dim) ||
      p.q_out_stride < p.num_heads * (p.nope_dim + p.rope_dim) || p.kv_stride < p.kv_lora_rank + p.rope_dim) {
    return cudaErrorInvalidValue;
  }
  MlaPrepareKernel<<<static_cast<unsigned>(p.num_tokens), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
