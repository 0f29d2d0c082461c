#include "engine/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/model/config_fields.h"
#include "engine/util/mapped_file.h"
#include "engine/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Json = nlohmann::json;

absl::Status FieldError(const std::string& field, const std::string& problem) {
  return ConfigFieldError(field, problem);
}

using Fields = ConfigFields;

absl::Status Positive(const std::string& field, int64_t v) {
  if (v <= 0) return FieldError(field, absl::StrCat("must be positive, got ", v));
  return absl::OkStatus();
}

absl::Status ParseRope(const Json& root, const Fields& top, ModelConfig& c) {
  // transformers >= 5 writes `rope_parameters` (with rope_theta inside); older configs
  // (and DeepSeek's own) write `rope_scaling` next to a top-level `rope_theta`.
  const char* key = nullptr;
  if (top.Has("rope_parameters")) key = "rope_parameters";
  else if (top.Has("rope_scaling")) key = "rope_scaling";
  ASSIGN_OR_RETURN(c.rope.theta, top.Double("rope_theta", 10000.0));
  if (key == nullptr) return absl::OkStatus();
  const Json& rp = root.at(key);
  if (!rp.is_object()) return FieldError(key, "must be an object");
  Fields f(rp, std::string(key) + ".");
  ASSIGN_OR_RETURN(std::optional<double> theta, f.Double("rope_theta"));
  if (theta) c.rope.theta = *theta;
  const char* type_key = f.Has("rope_type") ? "rope_type" : "type";
  ASSIGN_OR_RETURN(std::optional<std::string> type, f.String(type_key));
  const std::string t = type.value_or("default");
  if (t == "default") return absl::OkStatus();
  if (t != "yarn") {
    return FieldError(f.Name(type_key), absl::StrCat("is '", t, "'; supported: default, yarn"));
  }
  c.rope.yarn = true;
  ASSIGN_OR_RETURN(c.rope.original_max_position_embeddings,
                   f.Int("original_max_position_embeddings", c.max_position_embeddings));
  RETURN_IF_ERROR(Positive(f.Name("original_max_position_embeddings"),
                           c.rope.original_max_position_embeddings));
  ASSIGN_OR_RETURN(std::optional<double> factor, f.Double("factor"));
  c.rope.factor = factor ? *factor
                         : static_cast<double>(c.max_position_embeddings) /
                               static_cast<double>(c.rope.original_max_position_embeddings);
  if (c.rope.factor <= 0) return FieldError(f.Name("factor"), "must be positive");
  ASSIGN_OR_RETURN(double beta_fast, f.Double("beta_fast", 0.0));
  ASSIGN_OR_RETURN(double beta_slow, f.Double("beta_slow", 0.0));
  // transformers treats 0 as unset (`or 32`, `or 1`).
  c.rope.beta_fast = beta_fast != 0.0 ? beta_fast : 32.0;
  c.rope.beta_slow = beta_slow != 0.0 ? beta_slow : 1.0;
  ASSIGN_OR_RETURN(c.rope.mscale, f.Double("mscale", 0.0));
  ASSIGN_OR_RETURN(c.rope.mscale_all_dim, f.Double("mscale_all_dim", 0.0));
  ASSIGN_OR_RETURN(c.rope.attention_factor, f.Double("attention_factor"));
  ASSIGN_OR_RETURN(c.rope.truncate, f.Bool("truncate", true));
  return absl::OkStatus();
}

absl::Status ParseMoe(const Fields& f, ModelConfig& c) {
  ASSIGN_OR_RETURN(c.n_routed_experts, f.Int("n_routed_experts", 0));
  if (c.n_routed_experts < 0) return FieldError("n_routed_experts", "must not be negative");
  if (c.n_routed_experts == 0) return absl::OkStatus();
  const bool v3 = c.model_type == "deepseek_v3";
  ASSIGN_OR_RETURN(c.n_shared_experts, f.Int("n_shared_experts", v3 ? 1 : 2));
  ASSIGN_OR_RETURN(c.num_experts_per_tok, f.RequiredInt("num_experts_per_tok"));
  ASSIGN_OR_RETURN(c.moe_intermediate_size, f.RequiredInt("moe_intermediate_size"));
  RETURN_IF_ERROR(Positive("moe_intermediate_size", c.moe_intermediate_size));
  ASSIGN_OR_RETURN(c.n_group, f.Int("n_group", 1));
  ASSIGN_OR_RETURN(c.topk_group, f.Int("topk_group", 1));
  ASSIGN_OR_RETURN(c.first_k_dense_replace, f.Int("first_k_dense_replace", v3 ? 3 : 0));
  ASSIGN_OR_RETURN(c.moe_layer_freq, f.Int("moe_layer_freq", 1));
  ASSIGN_OR_RETURN(c.norm_topk_prob, f.Bool("norm_topk_prob", v3));
  ASSIGN_OR_RETURN(c.routed_scaling_factor, f.Double("routed_scaling_factor", v3 ? 2.5 : 1.0));
  if (c.n_shared_experts < 0) return FieldError("n_shared_experts", "must not be negative");
  RETURN_IF_ERROR(Positive("moe_layer_freq", c.moe_layer_freq));
  RETURN_IF_ERROR(Positive("n_group", c.n_group));
  RETURN_IF_ERROR(Positive("topk_group", c.topk_group));
  if (c.first_k_dense_replace < 0) return FieldError("first_k_dense_replace", "must not be negative");
  if (c.n_routed_experts % c.n_group != 0) {
    return FieldError("n_group", absl::StrCat("(", c.n_group, ") must divide n_routed_experts (",
                                              c.n_routed_experts, ")"));
  }
  if (c.topk_group > c.n_group) {
    return FieldError("topk_group", absl::StrCat("(", c.topk_group, ") exceeds n_group (", c.n_group, ")"));
  }

  ASSIGN_OR_RETURN(std::optional<std::string> method, f.String("topk_method"));
  const std::string m = method.value_or(v3 ? "noaux_tc" : "greedy");
  if (m == "greedy") c.topk_method = TopkMethod::kGreedy;
  else if (m == "group_limited_greedy") c.topk_method = TopkMethod::kGroupLimitedGreedy;
  else if (m == "noaux_tc") c.topk_method = TopkMethod::kNoauxTc;
  else return FieldError("topk_method", absl::StrCat("is '", m, "'; supported: greedy, group_limited_greedy, noaux_tc"));

  ASSIGN_OR_RETURN(std::optional<std::string> scoring, f.String("scoring_func"));
  const std::string s = scoring.value_or(v3 ? "sigmoid" : "softmax");
  if (s == "softmax") c.scoring_func = ScoringFunc::kSoftmax;
  else if (s == "sigmoid") c.scoring_func = ScoringFunc::kSigmoid;
  else return FieldError("scoring_func", absl::StrCat("is '", s, "'; supported: softmax, sigmoid"));

  const int64_t per_group = c.n_routed_experts / c.n_group;
  const int64_t reachable =
      c.topk_method == TopkMethod::kGreedy ? c.n_routed_experts : per_group * c.topk_group;
  if (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > reachable) {
    return FieldError("num_experts_per_tok",
                      absl::StrCat("(", c.num_experts_per_tok, ") must be between 1 and the ",
                                   reachable, " experts the routing can choose from"));
  }
  if (c.topk_method == TopkMethod::kNoauxTc && per_group < 2) {
    return FieldError("n_group", "noaux_tc routing scores each group by its top 2 experts, so "
                                 "every group needs at least 2 experts");
  }
  return absl::OkStatus();
}

absl::Status ParseQuantization(const Json& root, ModelConfig& c) {
  if (!root.contains("quantization_config") || root["quantization_config"].is_null()) {
    return absl::OkStatus();
  }
  const Json& q = root["quantization_config"];
  if (!q.is_object()) return FieldError("quantization_config", "must be an object");
  Fields f(q, "quantization_config.");
  ASSIGN_OR_RETURN(std::optional<std::string> method, f.String("quant_method"));
  if (method.value_or("") != "fp8") {
    return FieldError("quantization_config.quant_method",
                      absl::StrCat("is '", method.value_or(""), "'; supported: fp8"));
  }
  ASSIGN_OR_RETURN(std::optional<std::string> fmt, f.String("fmt"));
  if (fmt && *fmt != "e4m3") {
    return FieldError("quantization_config.fmt", absl::StrCat("is '", *fmt, "'; supported: e4m3"));
  }
  if (q.contains("weight_block_size")) {
    const Json& b = q["weight_block_size"];
    if (!(b.is_array() && b.size() == 2 && b[0] == 128 && b[1] == 128)) {
      return FieldError("quantization_config.weight_block_size",
                        absl::StrCat("is ", b.dump(), "; supported: [128, 128]"));
    }
  }
  c.fp8_block_quantized = true;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view config_json) {
  Json root = Json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("config.json: not valid JSON");
  if (!root.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  Fields f(root, "");
  ModelConfig c;
  ASSIGN_OR_RETURN(std::optional<std::string> model_type, f.String("model_type"));
  if (!model_type) return FieldError("model_type", "is required");
  c.model_type = *model_type;
  if (c.model_type != "deepseek_v2" && c.model_type != "deepseek_v3") {
    return FieldError("model_type", absl::StrCat("is '", c.model_type,
                                                 "'; supported: deepseek_v2, deepseek_v3"));
  }
  const bool v3 = c.model_type == "deepseek_v3";

  ASSIGN_OR_RETURN(c.vocab_size, f.RequiredInt("vocab_size"));
  ASSIGN_OR_RETURN(c.hidden_size, f.RequiredInt("hidden_size"));
  ASSIGN_OR_RETURN(c.intermediate_size, f.RequiredInt("intermediate_size"));
  ASSIGN_OR_RETURN(c.num_hidden_layers, f.RequiredInt("num_hidden_layers"));
  ASSIGN_OR_RETURN(c.num_attention_heads, f.RequiredInt("num_attention_heads"));
  ASSIGN_OR_RETURN(c.max_position_embeddings, f.Int("max_position_embeddings", v3 ? 4096 : 2048));
  for (auto [name, v] : {std::pair{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
                         {"intermediate_size", c.intermediate_size},
                         {"num_hidden_layers", c.num_hidden_layers},
                         {"num_attention_heads", c.num_attention_heads},
                         {"max_position_embeddings", c.max_position_embeddings}}) {
    RETURN_IF_ERROR(Positive(name, v));
  }
  ASSIGN_OR_RETURN(int64_t kv_heads, f.Int("num_key_value_heads", c.num_attention_heads));
  if (kv_heads != c.num_attention_heads) {
    return FieldError("num_key_value_heads",
                      absl::StrCat("(", kv_heads, ") must equal num_attention_heads (",
                                   c.num_attention_heads, ") for multi-head latent attention"));
  }
  ASSIGN_OR_RETURN(c.rms_norm_eps, f.Double("rms_norm_eps", 1e-6));
  if (c.rms_norm_eps <= 0) return FieldError("rms_norm_eps", "must be positive");
  ASSIGN_OR_RETURN(c.tie_word_embeddings, f.Bool("tie_word_embeddings", false));

  ASSIGN_OR_RETURN(std::optional<std::string> act, f.String("hidden_act"));
  if (act && *act != "silu") return FieldError("hidden_act", absl::StrCat("is '", *act, "'; supported: silu"));
  ASSIGN_OR_RETURN(bool attention_bias, f.Bool("attention_bias", false));
  if (attention_bias) return FieldError("attention_bias", "is true; DeepSeek models have no attention biases");
  ASSIGN_OR_RETURN(bool mlp_bias, f.Bool("mlp_bias", false));
  if (mlp_bias) return FieldError("mlp_bias", "is true; DeepSeek models have no MLP biases");
  ASSIGN_OR_RETURN(int64_t pretraining_tp, f.Int("pretraining_tp", 1));
  if (pretraining_tp != 1) return FieldError("pretraining_tp", "must be 1");

  ASSIGN_OR_RETURN(c.q_lora_rank, f.Int("q_lora_rank"));
  if (c.q_lora_rank) RETURN_IF_ERROR(Positive("q_lora_rank", *c.q_lora_rank));
  ASSIGN_OR_RETURN(c.kv_lora_rank, f.Int("kv_lora_rank", 512));
  ASSIGN_OR_RETURN(c.qk_nope_head_dim, f.Int("qk_nope_head_dim", 128));
  ASSIGN_OR_RETURN(c.qk_rope_head_dim, f.Int("qk_rope_head_dim", 64));
  ASSIGN_OR_RETURN(c.v_head_dim, f.Int("v_head_dim", 128));
  RETURN_IF_ERROR(Positive("kv_lora_rank", c.kv_lora_rank));
  RETURN_IF_ERROR(Positive("qk_nope_head_dim", c.qk_nope_head_dim));
  RETURN_IF_ERROR(Positive("qk_rope_head_dim", c.qk_rope_head_dim));
  RETURN_IF_ERROR(Positive("v_head_dim", c.v_head_dim));
  if (c.qk_rope_head_dim % 2 != 0) return FieldError("qk_rope_head_dim", "must be even");
  ASSIGN_OR_RETURN(c.rope_interleave, f.Bool("rope_interleave", true));
  RETURN_IF_ERROR(ParseRope(root, f, c));

  RETURN_IF_ERROR(ParseMoe(f, c));
  ASSIGN_OR_RETURN(c.num_nextn_predict_layers, f.Int("num_nextn_predict_layers", 0));
  if (c.num_nextn_predict_layers < 0) return FieldError("num_nextn_predict_layers", "must not be negative");
  RETURN_IF_ERROR(ParseQuantization(root, c));

  ASSIGN_OR_RETURN(c.bos_token_id, f.Int("bos_token_id"));
  ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> eos, f.IntList("eos_token_id"));
  if (eos) c.eos_token_ids = std::move(*eos);
  c.summary = c.Summary();
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  return LoadConfigFile(dir, [](const std::string& text) { return ParseModelConfig(text); });
}

namespace {

double YarnGetMscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

bool ModelConfig::AbsorbedAttentionCheaper(int64_t n, int64_t start) const {
  const double r = static_cast<double>(kv_lora_rank), p = static_cast<double>(qk_rope_head_dim);
  const double nope = static_cast<double>(qk_nope_head_dim), v = static_cast<double>(v_head_dim);
  const double pairs = static_cast<double>(n) * (static_cast<double>(start) + (static_cast<double>(n) + 1) / 2);
  const double absorbed = pairs * (2 * r + p);
  const double expanded = pairs * (nope + p + v) + static_cast<double>(start + n) * (nope + v) * r;
  return absorbed < expanded;
}

double ModelConfig::SoftmaxScale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (rope.yarn && rope.mscale_all_dim != 0.0) {
    const double m = YarnGetMscale(rope.factor, rope.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

double ModelConfig::RopeAttentionFactor() const {
  if (!rope.yarn) return 1.0;
  if (rope.attention_factor) return *rope.attention_factor;
  if (rope.mscale != 0.0 && rope.mscale_all_dim != 0.0) {
    return YarnGetMscale(rope.factor, rope.mscale) / YarnGetMscale(rope.factor, rope.mscale_all_dim);
  }
  return YarnGetMscale(rope.factor, 1.0);
}

std::vector<float> ModelConfig::RopeInverseFrequencies() const {
  const int64_t dim = qk_rope_head_dim;
  const int64_t half = dim / 2;
  std::vector<float> inv_freq(half), pos_freqs(half);
  // transformers computes these in float32; do the same so positions agree to the ulp.
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    pos_freqs[i] = std::pow(static_cast<float>(rope.theta), exponent);
    inv_freq[i] = 1.0f / pos_freqs[i];
  }
  if (!rope.yarn) return inv_freq;

  auto correction_dim = [&](double rotations) {
    return (static_cast<double>(dim) *
            std::log(static_cast<double>(rope.original_max_position_embeddings) / (rotations * 2 * M_PI))) /
           (2 * std::log(rope.theta));
  };
  double low = correction_dim(rope.beta_fast);
  double high = correction_dim(rope.beta_slow);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    const float ramp = std::clamp(static_cast<float>((static_cast<double>(i) - low) / (high - low)), 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    const float extrapolated = inv_freq[i];
    const float interpolated = 1.0f / (static_cast<float>(rope.factor) * pos_freqs[i]);
    inv_freq[i] = interpolated * (1.0f - extrapolation_factor) + extrapolated * extrapolation_factor;
  }
  return inv_freq;
}

std::string ModelConfig::Summary() const {
  int64_t moe_layers = 0;
  for (int64_t i = 0; i < num_hidden_layers; ++i) moe_layers += IsMoeLayer(i) ? 1 : 0;
  std::string s = absl::StrFormat(
      "%s: %d layers (%d dense, %d MoE), hidden %d, %d heads, kv_lora_rank %d, q_lora_rank %s, "
      "vocab %d",
      model_type, num_hidden_layers, num_hidden_layers - moe_layers, moe_layers, hidden_size,
      num_attention_heads, kv_lora_rank, q_lora_rank ? absl::StrCat(*q_lora_rank) : "none", vocab_size);
  if (n_routed_experts > 0) {
    absl::StrAppendFormat(&s, ", %d routed experts (top %d, %d groups) + %d shared", n_routed_experts,
                          num_experts_per_tok, n_group, n_shared_experts);
  }
  if (rope.yarn) absl::StrAppendFormat(&s, ", YaRN x%g", rope.factor);
  if (num_nextn_predict_layers > 0) absl::StrAppendFormat(&s, ", %d MTP layers", num_nextn_predict_layers);
  if (fp8_block_quantized) s += ", FP8 weights";
  return s;
}

}  // namespace tandem
