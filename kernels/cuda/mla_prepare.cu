#include "kernels/cuda/mla_prepare.h"

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) MlaPrepareKernel(MlaPrepareParams p) {
  __shared__ float cos_s[128], sin_s[128];
  __shared__ float scratch[kThreads / 32];
  internal::WaitAndTrigger();
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
    const float v0 = x0 * cos_s[i] - x1 * sin_s[i], v1 = x1 * cos_s[i] + x0 * sin_s[i];
    const __nv_bfloat16 y0 = __float2bfloat16_rn(v0);
    const __nv_bfloat16 y1 = __float2bfloat16_rn(v1);
    oh[p.nope_dim + idx.x] = y0;
    oh[p.nope_dim + idx.y] = y1;
    if (rope_out) {
      const int64_t at = t * p.q_rope_out_stride + h * p.q_rope_out_head_stride;
      p.q_rope_out[at + idx.x] = y0;
      p.q_rope_out[at + idx.y] = y1;
      if (p.q_rope_lo_out != nullptr) {
        p.q_rope_lo_out[at + idx.x] = __float2bfloat16_rn(v0 - __bfloat162float(y0));
        p.q_rope_lo_out[at + idx.y] = __float2bfloat16_rn(v1 - __bfloat162float(y1));
      }
    }
  }
}

// Absorbed variant: grid (ceil(R / kAbsorbCols) + 1, heads). Blocks x < chunks compute
// kAbsorbCols latent columns of head y's q_latent for every token (4 warps split nope_dim,
// each lane a column pair, its W_UK values in registers); blocks x == chunks rotate head
// y's query rope parts, and block (chunks, 0) writes the latent KV entries.
constexpr int kAbsorbThreads = 128;
constexpr int kAbsorbCols = 64;
constexpr int kAbsorbMaxJ = 48;  // nope_dim / 4
constexpr int kAbsorbMaxHalf = 64;  // rope_dim / 2
constexpr int kAbsorbKvPerThread = 8;  // kv_lora_rank <= 1024

__global__ void __launch_bounds__(kAbsorbThreads) MlaPrepareAbsorbKernel(MlaPrepareParams p) {
  __shared__ float q_s[4 * kAbsorbMaxJ];
  __shared__ float2 part[4][32];
  __shared__ float cos_s[kMlaPrepareAbsorbMaxTokens * kAbsorbMaxHalf];
  __shared__ float sin_s[kMlaPrepareAbsorbMaxTokens * kAbsorbMaxHalf];
  __shared__ float scratch[kAbsorbThreads / 32];
  const int h = blockIdx.y;
  const int chunks = (p.kv_lora_rank + kAbsorbCols - 1) / kAbsorbCols;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int head_dim = p.nope_dim + p.rope_dim;
  if (static_cast<int>(blockIdx.x) < chunks) {
    const int col = static_cast<int>(blockIdx.x) * kAbsorbCols + 2 * lane;
    const bool valid = col < p.kv_lora_rank;
    const int per_warp = p.nope_dim / 4;
    const int j0 = warp * per_warp;
    const __nv_bfloat16* w = p.w_uk + h * p.w_uk_head_stride + col;
    // This block's W_UK slice in registers before the wait (rows beyond per_warp and a
    // column beyond the rank read a valid address; the sums skip them, the store too).
    uint32_t wr[kAbsorbMaxJ];
    const __nv_bfloat16* wc = valid ? w : p.w_uk + h * p.w_uk_head_stride;
#pragma unroll
    for (int i = 0; i < kAbsorbMaxJ; ++i) {
      wr[i] = internal::LoadWeight(reinterpret_cast<const uint32_t*>(
          wc + static_cast<int64_t>(j0 + max(min(i, per_warp - 1), 0)) * p.kv_lora_rank));
    }
    internal::WaitAndTrigger();
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      const float* qt = p.q + t * p.q_stride + h * head_dim;
      for (int j = threadIdx.x; j < p.nope_dim; j += kAbsorbThreads) q_s[j] = qt[j];
      __syncthreads();
      float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
      for (int i = 0; i < kAbsorbMaxJ; ++i) {
        if (i < per_warp) {
          const float qv = q_s[j0 + i];
          __nv_bfloat162 b;
          memcpy(&b, &wr[i], sizeof(b));
          const float2 wv = __bfloat1622float2(b);
          a0 = fmaf(qv, wv.x, a0);
          a1 = fmaf(qv, wv.y, a1);
        }
      }
      part[warp][lane] = make_float2(a0, a1);
      __syncthreads();
      if (warp == 0 && valid) {
        float2 s = part[0][lane];
#pragma unroll
        for (int k = 1; k < 4; ++k) {
          s.x += part[k][lane].x;
          s.y += part[k][lane].y;
        }
        const int64_t at = t * p.q_rope_out_stride + h * p.q_rope_out_head_stride + col;
        const __nv_bfloat162 hi = __floats2bfloat162_rn(s.x, s.y);
        *reinterpret_cast<__nv_bfloat162*>(p.q_latent_out + at) = hi;
        if (p.q_latent_lo_out != nullptr) {
          *reinterpret_cast<__nv_bfloat162*>(p.q_latent_lo_out + at) =
              __floats2bfloat162_rn(s.x - __low2float(hi), s.y - __high2float(hi));
        }
      }
      __syncthreads();  // q_s and part are reused
    }
    return;
  }

  // Blocks x == chunks: head h's rotated query rope parts, and block (chunks, 0) the latent
  // KV entries too. Positions and slots are written before the step's first kernel, so the
  // angles are computed before the wait; after it each token's query and latent values are
  // loaded together, one round trip, before anything is stored.
  const int half = p.rope_dim / 2;
  const int tokens = static_cast<int>(p.num_tokens);
  for (int j = threadIdx.x; j < tokens * half; j += kAbsorbThreads) {
    const int t = j / half, i = j % half;
    const int32_t position = static_cast<int32_t>(internal::LoadWeight(reinterpret_cast<const uint32_t*>(p.positions + t)));
    internal::RopeCosSin(position, internal::LoadWeight(p.inv_freq + i), p.attention_factor, &cos_s[j], &sin_s[j]);
  }
  float norm_w[kAbsorbKvPerThread];
#pragma unroll
  for (int k = 0; k < kAbsorbKvPerThread; ++k) {
    const int i = static_cast<int>(threadIdx.x) + k * kAbsorbThreads;
    norm_w[k] = h == 0 ? internal::LoadWeight(p.kv_norm_weight + min(i, p.kv_lora_rank - 1)) : 0.0f;
  }
  internal::WaitAndTrigger();
  __syncthreads();  // cos_s, sin_s
  const bool rope_thread = static_cast<int>(threadIdx.x) < half;
  const int2 idx = internal::RopePair(min(static_cast<int>(threadIdx.x), half - 1), half, p.interleaved);
  for (int t = 0; t < tokens; ++t) {
    const float* qh = p.q + t * p.q_stride + h * head_dim + p.nope_dim;
    const float* kv = p.kv + t * p.kv_stride;
    float q0 = 0.0f, q1 = 0.0f, k0 = 0.0f, k1 = 0.0f;
    float lat[kAbsorbKvPerThread];
    int64_t slot = -1;
    if (rope_thread) {
      q0 = qh[idx.x];
      q1 = qh[idx.y];
    }
    if (h == 0) {
      slot = p.slots[t];
#pragma unroll
      for (int k = 0; k < kAbsorbKvPerThread; ++k) {
        const int i = static_cast<int>(threadIdx.x) + k * kAbsorbThreads;
        lat[k] = i < p.kv_lora_rank ? kv[i] : 0.0f;
      }
      if (rope_thread) {
        k0 = kv[p.kv_lora_rank + idx.x];
        k1 = kv[p.kv_lora_rank + idx.y];
      }
    }
    const float c = cos_s[t * half + min(static_cast<int>(threadIdx.x), half - 1)];
    const float s = sin_s[t * half + min(static_cast<int>(threadIdx.x), half - 1)];
    if (rope_thread) {
      const int64_t at = t * p.q_rope_out_stride + h * p.q_rope_out_head_stride;
      const float v0 = q0 * c - q1 * s, v1 = q1 * c + q0 * s;
      const __nv_bfloat16 y0 = __float2bfloat16_rn(v0), y1 = __float2bfloat16_rn(v1);
      p.q_rope_out[at + idx.x] = y0;
      p.q_rope_out[at + idx.y] = y1;
      if (p.q_rope_lo_out != nullptr) {
        p.q_rope_lo_out[at + idx.x] = __float2bfloat16_rn(v0 - __bfloat162float(y0));
        p.q_rope_lo_out[at + idx.y] = __float2bfloat16_rn(v1 - __bfloat162float(y1));
      }
    }
    if (h != 0) continue;
    // The latent KV entry, as MlaPrepareKernel writes it.
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kAbsorbKvPerThread; ++k) sum += lat[k] * lat[k];
    sum = internal::BlockSum<kAbsorbThreads>(sum, scratch);
    if (slot < 0 || slot >= p.num_slots) continue;
    const float inv = rsqrtf(sum / static_cast<float>(p.kv_lora_rank) + p.kv_norm_eps);
    __nv_bfloat16* entry = p.kv_cache + slot * (p.kv_lora_rank + p.rope_dim);
#pragma unroll
    for (int k = 0; k < kAbsorbKvPerThread; ++k) {
      const int i = static_cast<int>(threadIdx.x) + k * kAbsorbThreads;
      if (i < p.kv_lora_rank) entry[i] = __float2bfloat16_rn(norm_w[k] * (lat[k] * inv));
    }
    if (rope_thread) {
      entry[p.kv_lora_rank + idx.x] = __float2bfloat16_rn(k0 * c - k1 * s);
      entry[p.kv_lora_rank + idx.y] = __float2bfloat16_rn(k1 * c + k0 * s);
    }
  }
}

}  // namespace

cudaError_t MlaPrepare(const MlaPrepareParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  if (p.positions == nullptr || p.slots == nullptr || p.q == nullptr || p.kv == nullptr ||
      p.kv_norm_weight == nullptr || p.kv_cache == nullptr || p.inv_freq == nullptr || p.num_tokens < 0 ||
      p.num_tokens > 0x7fffffff || p.num_heads <= 0 || p.nope_dim < 0 || p.rope_dim <= 0 || p.rope_dim % 2 != 0 ||
      p.rope_dim > 256 || p.kv_lora_rank <= 0 || p.q_stride < p.num_heads * (p.nope_dim + p.rope_dim) ||
      p.kv_stride < p.kv_lora_rank + p.rope_dim) {
    return cudaErrorInvalidValue;
  }
  if (p.w_uk != nullptr) {
    if (p.q_latent_out == nullptr || p.q_rope_out == nullptr || p.q_rope_out_rows != p.num_tokens ||
        p.num_tokens > kMlaPrepareAbsorbMaxTokens || p.nope_dim <= 0 || p.nope_dim % 4 != 0 ||
        p.nope_dim > 4 * kAbsorbMaxJ || p.rope_dim > 2 * kAbsorbMaxHalf ||
        p.kv_lora_rank > kAbsorbKvPerThread * kAbsorbThreads || p.kv_lora_rank % 2 != 0 || p.q_rope_out_stride % 2 != 0 ||
        p.q_rope_out_head_stride % 2 != 0 || p.w_uk_head_stride % 2 != 0 ||
        reinterpret_cast<uintptr_t>(p.w_uk) % 4 != 0 || reinterpret_cast<uintptr_t>(p.q_latent_out) % 4 != 0 ||
        reinterpret_cast<uintptr_t>(p.q_latent_lo_out) % 4 != 0 ||
        p.num_heads > 65535) {
      return cudaErrorInvalidValue;
    }
    const int chunks = (p.kv_lora_rank + kAbsorbCols - 1) / kAbsorbCols;
    return internal::Launch(MlaPrepareAbsorbKernel, dim3(chunks + 1, p.num_heads), dim3(kAbsorbThreads), 0, stream, p);
  }
  if (p.q_out == nullptr || p.q_out_stride < p.num_heads * (p.nope_dim + p.rope_dim)) return cudaErrorInvalidValue;
  return internal::Launch(MlaPrepareKernel, dim3(static_cast<unsigned>(p.num_tokens)), dim3(kThreads), 0, stream, p);
}

}  // namespace tandem::cuda
