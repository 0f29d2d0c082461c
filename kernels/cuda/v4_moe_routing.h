// DeepSeek-V4's expert selection on the GPU, with the semantics of the CPU engine's
// (engine/model/deepseek_v4/v4_moe.cc): sqrt-softplus scores (torch's softplus, linear
// above 20) of the router logits; the experts either a top-k of score + correction bias
// (ties to the lower index) or, in the hash-routed layers, the token's row of tid2eid;
// weights = the chosen scores over their sum (+ 1e-20) times routed_scaling_factor. Ids
// and weights in ascending expert order, the sum taken in that order, as on the CPU. One
// warp per token. (Separate from moe_routing.h, whose V2/V3 semantics differ in scoring,
// groups and output order.)
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda {

struct V4MoeRoutingParams {
  const float* logits = nullptr;  // [num_tokens][logits_stride], num_experts used
  int64_t logits_stride = 0;
  int num_tokens = 0;
  int num_experts = 0;  // at most 1024
  int top_k = 0;        // at most 32
  const float* correction_bias = nullptr;  // [num_experts]; top-k layers
  // Hash-routed layers: tid2eid [vocab_size][top_k] and the tokens [num_tokens]. A token
  // outside [0, vocab_size) or an id outside [0, num_experts) routes nowhere: its ids are
  // -1 and weights 0, and *bad_input (when given) is set to 1.
  const int32_t* tid2eid = nullptr;
  const int32_t* tokens = nullptr;
  int64_t vocab_size = 0;
  int32_t* bad_input = nullptr;
  float routed_scaling_factor = 1.0f;
  int32_t* expert_ids = nullptr;  // [num_tokens][top_k] out, ascending
  float* weights = nullptr;       // [num_tokens][top_k] out
};

cudaError_t V4MoeRouting(const V4MoeRoutingParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
