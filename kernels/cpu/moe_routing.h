// DeepSeekMoE expert selection from router logits: softmax or sigmoid scores, then
// greedy, group-limited greedy (V2: groups ranked by their best expert) or noaux_tc (V3:
// groups ranked by the sum of their best two bias-corrected scores) top-k, then the
// weights: the chosen experts' scores (without the correction bias), optionally
// normalized, times routed_scaling_factor.
#pragma once

#include <cstdint>

namespace tandem::cpu {

enum class MoeScoring { kSoftmax, kSigmoid };
enum class MoeTopk { kGreedy, kGroupLimitedGreedy, kNoauxTc };

struct MoeRoutingParams {
  const float* logits = nullptr;  // [num_tokens][num_experts]
  int64_t num_tokens = 0;
  int64_t num_experts = 0;
  int64_t num_groups = 1;
  int64_t topk_groups = 1;
  int64_t top_k = 1;
  MoeScoring scoring = MoeScoring::kSoftmax;
  MoeTopk method = MoeTopk::kGreedy;
  const float* correction_bias = nullptr;  // [num_experts] or null (noaux_tc uses it for choice only)
  bool normalize = false;                  // renormalize the chosen weights to sum to 1
  // DeepSeek-V2 scales only unnormalized weights; V3 scales always.
  bool scale_normalized = true;
  float routed_scaling_factor = 1.0f;
  int32_t* expert_ids = nullptr;  // [num_tokens][top_k] out
  float* weights = nullptr;       // [num_tokens][top_k] out
};

void RouteMoe(const MoeRoutingParams& p);

}  // namespace tandem::cpu
