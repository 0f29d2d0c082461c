// The per-token arithmetic of the DeepSeek-V4 forward pass, float32 throughout, each as
// transformers' modeling_deepseek_v4.py computes it (shared/models/deepseek-v4.md §2).
// The full and the incremental forms share every function here, so a position comes out
// bitwise the same whichever form computed it and however its sequence was chunked.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model/deepseek_v4/v4_config.h"

namespace tandem::v4 {

// x / sqrt(mean(x^2) + eps) in place: transformers' DeepseekV4UnweightedRMSNorm (the
// query heads, the mHC inputs).
void UnitRmsNorm(float* x, int64_t n, float eps);

// One rotary table: interleaved pairs on the trailing rotary_dim channels.
class Rope {
 public:
  Rope() = default;
  explicit Rope(const RopeTable& table);
  int64_t rotary_dim() const { return rotary_dim_; }
  // Rotates the trailing rotary_dim of x[width] by the angle of `position`, or back
  // (by -position: the conjugate, cos and -sin) when `inverse`.
  void Apply(float* x, int64_t width, int64_t position, bool inverse) const;

 private:
  std::vector<float> inv_freq_;
  float attention_factor_ = 1.0f;
  int64_t rotary_dim_ = 0;
};

// One mHC site's weights for one token, from its row `mix` = fn . UnitRmsNorm(streams):
// pre[n] (collapse), post[n] (expand), comb[n][n] (Sinkhorn-normalized, row-major; used
// transposed: stream k receives sum_j comb[j][k] X_j).
void HyperConnectionMix(const float* mix, const float* base, const float* scale, int64_t n, int64_t sinkhorn_iters,
                            float hc_eps, float* pre, float* post, float* comb);
// The final collapse's weights: pre[n] = sigmoid(mix * scale + base) + eps.
void HyperHeadMix(const float* mix, const float* base, float scale, int64_t n, float hc_eps, float* pre);
// u[d] = sum_j pre_j X_j over the n streams X [n][d].
void CollapseStreams(const float* streams, const float* pre, int64_t n, int64_t d, float* u);
// streams[k] = post_k f + sum_j comb[j][k] streams[j], in place (scratch: n * d floats).
void ExpandStreams(float* streams, const float* post, const float* comb, const float* f, int64_t n, int64_t d,
                   float* scratch);

// The router score functions, elementwise in place (softmax over all n).
void RouterScores(ScoringFunc f, float* logits, int64_t n);

// One token's routed experts (k = num_experts_per_tok of n_routed_experts e): `scores`
// holds the router logits and gets the scores (RouterScores); the experts are the row
// `hash_row` [k] of a hash-routed layer, or else the top k of score + correction_bias
// (which steers the choice only), ascending; weight[j] = score / (sum of the chosen, in
// that order, + 1e-20) * routed_scaling_factor. scratch: e floats; top: reused.
void RouteToken(const DeepseekV4Config& c, float* scores, const float* correction_bias, const int32_t* hash_row,
                float* scratch, std::vector<int32_t>* top, int32_t* idx, float* weight);

// h = silu(min(gate, limit)) * clamp(up, -limit, limit), elementwise (the clamped SwiGLU).
void ClampedSwiGlu(const float* gate, const float* up, float limit, int64_t n, float* h);

// One compressed entry from a window's slots: per channel a softmax over the slots of
// their gates (position bias added), then the weighted sum of their kv rows. `kv[s]`
// and `gate[s]` point at width values each.
void PoolWindow(const float* const* kv, const float* const* gate, int64_t slots, int64_t width, float* out);

// Indices of the k largest of scores[n] (ties to the lower index), in ascending order.
void TopK(const float* scores, int64_t n, int64_t k, std::vector<int32_t>* out);

// One query head over keys that are also the values, with one extra "sink" logit that
// only enlarges the softmax's denominator: out[d] = sum_j p_j keys[j], p = softmax over
// [q . keys[j] * scale ..., sink] without its last entry. scratch: num_keys floats.
void AttendWithSink(const float* q, const float* const* keys, int64_t num_keys, int64_t d, float scale, float sink,
                    float* scratch, float* out);

}  // namespace tandem::v4
