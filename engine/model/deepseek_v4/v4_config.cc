#include "engine/model/deepseek_v4/v4_config.h"

#include <cmath>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/model/config_fields.h"
#include "engine/util/mapped_file.h"
#include "engine/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem::v4 {
namespace {

using Json = nlohmann::json;

constexpr char kSliding[] = "sliding_attention";
constexpr char kCsa[] = "compressed_sparse_attention";
constexpr char kHca[] = "heavily_compressed_attention";

absl::Status FieldError(const std::string& field, const std::string& problem) {
  return ConfigFieldError(field, problem);
}

using Reader = ConfigFields;

absl::Status AtLeast(const std::string& field, int64_t v, int64_t min) {
  if (v < min) return FieldError(field, absl::StrCat("must be at least ", min, ", got ", v));
  return absl::OkStatus();
}

absl::StatusOr<AttentionType> ParseAttentionType(const Json& v, const std::string& name) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == kSliding) return AttentionType::kSliding;
    if (s == kCsa) return AttentionType::kCompressedSparse;
    if (s == kHca) return AttentionType::kHeavilyCompressed;
  }
  return FieldError(name, absl::StrCat("is ", v.dump(), "; supported: ", kSliding, ", ", kCsa, ", ", kHca));
}

// compress_ratios entries as transformers maps them (0, 4, 128 only; other values are a
// KeyError there).
absl::StatusOr<AttentionType> AttentionTypeOfRatio(const Json& v, const std::string& name) {
  ASSIGN_OR_RETURN(int64_t r, Reader::AsInt(v, name));
  if (r == 0) return AttentionType::kSliding;
  if (r == 4) return AttentionType::kCompressedSparse;
  if (r == 128) return AttentionType::kHeavilyCompressed;
  return FieldError(name, absl::StrCat("is ", r, "; transformers maps only 0 (", kSliding, "), 4 (", kCsa,
                                       ") and 128 (", kHca, ")"));
}

absl::Status ParseLayerTypes(const Json& root, const Reader& f, DeepseekV4Config& c) {
  const int64_t n = c.num_hidden_layers;
  std::vector<AttentionType> types;
  if (f.Has("layer_types")) {
    const Json& lt = root["layer_types"];
    if (!lt.is_array()) return FieldError("layer_types", "must be a list");
    for (size_t i = 0; i < lt.size(); ++i) {
      ASSIGN_OR_RETURN(AttentionType t, ParseAttentionType(lt[i], absl::StrCat("layer_types[", i, "]")));
      types.push_back(t);
    }
    if (static_cast<int64_t>(types.size()) < n) {
      return FieldError("layer_types", absl::StrCat("has ", types.size(), " entries for ", n, " layers"));
    }
  } else if (f.Has("compress_ratios")) {
    const Json& cr = root["compress_ratios"];
    if (!cr.is_array()) return FieldError("compress_ratios", "must be a list");
    for (size_t i = 0; i < cr.size(); ++i) {
      ASSIGN_OR_RETURN(AttentionType t, AttentionTypeOfRatio(cr[i], absl::StrCat("compress_ratios[", i, "]")));
      types.push_back(t);
    }
    if (static_cast<int64_t>(types.size()) < n) {
      return FieldError("compress_ratios", absl::StrCat("has ", types.size(), " entries for ", n, " layers"));
    }
    // The official lists end with the MTP layer's entry.
    if (static_cast<int64_t>(types.size()) > n) c.mtp_attention_type = types[n];
  } else {
    // transformers' default, V4-Pro's schedule: two HCA layers, then HCA and CSA alternating.
    for (int64_t i = 0; i < n; ++i) {
      types.push_back(i < 2 || (i - 2) % 2 == 0 ? AttentionType::kHeavilyCompressed
                                                 : AttentionType::kCompressedSparse);
    }
  }
  types.resize(n);
  c.layer_types = std::move(types);

  std::vector<MlpType> mlp;
  if (f.Has("mlp_layer_types")) {
    const Json& mt = root["mlp_layer_types"];
    if (!mt.is_array()) return FieldError("mlp_layer_types", "must be a list");
    for (size_t i = 0; i < mt.size(); ++i) {
      const Json& v = mt[i];
      if (v == "hash_moe") mlp.push_back(MlpType::kHashMoe);
      else if (v == "moe") mlp.push_back(MlpType::kMoe);
      else return FieldError(absl::StrCat("mlp_layer_types[", i, "]"), absl::StrCat("is ", v.dump(), "; supported: hash_moe, moe"));
    }
    if (static_cast<int64_t>(mlp.size()) < n) {
      return FieldError("mlp_layer_types", absl::StrCat("has ", mlp.size(), " entries for ", n, " layers"));
    }
  } else {
    ASSIGN_OR_RETURN(int64_t hash_layers, f.Int("num_hash_layers", 3));
    RETURN_IF_ERROR(AtLeast("num_hash_layers", hash_layers, 0));
    for (int64_t i = 0; i < n; ++i) mlp.push_back(i < hash_layers ? MlpType::kHashMoe : MlpType::kMoe);
  }
  mlp.resize(n);
  c.mlp_layer_types = std::move(mlp);
  return absl::OkStatus();
}

absl::Status ParseCompressRates(const Json& root, const Reader& f, DeepseekV4Config& c) {
  std::optional<int64_t> csa = 4, hca = 128;
  if (f.Has("compress_rates")) {
    const Json& cr = root["compress_rates"];
    if (!cr.is_object()) return FieldError("compress_rates", "must be an object");
    for (auto it = cr.begin(); it != cr.end(); ++it) {
      if (it.key() != kCsa && it.key() != kHca) {
        return FieldError(absl::StrCat("compress_rates.", it.key()),
                          absl::StrCat("is not a compressed layer type (", kCsa, ", ", kHca, ")"));
      }
    }
    // A rate the dictionary lacks is an error only where a layer of that type needs it.
    Reader r(cr, "compress_rates.");
    ASSIGN_OR_RETURN(csa, r.Int(kCsa));
    ASSIGN_OR_RETURN(hca, r.Int(kHca));
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> legacy_csa, f.Int("compress_rate_csa"));
  ASSIGN_OR_RETURN(std::optional<int64_t> legacy_hca, f.Int("compress_rate_hca"));
  if (legacy_csa) csa = legacy_csa;
  if (legacy_hca) hca = legacy_hca;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const AttentionType t = c.layer_types[i];
    if (t == AttentionType::kCompressedSparse && !csa) {
      return FieldError("compress_rates", absl::StrCat("lacks ", kCsa, ", which layer ", i, " is"));
    }
    if (t == AttentionType::kHeavilyCompressed && !hca) {
      return FieldError("compress_rates", absl::StrCat("lacks ", kHca, ", which layer ", i, " is"));
    }
  }
  c.compress_rate_csa = csa.value_or(4);
  c.compress_rate_hca = hca.value_or(128);
  RETURN_IF_ERROR(AtLeast(absl::StrCat("compress_rates.", kCsa), c.compress_rate_csa, 1));
  RETURN_IF_ERROR(AtLeast(absl::StrCat("compress_rates.", kHca), c.compress_rate_hca, 1));
  return absl::OkStatus();
}

// One rotary table from a dictionary of transformers' rope parameters. `defaults`
// supplies what the dictionary may leave out.
absl::Status ParseRopeTable(const Json& obj, const std::string& prefix, double default_theta,
                            double default_prf, bool default_attention_factor_one, const DeepseekV4Config& c,
                            RopeTable& t) {
  if (!obj.is_object()) return FieldError(prefix.substr(0, prefix.size() - 1), "must be an object");
  Reader f(obj, prefix);
  ASSIGN_OR_RETURN(t.rope.theta, f.Double("rope_theta", default_theta));
  if (t.rope.theta <= 1.0) return FieldError(f.Name("rope_theta"), "must be greater than 1");
  ASSIGN_OR_RETURN(double prf, f.Double("partial_rotary_factor", default_prf));
  if (prf <= 0.0 || prf > 1.0) return FieldError(f.Name("partial_rotary_factor"), "must be in (0, 1]");
  // Python's int(head_dim * factor): truncation of the product.
  t.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * prf);
  if (t.rotary_dim % 2 != 0) {
    return FieldError(f.Name("partial_rotary_factor"),
                      absl::StrCat("gives ", t.rotary_dim, " rotary dimensions, which is odd"));
  }
  const char* type_key = f.Has("rope_type") ? "rope_type" : "type";
  ASSIGN_OR_RETURN(std::optional<std::string> type, f.String(type_key));
  const std::string kind = type.value_or("default");
  t.rope.truncate = true;
  if (kind == "default") return absl::OkStatus();
  if (kind != "yarn") return FieldError(f.Name(type_key), absl::StrCat("is '", kind, "'; supported: default, yarn"));
  t.rope.yarn = true;
  ASSIGN_OR_RETURN(t.rope.original_max_position_embeddings,
                   f.Int("original_max_position_embeddings", c.max_position_embeddings));
  RETURN_IF_ERROR(AtLeast(f.Name("original_max_position_embeddings"), t.rope.original_max_position_embeddings, 1));
  ASSIGN_OR_RETURN(std::optional<double> factor, f.Double("factor"));
  t.rope.factor = factor ? *factor
                         : static_cast<double>(c.max_position_embeddings) /
                               static_cast<double>(t.rope.original_max_position_embeddings);
  if (t.rope.factor <= 0.0) return FieldError(f.Name("factor"), "must be positive");
  ASSIGN_OR_RETURN(double beta_fast, f.Double("beta_fast", 0.0));
  ASSIGN_OR_RETURN(double beta_slow, f.Double("beta_slow", 0.0));
  t.rope.beta_fast = beta_fast != 0.0 ? beta_fast : 32.0;  // transformers: `or 32`
  t.rope.beta_slow = beta_slow != 0.0 ? beta_slow : 1.0;
  ASSIGN_OR_RETURN(t.rope.mscale, f.Double("mscale", 0.0));
  ASSIGN_OR_RETURN(t.rope.mscale_all_dim, f.Double("mscale_all_dim", 0.0));
  ASSIGN_OR_RETURN(t.rope.attention_factor, f.Double("attention_factor"));
  if (!t.rope.attention_factor && default_attention_factor_one) t.rope.attention_factor = 1.0;
  return absl::OkStatus();
}

// The two rotary tables, as DeepseekV4Config.__post_init__ builds them: a nested
// {"main": {...}, "compress": {...}} dictionary is taken as it is; otherwise the flat
// parameters (rope_parameters, or the official rope_scaling) become the compress table
// at compress_rope_theta (YaRN with attention_factor 1 unless given), and main is plain
// RoPE at rope_theta.
absl::Status ParseRope(const Json& root, const Reader& f, DeepseekV4Config& c) {
  const char* key = f.Has("rope_parameters") ? "rope_parameters" : (f.Has("rope_scaling") ? "rope_scaling" : nullptr);
  const Json empty = Json::object();
  const Json& rp = key != nullptr ? root.at(key) : empty;
  if (!rp.is_object()) return FieldError(key, "must be an object");
  const std::string name = key != nullptr ? key : "rope_parameters";
  const bool nested = rp.contains("main") && rp["main"].is_object() && rp.contains("compress") &&
                      rp["compress"].is_object();
  if (nested) {
    // transformers' rope functions read partial_rotary_factor from the table itself,
    // 1.0 when a table lacks it.
    RETURN_IF_ERROR(ParseRopeTable(rp["main"], name + ".main.", c.rope_theta, 1.0, false, c, c.main_rope));
    RETURN_IF_ERROR(
        ParseRopeTable(rp["compress"], name + ".compress.", c.compress_rope_theta, 1.0, false, c, c.compress_rope));
    return absl::OkStatus();
  }
  Json main = {{"rope_type", "default"}};
  Json compress = Json::object();
  for (auto it = rp.begin(); it != rp.end(); ++it) {
    if (it.key() != "main" && it.key() != "compress" && it.key() != "rope_theta" &&
        it.key() != "partial_rotary_factor") {
      compress[it.key()] = it.value();
    }
  }
  RETURN_IF_ERROR(ParseRopeTable(main, name + ".", c.rope_theta, c.partial_rotary_factor, false, c, c.main_rope));
  RETURN_IF_ERROR(ParseRopeTable(compress, name + ".", c.compress_rope_theta, c.partial_rotary_factor, true, c,
                                 c.compress_rope));
  return absl::OkStatus();
}

absl::Status ParseQuantization(const Json& root, const Reader& f, DeepseekV4Config& c) {
  ASSIGN_OR_RETURN(std::optional<std::string> expert_dtype, f.String("expert_dtype"));
  c.expert_dtype = expert_dtype.value_or("");
  if (!c.expert_dtype.empty() && c.expert_dtype != "fp4" && c.expert_dtype != "fp8" && c.expert_dtype != "bf16") {
    return FieldError("expert_dtype", absl::StrCat("is '", c.expert_dtype, "'; supported: fp4, fp8, bf16"));
  }
  if (!f.Has("quantization_config")) return absl::OkStatus();
  const Json& q = root["quantization_config"];
  if (!q.is_object()) return FieldError("quantization_config", "must be an object");
  Reader r(q, "quantization_config.");
  ASSIGN_OR_RETURN(std::optional<std::string> method, r.String("quant_method"));
  if (method.value_or("") != "fp8") {
    return FieldError("quantization_config.quant_method", absl::StrCat("is '", method.value_or(""), "'; supported: fp8"));
  }
  ASSIGN_OR_RETURN(std::optional<std::string> fmt, r.String("fmt"));
  if (fmt && *fmt != "e4m3") return FieldError("quantization_config.fmt", absl::StrCat("is '", *fmt, "'; supported: e4m3"));
  ASSIGN_OR_RETURN(std::optional<std::string> scale_fmt, r.String("scale_fmt"));
  if (scale_fmt && *scale_fmt != "ue8m0") {
    return FieldError("quantization_config.scale_fmt", absl::StrCat("is '", *scale_fmt, "'; supported: ue8m0"));
  }
  if (r.Has("weight_block_size")) {
    const Json& b = q["weight_block_size"];
    if (!(b.is_array() && b.size() == 2 && b[0] == 128 && b[1] == 128)) {
      return FieldError("quantization_config.weight_block_size", absl::StrCat("is ", b.dump(), "; supported: [128, 128]"));
    }
  }
  c.fp8_block_quantized = true;
  return absl::OkStatus();
}

}  // namespace

const char* AttentionTypeName(AttentionType t) {
  switch (t) {
    case AttentionType::kSliding: return kSliding;
    case AttentionType::kCompressedSparse: return kCsa;
    case AttentionType::kHeavilyCompressed: return kHca;
  }
  return "?";
}

const char* MlpTypeName(MlpType t) { return t == MlpType::kHashMoe ? "hash_moe" : "moe"; }

std::vector<float> RopeTable::InverseFrequencies() const {
  // ModelConfig carries the V2/V3 implementation of the same transformers formulas
  // (default and YaRN, float32); only the rotary width and the RoPE parameters matter.
  ModelConfig m;
  m.qk_rope_head_dim = rotary_dim;
  m.rope = rope;
  return m.RopeInverseFrequencies();
}

double RopeTable::AttentionFactor() const {
  ModelConfig m;
  m.rope = rope;
  return m.RopeAttentionFactor();
}

int64_t DeepseekV4Config::CompressRate(AttentionType t) const {
  switch (t) {
    case AttentionType::kSliding: return 0;
    case AttentionType::kCompressedSparse: return compress_rate_csa;
    case AttentionType::kHeavilyCompressed: return compress_rate_hca;
  }
  return 0;
}

std::string DeepseekV4Config::Summary() const {
  int csa = 0, hca = 0, hash = 0;
  for (AttentionType t : layer_types) {
    csa += t == AttentionType::kCompressedSparse;
    hca += t == AttentionType::kHeavilyCompressed;
  }
  for (MlpType t : mlp_layer_types) hash += t == MlpType::kHashMoe;
  std::string s = absl::StrFormat(
      "deepseek_v4: %d layers (%d sliding, %d CSA/%d, %d HCA/%d; %d hash MoE), hidden %d x %d streams, %d heads of "
      "%d (rope %d), window %d, indexer %d heads of %d top %d, %d experts (top %d) + 1 shared, vocab %d",
      num_hidden_layers, num_hidden_layers - csa - hca, csa, compress_rate_csa, hca, compress_rate_hca, hash,
      hidden_size, hc_mult, num_attention_heads, head_dim, qk_rope_head_dim, sliding_window, index_n_heads,
      index_head_dim, index_topk, n_routed_experts, num_experts_per_tok, vocab_size);
  if (num_nextn_predict_layers > 0) absl::StrAppendFormat(&s, ", %d MTP layers", num_nextn_predict_layers);
  if (fp8_block_quantized) s += ", FP8 weights";
  if (!expert_dtype.empty()) absl::StrAppendFormat(&s, ", %s experts", expert_dtype);
  return s;
}

absl::StatusOr<DeepseekV4Config> ParseDeepseekV4Config(std::string_view config_json) {
  Json root = Json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("config.json: not valid JSON");
  if (!root.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  Reader f(root, "");
  DeepseekV4Config c;
  ASSIGN_OR_RETURN(std::optional<std::string> model_type, f.String("model_type"));
  if (!model_type) return FieldError("model_type", "is required");
  if (*model_type != "deepseek_v4") {
    return FieldError("model_type", absl::StrCat("is '", *model_type, "'; this parser reads deepseek_v4"));
  }

  ASSIGN_OR_RETURN(c.vocab_size, f.Int("vocab_size", c.vocab_size));
  ASSIGN_OR_RETURN(c.hidden_size, f.Int("hidden_size", c.hidden_size));
  // attribute_map: intermediate_size and num_local_experts name the same fields.
  ASSIGN_OR_RETURN(c.moe_intermediate_size, f.Int("intermediate_size", c.moe_intermediate_size));
  ASSIGN_OR_RETURN(c.moe_intermediate_size, f.Int("moe_intermediate_size", c.moe_intermediate_size));
  ASSIGN_OR_RETURN(c.num_hidden_layers, f.Int("num_hidden_layers", c.num_hidden_layers));
  ASSIGN_OR_RETURN(c.num_attention_heads, f.Int("num_attention_heads", c.num_attention_heads));
  ASSIGN_OR_RETURN(c.head_dim, f.Int("head_dim", c.head_dim));
  ASSIGN_OR_RETURN(c.q_lora_rank, f.Int("q_lora_rank", c.q_lora_rank));
  ASSIGN_OR_RETURN(c.num_experts_per_tok, f.Int("num_experts_per_tok", c.num_experts_per_tok));
  ASSIGN_OR_RETURN(c.n_routed_experts, f.Int("num_local_experts", c.n_routed_experts));
  ASSIGN_OR_RETURN(c.n_routed_experts, f.Int("n_routed_experts", c.n_routed_experts));
  ASSIGN_OR_RETURN(c.n_shared_experts, f.Int("n_shared_experts", c.n_shared_experts));
  ASSIGN_OR_RETURN(c.norm_topk_prob, f.Bool("norm_topk_prob", c.norm_topk_prob));
  ASSIGN_OR_RETURN(c.routed_scaling_factor, f.Double("routed_scaling_factor", c.routed_scaling_factor));
  ASSIGN_OR_RETURN(c.max_position_embeddings, f.Int("max_position_embeddings", c.max_position_embeddings));
  ASSIGN_OR_RETURN(c.rope_theta, f.Double("rope_theta", c.rope_theta));
  ASSIGN_OR_RETURN(c.compress_rope_theta, f.Double("compress_rope_theta", c.compress_rope_theta));
  ASSIGN_OR_RETURN(c.hc_mult, f.Int("hc_mult", c.hc_mult));
  ASSIGN_OR_RETURN(c.hc_sinkhorn_iters, f.Int("hc_sinkhorn_iters", c.hc_sinkhorn_iters));
  ASSIGN_OR_RETURN(c.hc_eps, f.Double("hc_eps", c.hc_eps));
  ASSIGN_OR_RETURN(c.swiglu_limit, f.Double("swiglu_limit", c.swiglu_limit));
  ASSIGN_OR_RETURN(c.sliding_window, f.Int("sliding_window", c.sliding_window));
  ASSIGN_OR_RETURN(c.o_groups, f.Int("o_groups", c.o_groups));
  ASSIGN_OR_RETURN(c.o_lora_rank, f.Int("o_lora_rank", c.o_lora_rank));
  ASSIGN_OR_RETURN(c.index_n_heads, f.Int("index_n_heads", c.index_n_heads));
  ASSIGN_OR_RETURN(c.index_head_dim, f.Int("index_head_dim", c.index_head_dim));
  ASSIGN_OR_RETURN(c.index_topk, f.Int("index_topk", c.index_topk));
  ASSIGN_OR_RETURN(c.num_nextn_predict_layers, f.Int("num_nextn_predict_layers", c.num_nextn_predict_layers));
  ASSIGN_OR_RETURN(c.rms_norm_eps, f.Double("rms_norm_eps", c.rms_norm_eps));
  ASSIGN_OR_RETURN(c.tie_word_embeddings, f.Bool("tie_word_embeddings", c.tie_word_embeddings));

  for (auto [name, v, min] : {std::tuple{"vocab_size", c.vocab_size, 1}, {"hidden_size", c.hidden_size, 1},
                              {"moe_intermediate_size", c.moe_intermediate_size, 1},
                              {"num_hidden_layers", c.num_hidden_layers, 1},
                              {"num_attention_heads", c.num_attention_heads, 1}, {"head_dim", c.head_dim, 2},
                              {"q_lora_rank", c.q_lora_rank, 1}, {"n_routed_experts", c.n_routed_experts, 1},
                              {"num_experts_per_tok", c.num_experts_per_tok, 1},
                              {"n_shared_experts", c.n_shared_experts, 0},
                              {"max_position_embeddings", c.max_position_embeddings, 1}, {"hc_mult", c.hc_mult, 1},
                              {"hc_sinkhorn_iters", c.hc_sinkhorn_iters, 1}, {"sliding_window", c.sliding_window, 1},
                              {"o_groups", c.o_groups, 1}, {"o_lora_rank", c.o_lora_rank, 1},
                              {"index_n_heads", c.index_n_heads, 1}, {"index_head_dim", c.index_head_dim, 2},
                              {"index_topk", c.index_topk, 1},
                              {"num_nextn_predict_layers", c.num_nextn_predict_layers, 0}}) {
    RETURN_IF_ERROR(AtLeast(name, v, min));
  }
  if (c.num_experts_per_tok > c.n_routed_experts) {
    return FieldError("num_experts_per_tok", absl::StrCat("(", c.num_experts_per_tok, ") exceeds n_routed_experts (",
                                                          c.n_routed_experts, ")"));
  }
  if (c.num_attention_heads % c.o_groups != 0) {
    return FieldError("o_groups", absl::StrCat("(", c.o_groups, ") must divide num_attention_heads (",
                                               c.num_attention_heads, ")"));
  }
  ASSIGN_OR_RETURN(int64_t kv_heads, f.Int("num_key_value_heads", 1));
  if (kv_heads != 1) {
    return FieldError("num_key_value_heads", absl::StrCat("is ", kv_heads, "; DeepSeek-V4 has one shared K=V head"));
  }
  if (c.rms_norm_eps <= 0) return FieldError("rms_norm_eps", "must be positive");
  if (c.hc_eps < 0) return FieldError("hc_eps", "must not be negative");
  if (c.swiglu_limit <= 0) return FieldError("swiglu_limit", "must be positive");
  if (c.rope_theta <= 1.0) return FieldError("rope_theta", "must be greater than 1");
  if (c.compress_rope_theta <= 1.0) return FieldError("compress_rope_theta", "must be greater than 1");

  ASSIGN_OR_RETURN(std::optional<std::string> scoring, f.String("scoring_func"));
  const std::string s = scoring.value_or("sqrtsoftplus");
  if (s == "sqrtsoftplus") c.scoring_func = ScoringFunc::kSqrtSoftplus;
  else if (s == "softmax") c.scoring_func = ScoringFunc::kSoftmax;
  else if (s == "sigmoid") c.scoring_func = ScoringFunc::kSigmoid;
  else return FieldError("scoring_func", absl::StrCat("is '", s, "'; supported: sqrtsoftplus, softmax, sigmoid"));

  ASSIGN_OR_RETURN(std::optional<std::string> act, f.String("hidden_act"));
  if (act && *act != "silu") return FieldError("hidden_act", absl::StrCat("is '", *act, "'; supported: silu"));
  ASSIGN_OR_RETURN(bool attention_bias, f.Bool("attention_bias", false));
  if (attention_bias) return FieldError("attention_bias", "is true; DeepSeek-V4 has no attention biases");
  ASSIGN_OR_RETURN(bool mlp_bias, f.Bool("mlp_bias", false));
  if (mlp_bias) return FieldError("mlp_bias", "is true; DeepSeek-V4 has no MLP biases");
  ASSIGN_OR_RETURN(std::optional<std::string> topk_method, f.String("topk_method"));
  c.topk_method = topk_method.value_or("");

  // partial_rotary_factor, else qk_rope_head_dim / head_dim, else 64 / 512.
  ASSIGN_OR_RETURN(std::optional<double> prf, f.Double("partial_rotary_factor"));
  ASSIGN_OR_RETURN(std::optional<int64_t> qk_rope, f.Int("qk_rope_head_dim"));
  if (prf) c.partial_rotary_factor = *prf;
  else if (qk_rope) c.partial_rotary_factor = static_cast<double>(*qk_rope) / static_cast<double>(c.head_dim);
  else c.partial_rotary_factor = 64.0 / 512.0;
  if (c.partial_rotary_factor <= 0.0 || c.partial_rotary_factor > 1.0) {
    return FieldError(prf ? "partial_rotary_factor" : "qk_rope_head_dim", "must give a rotary part in (0, head_dim]");
  }
  c.qk_rope_head_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * c.partial_rotary_factor);
  if (c.qk_rope_head_dim % 2 != 0) {
    return FieldError(prf ? "partial_rotary_factor" : "qk_rope_head_dim",
                      absl::StrCat("gives ", c.qk_rope_head_dim, " rotary dimensions, which is odd"));
  }

  RETURN_IF_ERROR(ParseLayerTypes(root, f, c));
  RETURN_IF_ERROR(ParseCompressRates(root, f, c));
  RETURN_IF_ERROR(ParseRope(root, f, c));
  for (const RopeTable* t : {&c.main_rope, &c.compress_rope}) {
    const char* which = t == &c.main_rope ? "main" : "compress";
    if (t->rotary_dim > c.head_dim) {
      return FieldError("partial_rotary_factor", absl::StrCat("gives the ", which, " table ", t->rotary_dim,
                                                              " rotary dimensions, more than head_dim"));
    }
  }
  if (c.compress_rope.rotary_dim > c.index_head_dim) {
    return FieldError("index_head_dim", absl::StrCat("(", c.index_head_dim, ") is smaller than the ",
                                                     c.compress_rope.rotary_dim, " rotary dimensions the indexer rotates"));
  }
  RETURN_IF_ERROR(ParseQuantization(root, f, c));

  ASSIGN_OR_RETURN(c.bos_token_id, f.Int("bos_token_id"));
  if (!root.contains("bos_token_id")) c.bos_token_id = 0;  // transformers' default; null means none
  // null means none (as transformers reads it); absent keeps the default.
  ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> eos, f.IntList("eos_token_id"));
  if (root.contains("eos_token_id")) c.eos_token_ids = eos.value_or(std::vector<int64_t>{});
  return c;
}

absl::StatusOr<DeepseekV4Config> LoadDeepseekV4Config(const std::string& dir) {
  return LoadConfigFile(dir, [](const std::string& text) { return ParseDeepseekV4Config(text); });
}

}  // namespace tandem::v4
