#include "kernels/cpu/mla_attention.h"

#include <algorithm>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/norm_rope_act.h"
#include "kernels/cpu/vec.h"

namespace tandem::cpu {
namespace {

constexpr int64_t kQueryTile = 16;

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
  // Queries of one head are taken kQueryTile at a time, each tile sweeping the latents
  // once (a prefill chunk reads each entry once per tile, not once per query). Every
  // query's numbers are still the same operations in the same order as when it is alone
  // (a decode step): its own q_latent, one Dot per visible position, its own softmax, its
  // weighted sum in position order. Tiles, chunking and threads change nothing.
  const int64_t tiles = (p.num_tokens + kQueryTile - 1) / kQueryTile;

  pool.ParallelFor(p.num_heads * tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> w_head(static_cast<size_t>(head_kv * lora));  // this head's kv_b rows
    std::vector<float> q_latent(static_cast<size_t>(kQueryTile * lora));
    std::vector<float> out_latent(static_cast<size_t>(kQueryTile * lora));
    std::vector<float> scores(static_cast<size_t>(kQueryTile * num_keys));
    int64_t loaded_head = -1;
    for (int64_t job = begin; job < end; ++job) {
      const int64_t h = job / tiles;
      const int64_t t0 = (job % tiles) * kQueryTile;
      const int64_t n = std::min(kQueryTile, p.num_tokens - t0);
      if (h != loaded_head) {
        DequantizeRows(*p.kv_b, h * head_kv, head_kv, w_head.data());
        loaded_head = h;
      }
      const float* w_uk = w_head.data();                         // [nope][lora]
      const float* w_uv = w_head.data() + p.qk_nope_dim * lora;  // [v][lora]
      auto query = [&](int64_t i) { return p.q + (t0 + i) * p.q_stride + h * head_q; };
      for (int64_t i = 0; i < n; ++i) {
        // q_latent = W_uk^T q_nope: the key projection folded into the query.
        const float* q = query(i);
        float* ql = &q_latent[i * lora];
        std::fill(ql, ql + lora, 0.0f);
        for (int64_t d = 0; d < p.qk_nope_dim; ++d) Axpy(q[d], w_uk + d * lora, ql, lora);
      }
      // Query i sees positions [0, first_position + t0 + i].
      const int64_t first_visible = p.first_position + t0 + 1;
      const int64_t last_visible = first_visible + n - 1;
      for (int64_t s = 0; s < last_visible; ++s) {
        const float* entry = p.cache.Entry(s);
        for (int64_t i = std::max<int64_t>(0, s - first_visible + 1); i < n; ++i) {
          scores[i * num_keys + s] = (Dot(&q_latent[i * lora], entry, lora) +
                                      Dot(query(i) + p.qk_nope_dim, entry + lora, p.qk_rope_dim)) *
                                     p.softmax_scale;
        }
      }
      for (int64_t i = 0; i < n; ++i) SoftmaxInPlace(&scores[i * num_keys], first_visible + i);
      std::fill(out_latent.begin(), out_latent.begin() + n * lora, 0.0f);
      for (int64_t s = 0; s < last_visible; ++s) {
        const float* entry = p.cache.Entry(s);
        for (int64_t i = std::max<int64_t>(0, s - first_visible + 1); i < n; ++i) {
          Axpy(scores[i * num_keys + s], entry, &out_latent[i * lora], lora);
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        // The value projection applied once to the weighted latent.
        float* out = p.out + (t0 + i) * p.out_stride + h * p.v_dim;
        for (int64_t j = 0; j < p.v_dim; ++j) out[j] = Dot(w_uv + j * lora, &out_latent[i * lora], lora);
      }
    }
  });
}

}  // namespace tandem::cpu
