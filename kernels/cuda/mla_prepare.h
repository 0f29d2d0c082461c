// The per-token step of multi-head latent attention between the projections and the
// attention kernels, fused into one launch (one block per token):
//   - the latent KV: RMSNorm of the kv_lora_rank latent (kv_a_layernorm), rotary embedding
//     of the shared key part, both stored in bf16 into the paged cache at slots[t] (a
//     negative slot skips the write);
//   - the queries: rotary embedding of each head's rope part, the whole query converted
//     to bf16 ([head][nope | rope], for the expanded form and the absorbed form's W_UK
//     product), and optionally the rotated rope part alone into a second buffer (the
//     absorbed form's [head][kv_lora_rank | rope] decode queries).
// Same arithmetic as the CPU forward (kernels/cpu/norm_rope_act.h) up to the bf16 stores.
//
// Absorbed variant (w_uk set; decode steps of a few tokens whose rows all take the absorbed
// form): the absorbed form's query product is fused in, q_latent_out[t][h][0:kv_lora_rank]
// = q_nope[t][h] . W_UK[h] from the float32 queries (rounded once, to bf16), instead of the
// bf16 query copy (q_out is not written). Its blocks load their slice of W_UK before waiting
// for the previous kernel (programmatic dependent launch, launch_control.h).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace tandem::cuda {

struct MlaPrepareParams {
  int64_t num_tokens = 0;
  const int32_t* positions = nullptr;  // [num_tokens]
  const int32_t* slots = nullptr;      // [num_tokens]: block * block_size + offset, or < 0
  // Queries, float32 [num_tokens][q_stride]: head h at h * (nope_dim + rope_dim).
  const float* q = nullptr;
  int64_t q_stride = 0;
  int num_heads = 0;
  int nope_dim = 0;
  int rope_dim = 0;  // even, at most 256
  __nv_bfloat16* q_out = nullptr;  // [num_tokens][q_out_stride], same layout as q
  int64_t q_out_stride = 0;
  // Optional: rows [0, q_rope_out_rows) also get their rotated rope parts here.
  __nv_bfloat16* q_rope_out = nullptr;
  int64_t q_rope_out_stride = 0;       // between tokens
  int64_t q_rope_out_head_stride = 0;  // between heads
  int64_t q_rope_out_rows = 0;
  // Latent KV, float32 [num_tokens][kv_stride]: kv_lora_rank latent values, then rope_dim.
  const float* kv = nullptr;
  int64_t kv_stride = 0;
  int kv_lora_rank = 0;
  const float* kv_norm_weight = nullptr;  // [kv_lora_rank]
  float kv_norm_eps = 1e-6f;
  __nv_bfloat16* kv_cache = nullptr;  // one layer: [num_slots][kv_lora_rank + rope_dim]
  int64_t num_slots = 0;
  // Rotary embedding.
  const float* inv_freq = nullptr;  // [rope_dim / 2]
  float attention_factor = 1.0f;
  bool interleaved = true;
  // Absorbed variant (see above): W_UK[h] = w_uk + h * w_uk_head_stride, [nope_dim][kv_lora_rank]
  // (kv_b's key rows of head h); q_latent_out takes q_rope_out's strides. Needs q_rope_out,
  // q_rope_out_rows == num_tokens <= kMlaPrepareAbsorbMaxTokens, nope_dim <= 192,
  // rope_dim <= 128, kv_lora_rank <= 1024.
  const __nv_bfloat16* w_uk = nullptr;
  int64_t w_uk_head_stride = 0;
  __nv_bfloat16* q_latent_out = nullptr;
  // Optional: the bf16 remainders (value - bf16(value)) of what q_rope_out and q_latent_out
  // receive, same strides (the decode attention's split queries, MlaDecodeParams::q_lo).
  __nv_bfloat16* q_rope_lo_out = nullptr;
  __nv_bfloat16* q_latent_lo_out = nullptr;
};

inline constexpr int64_t kMlaPrepareAbsorbMaxTokens = 16;

cudaError_t MlaPrepare(const MlaPrepareParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
