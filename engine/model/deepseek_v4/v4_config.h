// The architecture of a DeepSeek-V4 model (`model_type: deepseek_v4`), parsed from a
// config.json as transformers' DeepseekV4Config reads it (docs: shared/models/deepseek-v4.md
// §1): both the official checkpoint keys (compress_ratios, num_hash_layers, rope_scaling,
// qk_rope_head_dim, compress_rate_csa/hca) and transformers' own (layer_types,
// compress_rates, rope_parameters, mlp_layer_types, partial_rotary_factor), with its
// defaults (the published V4-Flash values). A bad or unsupported value is an
// INVALID_ARGUMENT error that names the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"

namespace tandem::v4 {

// The attention of one decoder layer: a sliding window only, or the window plus
// compressed entries (CSA: overlapping windows of compress_rate_csa tokens chosen per
// query by the lightning indexer; HCA: windows of compress_rate_hca tokens, all visible).
enum class AttentionType { kSliding, kCompressedSparse, kHeavilyCompressed };
// The routing of one decoder layer's MoE: by a fixed token -> experts table, or top-k.
enum class MlpType { kHashMoe, kMoe };
enum class ScoringFunc { kSqrtSoftplus, kSoftmax, kSigmoid };

// transformers' names: "sliding_attention", "compressed_sparse_attention",
// "heavily_compressed_attention"; "hash_moe", "moe".
const char* AttentionTypeName(AttentionType t);
const char* MlpTypeName(MlpType t);

// One of the two rotary tables ("main" for sliding-only layers, "compress" for CSA/HCA
// layers, their compressors and the indexer). rope.truncate is always true: transformers
// reads `truncate` from the top level of rope_parameters, which for V4 holds only the two
// tables.
struct RopeTable {
  RopeConfig rope;
  int64_t rotary_dim = 0;  // the trailing channels rotated (interleaved pairs)

  // rotary_dim / 2 inverse frequencies (YaRN-corrected when rope.yarn), in float32 as
  // transformers computes them.
  std::vector<float> InverseFrequencies() const;
  // The factor cos and sin are multiplied by (1 without YaRN; YaRN's attention_factor).
  double AttentionFactor() const;
};

struct DeepseekV4Config {
  int64_t vocab_size = 129280;
  int64_t hidden_size = 4096;
  int64_t moe_intermediate_size = 2048;  // each routed expert and the shared expert
  int64_t num_hidden_layers = 43;
  int64_t num_attention_heads = 64;
  int64_t head_dim = 512;  // q, the shared K=V head, compressed entries
  int64_t q_lora_rank = 1024;
  double partial_rotary_factor = 0.125;
  int64_t qk_rope_head_dim = 64;  // int(head_dim * partial_rotary_factor)
  int64_t num_experts_per_tok = 6;
  int64_t n_routed_experts = 256;
  // Parsed for their types only: transformers builds exactly one shared expert and always
  // renormalizes the routed weights, whatever these say.
  int64_t n_shared_experts = 1;
  bool norm_topk_prob = true;
  ScoringFunc scoring_func = ScoringFunc::kSqrtSoftplus;
  double routed_scaling_factor = 1.5;
  int64_t max_position_embeddings = 1048576;
  double rope_theta = 10000.0;
  double compress_rope_theta = 160000.0;
  std::vector<AttentionType> layer_types;  // num_hidden_layers entries
  int64_t compress_rate_csa = 4;           // m
  int64_t compress_rate_hca = 128;         // m'
  int64_t hc_mult = 4;                     // residual streams
  int64_t hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  std::vector<MlpType> mlp_layer_types;  // num_hidden_layers entries
  double swiglu_limit = 10.0;
  int64_t sliding_window = 128;  // keys a query sees, itself included
  int64_t o_groups = 8;
  int64_t o_lora_rank = 1024;
  int64_t index_n_heads = 64;
  int64_t index_head_dim = 128;
  int64_t index_topk = 512;
  int64_t num_nextn_predict_layers = 1;  // MTP layers stored after the decoder layers
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  std::optional<int64_t> bos_token_id = 0;
  std::vector<int64_t> eos_token_ids = {1};
  RopeTable main_rope;
  RopeTable compress_rope;

  // quantization_config: FP8 e4m3 linear weights with 128x128 block scales.
  bool fp8_block_quantized = false;
  // expert_dtype as the official instruct checkpoints write it ("fp4": routed experts
  // FP4 e2m1 with per-32 ue8m0 scales), or empty. The loader goes by the stored tensors;
  // this is reported, not relied on.
  std::string expert_dtype;
  std::string topk_method;  // kept as an attribute, as transformers does; not used
  // The MTP layer's attention: the official compress_ratios carry one entry more than
  // there are decoder layers, the MTP layer's (0: sliding).
  AttentionType mtp_attention_type = AttentionType::kSliding;

  // m for CSA, m' for HCA, 0 for sliding layers.
  int64_t CompressRate(AttentionType t) const;
  int64_t CompressRate(int64_t layer) const { return CompressRate(layer_types[layer]); }
  const RopeTable& RopeFor(AttentionType t) const {
    return t == AttentionType::kSliding ? main_rope : compress_rope;
  }
  // Width of the attention output one group projects: H * d / G.
  int64_t o_group_in() const { return num_attention_heads * head_dim / o_groups; }
  // One line for logs.
  std::string Summary() const;
};

// Errors: INVALID_ARGUMENT naming the field (not JSON, another model_type, a value of the
// wrong type, out of range or unsupported).
absl::StatusOr<DeepseekV4Config> ParseDeepseekV4Config(std::string_view config_json);
// Reads `dir`/config.json; errors are prefixed with the path.
absl::StatusOr<DeepseekV4Config> LoadDeepseekV4Config(const std::string& dir);

}  // namespace tandem::v4
