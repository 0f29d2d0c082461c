// The architecture of a DeepSeek-V2/V3 family model, parsed from a Hugging Face
// config.json. Every field that changes the math is here; an unknown model type or a
// value the engine cannot run is an INVALID_ARGUMENT error that names the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_info.h"

namespace tandem {

enum class TopkMethod { kGreedy, kGroupLimitedGreedy, kNoauxTc };
enum class ScoringFunc { kSoftmax, kSigmoid };

struct RopeConfig {
  double theta = 10000.0;
  bool yarn = false;
  // YaRN (used when yarn is true).
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;          // 0 = absent
  double mscale_all_dim = 0.0;  // 0 = absent
  std::optional<double> attention_factor;
  bool truncate = true;
};

// DeepSeek-V2/V3 (model_type "deepseek_v2" or "deepseek_v3"): what every model has
// (ModelInfo) and MLA's and DeepSeekMoE's fields.
struct ModelConfig : ModelInfo {
  int64_t intermediate_size = 0;
  int64_t moe_intermediate_size = 0;
  int64_t num_attention_heads = 0;
  double rms_norm_eps = 1e-6;

  // Multi-head latent attention.
  std::optional<int64_t> q_lora_rank;  // absent: q_proj straight from the hidden state
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool rope_interleave = true;
  RopeConfig rope;

  // DeepSeekMoE. n_routed_experts == 0 means every layer is a dense MLP.
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  TopkMethod topk_method = TopkMethod::kGreedy;
  ScoringFunc scoring_func = ScoringFunc::kSoftmax;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;

  int64_t num_nextn_predict_layers = 0;  // MTP modules stored after the decoder layers
  bool fp8_block_quantized = false;      // quantization_config: fp8 with 128x128 blocks

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Values per token per layer in the latent KV cache: latent + rotary key.
  int64_t kv_entry_dim() const { return kv_lora_rank + qk_rope_head_dim; }
  bool IsMoeLayer(int64_t layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
  // Attention logit scale, including YaRN's mscale_all_dim correction.
  double SoftmaxScale() const;
  // Scale applied to cos/sin (YaRN's attention factor; 1 without YaRN).
  double RopeAttentionFactor() const;
  // Rotary inverse frequencies, qk_rope_head_dim / 2 of them, YaRN-corrected.
  std::vector<float> RopeInverseFrequencies() const;
  // One line for logs: "deepseek_v3: 3 layers (1 dense, 2 MoE), hidden 128, ...".
  std::string Summary() const;
  // Whether attention over `n` new tokens after `start` cached ones needs fewer
  // multiply-adds in the absorbed form than in the expanded one. Per head and causal (token
  // j sees start + j + 1 positions): absorbed costs 2 R + P per query-position pair (scores
  // over latent + rotary key, values summed over the latent); expanded nope + rope + v per
  // pair plus expanding each position the chunk sees through kv_b ((nope + v) x R). With
  // tiny's shapes a fresh prompt is cheaper absorbed up to 126 tokens, with V2-Lite's up to 340.
  bool AbsorbedAttentionCheaper(int64_t n, int64_t start) const;
};

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view config_json);
// Reads `dir`/config.json.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

}  // namespace tandem
