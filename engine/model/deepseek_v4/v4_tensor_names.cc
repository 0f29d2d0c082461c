#include "engine/model/deepseek_v4/v4_tensor_names.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tandem::v4 {
namespace {

// Official suffix within a layer ("attn.wq_a.weight") -> transformers' module suffix.
// Longer, more specific entries first: the first match wins.
constexpr std::pair<std::string_view, std::string_view> kModuleRenames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"hc_attn_fn", "attn_hc.fn"},
    {"hc_attn_base", "attn_hc.base"},
    {"hc_attn_scale", "attn_hc.scale"},
    {"hc_ffn_fn", "ffn_hc.fn"},
    {"hc_ffn_base", "ffn_hc.base"},
    {"hc_ffn_scale", "ffn_hc.scale"},
    {"attn.indexer.compressor.wkv.weight", "self_attn.compressor.indexer.kv_proj.weight"},
    {"attn.indexer.compressor.wgate.weight", "self_attn.compressor.indexer.gate_proj.weight"},
    {"attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"},
    {"attn.indexer.compressor.norm.weight", "self_attn.compressor.indexer.kv_norm.weight"},
    {"attn.indexer.wq_b.weight", "self_attn.compressor.indexer.q_b_proj.weight"},
    {"attn.indexer.weights_proj.weight", "self_attn.compressor.indexer.scorer.weights_proj.weight"},
    {"attn.compressor.wkv.weight", "self_attn.compressor.kv_proj.weight"},
    {"attn.compressor.wgate.weight", "self_attn.compressor.gate_proj.weight"},
    {"attn.compressor.ape", "self_attn.compressor.position_bias"},
    {"attn.compressor.norm.weight", "self_attn.compressor.kv_norm.weight"},
    {"attn.wq_a.weight", "self_attn.q_a_proj.weight"},
    {"attn.q_norm.weight", "self_attn.q_a_norm.weight"},
    {"attn.wq_b.weight", "self_attn.q_b_proj.weight"},
    {"attn.wkv.weight", "self_attn.kv_proj.weight"},
    {"attn.kv_norm.weight", "self_attn.kv_norm.weight"},
    {"attn.wo_a.weight", "self_attn.o_a_proj.weight"},
    {"attn.wo_b.weight", "self_attn.o_b_proj.weight"},
    {"attn.attn_sink", "self_attn.sinks"},
    {"ffn.gate.weight", "mlp.gate.weight"},
    {"ffn.gate.bias", "mlp.gate.e_score_correction_bias"},
    {"ffn.gate.tid2eid", "mlp.gate.tid2eid"},
    {"ffn.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
    {"ffn.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"},
    {"ffn.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
};

constexpr std::pair<std::string_view, std::string_view> kModuleTopLevel[] = {
    {"embed.weight", "model.embed_tokens.weight"}, {"head.weight", "lm_head.weight"},
    {"norm.weight", "model.norm.weight"},          {"hc_head_fn", "model.hc_head.hc_fn"},
    {"hc_head_base", "model.hc_head.hc_base"},     {"hc_head_scale", "model.hc_head.hc_scale"},
};

// "layers.12.attn.wq_a.weight" -> {"layers.12.", "attn.wq_a.weight"}; false for other names.
bool SplitLayer(const std::string& name, std::string* prefix, std::string* rest) {
  if (!absl::StartsWith(name, "layers.")) return false;
  const size_t dot = name.find('.', 7);
  if (dot == std::string::npos) return false;
  *prefix = name.substr(0, dot + 1);
  *rest = name.substr(dot + 1);
  return true;
}

}  // namespace

const char* TensorNamingName(TensorNaming n) {
  switch (n) {
    case TensorNaming::kOfficial: return "official";
    case TensorNaming::kTransformersSaved: return "transformers-saved";
    case TensorNaming::kTransformersModules: return "transformers-modules";
  }
  return "?";
}

std::vector<std::string> CandidateNames(TensorNaming naming, const std::string& official) {
  if (naming == TensorNaming::kOfficial || absl::StartsWith(official, "mtp.")) return {official};
  std::string prefix, rest;
  const bool in_layer = SplitLayer(official, &prefix, &rest);
  if (naming == TensorNaming::kTransformersSaved) {
    if (official == "embed.weight") return {"model.embed_tokens.weight"};
    if (official == "head.weight") return {"head.weight", "lm_head.weight"};
    if (official == "norm.weight") return {"model.norm.weight"};
    if (official == "hc_head_fn") return {"model.hc_head.hc_fn"};
    if (official == "hc_head_base") return {"model.hc_head.hc_base"};
    if (official == "hc_head_scale") return {"model.hc_head.hc_scale"};
    // save_pretrained writes the attention's kv_norm back as "attn.norm" (its reverse of
    // the compressors' norm -> kv_norm rename).
    if (in_layer && rest == "attn.kv_norm.weight") {
      return {absl::StrCat("model.", prefix, "attn.norm.weight"), absl::StrCat("model.", prefix, rest)};
    }
    return {absl::StrCat("model.", official)};
  }
  for (const auto& [from, to] : kModuleTopLevel) {
    if (official == from) return {std::string(to)};
  }
  if (!in_layer) return {absl::StrCat("model.", official)};
  for (const auto& [from, to] : kModuleRenames) {
    if (rest == from) return {absl::StrCat("model.", prefix, std::string(to))};
  }
  if (absl::StartsWith(rest, "ffn.experts.")) return {};
  return {absl::StrCat("model.", official)};
}

std::vector<FusedExpertNames> FusedExperts(TensorNaming naming, int64_t layer) {
  std::vector<FusedExpertNames> names;
  for (const char* block : {"ffn", "mlp"}) {
    if (naming != TensorNaming::kTransformersSaved && block == std::string_view("ffn")) continue;
    const std::string p = absl::StrCat("model.layers.", layer, ".", block, ".experts.");
    names.push_back({p + "gate_up_proj", p + "down_proj"});
  }
  return names;
}

std::vector<std::string> ScaleNames(const std::string& weight_name) {
  std::vector<std::string> names;
  if (absl::EndsWith(weight_name, ".weight")) {
    names.push_back(weight_name.substr(0, weight_name.size() - 6) + "scale");
  }
  names.push_back(weight_name + "_scale_inv");
  return names;
}

}  // namespace tandem::v4
