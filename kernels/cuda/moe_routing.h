// DeepSeekMoE expert selection on the GPU, with exactly the semantics of
// kernels/cpu/moe_routing.h: softmax or sigmoid scores of the router logits; greedy,
// group-limited greedy (groups ranked by their best expert) or noaux_tc (groups ranked by
// the sum of their two best bias-corrected scores) top-k with ties to the lower index;
// weights = the chosen experts' scores (without the correction bias), optionally
// renormalized, times routed_scaling_factor (DeepSeek-V2 scales only unnormalized
// weights: scale_normalized false). One warp per token.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda {

enum class MoeScoring { kSoftmax, kSigmoid };
enum class MoeTopk { kGreedy, kGroupLimitedGreedy, kNoauxTc };

struct MoeRoutingParams {
  const float* logits = nullptr;  // [num_tokens][logits_stride], num_experts used
  int64_t logits_stride = 0;
  int num_tokens = 0;
  int num_experts = 0;  // at most 1024, a multiple of num_groups
  int num_groups = 1;   // at most 32
  int topk_groups = 1;
  int top_k = 1;  // at most 32
  MoeScoring scoring = MoeScoring::kSoftmax;
  MoeTopk method = MoeTopk::kGreedy;
  const float* correction_bias = nullptr;  // [num_experts] or null
  bool normalize = false;
  bool scale_normalized = true;
  float routed_scaling_factor = 1.0f;
  int32_t* expert_ids = nullptr;  // [num_tokens][top_k] out, best first
  float* weights = nullptr;       // [num_tokens][top_k] out
};

cudaError_t MoeRouting(const MoeRoutingParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
