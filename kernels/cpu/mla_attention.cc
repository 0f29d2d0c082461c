#include "kernels/cpu/mla_attention.h"

#include <vector>

#include "kernels/common/check.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/norm_rope_act.h"
#include "kernels/cpu/vec.h"

namespace tandem::cpu {
namespace {

void CheckParams(const MlaAttentionParams& p) {
  TANDEM_CHECK(p.q != nullptr && p.out != nullptr && p.kv_b != nullptr);
  TANDEM_CHECK_EQ(p.kv_b->rows, p.num_heads * (p.qk_nope_dim + p.v_dim));
  TANDEM_CHECK_EQ(p.kv_b->cols, p.kv_lora_rank);
  TANDEM_CHECK_EQ(p.cache.entry_dim, p.kv_lora_rank + p.qk_rope_dim);
  TANDEM_CHECK_GE(p.q_stride, p.num_heads * (p.qk_nope_dim + p.qk_rope_dim));
  TANDEM_CHECK_GE(p.out_stride, p.num_heads * p.v_dim);
}

}  // namespace

void MlaAttentionExpanded(const MlaAttentionParams& p, ThreadPool& pool) {
  CheckParams(p);
  const int64_t num_keys = p.first_position + p.num_tokens;
  const int64_t lora = p.kv_lora_rank;
  const int64_t head_kv = p.qk_nope_dim + p.v_dim;
  const int64_t head_q = p.qk_nope_dim + p.qk_rope_dim;

  // Gather the latents, then expand them: kv[s] = kv_b * latent[s] -> [head][k_nope | v].
  std::vector<float> latents(static_cast<size_t>(num_keys * lora));
  for (int64_t s = 0; s < num_keys; ++s) {
    std::memcpy(&latents[s * lora], p.cache.Entry(s), lora * sizeof(float));
  }
  std::vector<float> kv(static_cast<size_t>(num_keys * p.num_heads * head_kv));
  Matmul({.x = latents.data(), .m = num_keys, .x_stride = lora, .w = p.kv_b, .y = kv.data(),
          .y_stride = p.num_heads * head_kv},
         pool);

  pool.ParallelFor(p.num_heads * p.num_tokens, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(num_keys));
    for (int64_t job = begin; job < end; ++job) {
      const int64_t h = job / p.num_tokens;
      const int64_t t = job % p.num_tokens;
      const float* q = p.q + t * p.q_stride + h * head_q;
      const int64_t visible = p.first_position + t + 1;
      for (int64_t s = 0; s < visible; ++s) {
        const float* k_nope = &kv[(s * p.num_heads + h) * head_kv];
        const float* k_rope = p.cache.Entry(s) + lora;
        scores[s] = (Dot(q, k_nope, p.qk_nope_dim) + Dot(q + p.qk_nope_dim, k_rope, p.qk_rope_dim)) *
                    p.softmax_scale;
      }
      SoftmaxInPlace(scores.data(), visible);
      float* out = p.out + t * p.out_stride + h * p.v_dim;
      std::fill(out, out + p.v_dim, 0.0f);
      for (int64_t s = 0; s < visible; ++s) {
        Axpy(scores[s], &kv[(s * p.num_heads + h) * head_kv + p.qk_nope_dim], out, p.v_dim);
      }
    }
  });
}

void MlaAttentionAbsorbed(const MlaAttentionParams& p, ThreadPool& pool) {
  CheckParams(p);
  const int64_t num_keys = p.first_position + p.num_tokens;
  const int64_t lora = p.kv_lora_rank;
  const int64_t head_kv = p.qk_nope_dim + p.v_dim;
  const int64_t head_q = p.qk_nope_dim + p.qk_rope_dim;

  pool.ParallelFor(p.num_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> w_head(static_cast<size_t>(head_kv * lora));  // this head's kv_b rows
    std::vector<float> q_latent(static_cast<size_t>(lora));
    std::vector<float> out_latent(static_cast<size_t>(lora));
    std::vector<float> scores(static_cast<size_t>(num_keys));
    for (int64_t h = begin; h < end; ++h) {
      DequantizeRows(*p.kv_b, h * head_kv, head_kv, w_head.data());
      const float* w_uk = w_head.data();                      // [nope][lora]
      const float* w_uv = w_head.data() + p.qk_nope_dim * lora;  // [v][lora]
      for (int64_t t = 0; t < p.num_tokens; ++t) {
        const float* q = p.q + t * p.q_stride + h * head_q;
        // q_latent = W_uk^T q_nope: the key projection folded into the query.
        std::fill(q_latent.begin(), q_latent.end(), 0.0f);
        for (int64_t i = 0; i < p.qk_nope_dim; ++i) Axpy(q[i], w_uk + i * lora, q_latent.data(), lora);
        const int64_t visible = p.first_position + t + 1;
        for (int64_t s = 0; s < visible; ++s) {
          const float* entry = p.cache.Entry(s);
          scores[s] = (Dot(q_latent.data(), entry, lora) +
                       Dot(q + p.qk_nope_dim, entry + lora, p.qk_rope_dim)) *
                      p.softmax_scale;
        }
        SoftmaxInPlace(scores.data(), visible);
        std::fill(out_latent.begin(), out_latent.end(), 0.0f);
        for (int64_t s = 0; s < visible; ++s) Axpy(scores[s], p.cache.Entry(s), out_latent.data(), lora);
        // The value projection applied once to the weighted latent.
        float* out = p.out + t * p.out_stride + h * p.v_dim;
        for (int64_t j = 0; j < p.v_dim; ++j) out[j] = Dot(w_uv + j * lora, out_latent.data(), lora);
      }
    }
  });
}

}  // namespace tandem::cpu
