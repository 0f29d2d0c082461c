// One DeepSeek-V4 MoE block over rows of one sequence (shared/models/deepseek-v4.md §2.9):
// router logits, scores (sqrt-softplus, sigmoid or softmax), experts chosen by the token's
// tid2eid row (hash layers) or by top-k of score + correction bias, weights renormalized
// (+1e-20) and scaled, each expert and the shared expert a clamped SwiGLU. A token's
// routed outputs are summed in ascending expert order whatever else is in the batch, so
// its result does not depend on how its sequence was chunked.
#pragma once

#include <cstdint>

#include "engine/model/deepseek_v4/v4_config.h"
#include "engine/model/deepseek_v4/v4_weights.h"
#include "kernels/cpu/thread_pool.h"

namespace tandem::v4 {

struct MoeParams {
  const DeepseekV4Config* config = nullptr;
  const MoeWeights* weights = nullptr;
  MlpType type = MlpType::kMoe;
  const float* x = nullptr;         // [rows][hidden_size]: post_attention_layernorm(collapsed streams)
  const int32_t* tokens = nullptr;  // [rows]: the input ids (hash routing)
  int64_t rows = 0;
  float* out = nullptr;  // [rows][hidden_size]
  bool round_fp8_input = false;  // as AttentionParams's, for FP8 experts and the shared expert
};

void RunMoe(const MoeParams& p, cpu::ThreadPool& pool);

}  // namespace tandem::v4
