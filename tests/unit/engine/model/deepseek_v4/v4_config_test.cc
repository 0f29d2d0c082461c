// DeepseekV4Config parsing: both key sets, transformers' defaults, and errors naming the
// field. Expected values come from shared/models/deepseek-v4.md §1 (what transformers
// 5.17 derives from the published V4-Flash config.json) and §2.2 (inverse frequencies
// transformers computes), not from this parser.
#include "engine/model/deepseek_v4/v4_config.h"

#include <cmath>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::v4 {
namespace {

using Json = nlohmann::json;
using AT = AttentionType;

// The published V4-Flash-Base config.json, as §1.3 lists its keys.
Json FlashOfficial() {
  std::vector<int> ratios = {0, 0};
  for (int i = 0; i < 20; ++i) {
    ratios.push_back(4);
    ratios.push_back(128);
  }
  ratios.push_back(4);
  ratios.push_back(0);  // MTP
  return Json{{"architectures", {"DeepseekV4ForCausalLM"}},
              {"model_type", "deepseek_v4"},
              {"vocab_size", 129280},
              {"hidden_size", 4096},
              {"moe_intermediate_size", 2048},
              {"num_hidden_layers", 43},
              {"num_attention_heads", 64},
              {"num_key_value_heads", 1},
              {"head_dim", 512},
              {"q_lora_rank", 1024},
              {"qk_rope_head_dim", 64},
              {"num_experts_per_tok", 6},
              {"n_routed_experts", 256},
              {"n_shared_experts", 1},
              {"scoring_func", "sqrtsoftplus"},
              {"norm_topk_prob", true},
              {"routed_scaling_factor", 1.5},
              {"max_position_embeddings", 1048576},
              {"rope_theta", 10000},
              {"compress_rope_theta", 160000},
              {"rope_scaling",
               {{"type", "yarn"}, {"factor", 16}, {"original_max_position_embeddings", 65536}, {"beta_fast", 32},
                {"beta_slow", 1}}},
              {"compress_ratios", ratios},
              {"num_hash_layers", 3},
              {"hc_mult", 4},
              {"hc_sinkhorn_iters", 20},
              {"hc_eps", 1e-6},
              {"swiglu_limit", 10.0},
              {"sliding_window", 128},
              {"o_groups", 8},
              {"o_lora_rank", 1024},
              {"index_n_heads", 64},
              {"index_head_dim", 128},
              {"index_topk", 512},
              {"num_nextn_predict_layers", 1},
              {"rms_norm_eps", 1e-6},
              {"topk_method", "noaux_tc"},
              {"torch_dtype", "bfloat16"},
              {"bos_token_id", 0},
              {"eos_token_id", 1}};
}

// §6's tiny config in transformers' keys.
Json TinyHf() {
  return Json{{"model_type", "deepseek_v4"},
              {"vocab_size", 128},
              {"hidden_size", 64},
              {"num_attention_heads", 4},
              {"head_dim", 32},
              {"partial_rotary_factor", 0.25},
              {"q_lora_rank", 32},
              {"o_groups", 2},
              {"o_lora_rank", 16},
              {"n_routed_experts", 4},
              {"num_experts_per_tok", 2},
              {"moe_intermediate_size", 64},
              {"num_hidden_layers", 4},
              {"layer_types",
               {"sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                "compressed_sparse_attention"}},
              {"mlp_layer_types", {"hash_moe", "moe", "moe", "moe"}},
              {"sliding_window", 8},
              {"compress_rates", {{"compressed_sparse_attention", 4}, {"heavily_compressed_attention", 8}}},
              {"index_n_heads", 8},
              {"index_head_dim", 16},
              {"index_topk", 2},
              {"hc_mult", 2},
              {"hc_sinkhorn_iters", 3},
              {"max_position_embeddings", 64},
              {"num_nextn_predict_layers", 0},
              {"rope_parameters",
               {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 16}, {"beta_fast", 32},
                {"beta_slow", 1}}}};
}

DeepseekV4Config Parse(const Json& j) {
  absl::StatusOr<DeepseekV4Config> c = ParseDeepseekV4Config(j.dump());
  EXPECT_TRUE(c.ok()) << c.status();
  return c.value_or(DeepseekV4Config{});
}

absl::Status ParseEdited(Json j, const std::function<void(Json&)>& edit) {
  edit(j);
  return ParseDeepseekV4Config(j.dump()).status();
}

void ExpectFieldError(const absl::Status& s, const std::string& field) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("'" + field + "'"), std::string::npos) << s;
}

TEST(DeepseekV4ConfigTest, OfficialFlashKeysGiveTransformersSchedule) {
  const DeepseekV4Config c = Parse(FlashOfficial());
  ASSERT_EQ(c.layer_types.size(), 43u);
  EXPECT_EQ(c.layer_types[0], AT::kSliding);
  EXPECT_EQ(c.layer_types[1], AT::kSliding);
  int csa = 0, hca = 0;
  for (int i = 2; i < 43; ++i) {
    EXPECT_EQ(c.layer_types[i], i % 2 == 0 ? AT::kCompressedSparse : AT::kHeavilyCompressed) << i;
    csa += c.layer_types[i] == AT::kCompressedSparse;
    hca += c.layer_types[i] == AT::kHeavilyCompressed;
  }
  EXPECT_EQ(csa, 21);
  EXPECT_EQ(hca, 20);
  EXPECT_EQ(c.mtp_attention_type, AT::kSliding);
  ASSERT_EQ(c.mlp_layer_types.size(), 43u);
  for (int i = 0; i < 43; ++i) EXPECT_EQ(c.mlp_layer_types[i], i < 3 ? MlpType::kHashMoe : MlpType::kMoe) << i;
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_DOUBLE_EQ(c.partial_rotary_factor, 0.125);
  EXPECT_EQ(c.compress_rate_csa, 4);
  EXPECT_EQ(c.compress_rate_hca, 128);
  EXPECT_EQ(c.CompressRate(2), 4);
  EXPECT_EQ(c.CompressRate(3), 128);
  EXPECT_EQ(c.CompressRate(0), 0);
  EXPECT_EQ(c.o_group_in(), 64 * 512 / 8);
  EXPECT_EQ(c.topk_method, "noaux_tc");
  // main: plain RoPE at 10000; compress: YaRN at 160000 with attention_factor forced to 1.
  EXPECT_FALSE(c.main_rope.rope.yarn);
  EXPECT_DOUBLE_EQ(c.main_rope.rope.theta, 10000.0);
  EXPECT_EQ(c.main_rope.rotary_dim, 64);
  EXPECT_TRUE(c.compress_rope.rope.yarn);
  EXPECT_DOUBLE_EQ(c.compress_rope.rope.theta, 160000.0);
  EXPECT_DOUBLE_EQ(c.compress_rope.rope.factor, 16.0);
  EXPECT_EQ(c.compress_rope.rope.original_max_position_embeddings, 65536);
  EXPECT_DOUBLE_EQ(c.compress_rope.AttentionFactor(), 1.0);
  EXPECT_DOUBLE_EQ(c.main_rope.AttentionFactor(), 1.0);
}

TEST(DeepseekV4ConfigTest, InverseFrequenciesMatchTransformers) {
  const DeepseekV4Config c = Parse(FlashOfficial());
  // §2.2, checked with transformers 5.17: compress[0:4] = 1.0, 0.68766, 0.47287, 0.32517;
  // compress[28:32] from about 1.747e-6 down to 5.68e-7; main[1] = 0.74989.
  const std::vector<float> compress = c.compress_rope.InverseFrequencies();
  const std::vector<float> main = c.main_rope.InverseFrequencies();
  ASSERT_EQ(compress.size(), 32u);
  ASSERT_EQ(main.size(), 32u);
  EXPECT_FLOAT_EQ(compress[0], 1.0f);
  EXPECT_NEAR(compress[1], 0.68766, 5e-6);
  EXPECT_NEAR(compress[2], 0.47287, 5e-6);
  EXPECT_NEAR(compress[3], 0.32517, 5e-6);
  EXPECT_NEAR(compress[28], 1.747e-6, 1e-9);
  EXPECT_NEAR(compress[31], 5.68e-7, 1e-9);
  EXPECT_NEAR(main[1], 0.74989, 5e-6);
}

TEST(DeepseekV4ConfigTest, TransformersKeysOfTheTinyTestConfig) {
  const DeepseekV4Config c = Parse(TinyHf());
  EXPECT_EQ(c.layer_types, (std::vector<AT>{AT::kSliding, AT::kCompressedSparse, AT::kHeavilyCompressed,
                                            AT::kCompressedSparse}));
  EXPECT_EQ(c.mlp_layer_types, (std::vector<MlpType>{MlpType::kHashMoe, MlpType::kMoe, MlpType::kMoe, MlpType::kMoe}));
  EXPECT_EQ(c.compress_rate_hca, 8);
  EXPECT_EQ(c.qk_rope_head_dim, 8);
  EXPECT_EQ(c.main_rope.rotary_dim, 8);
  EXPECT_EQ(c.compress_rope.rotary_dim, 8);
  EXPECT_TRUE(c.compress_rope.rope.yarn);
  EXPECT_DOUBLE_EQ(c.compress_rope.rope.theta, 160000.0);
  EXPECT_DOUBLE_EQ(c.compress_rope.AttentionFactor(), 1.0);
  EXPECT_FALSE(c.main_rope.rope.yarn);
  EXPECT_EQ(c.hc_mult, 2);
  EXPECT_EQ(c.hc_sinkhorn_iters, 3);
  EXPECT_EQ(c.num_nextn_predict_layers, 0);
  // Defaults of fields the config leaves out.
  EXPECT_EQ(c.scoring_func, ScoringFunc::kSqrtSoftplus);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 1.5);
  EXPECT_DOUBLE_EQ(c.swiglu_limit, 10.0);
  EXPECT_DOUBLE_EQ(c.hc_eps, 1e-6);
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{1});
}

TEST(DeepseekV4ConfigTest, DefaultsAreTheFlashValuesAndTheProSchedule) {
  const DeepseekV4Config c = Parse(Json{{"model_type", "deepseek_v4"}});
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_hidden_layers, 43);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.index_topk, 512);
  EXPECT_EQ(c.sliding_window, 128);
  // Neither layer_types nor compress_ratios: [HCA, HCA] + [HCA, CSA, HCA, CSA, ...].
  ASSERT_EQ(c.layer_types.size(), 43u);
  for (int i = 0; i < 43; ++i) {
    const AT want = i < 2 || i % 2 == 0 ? AT::kHeavilyCompressed : AT::kCompressedSparse;
    EXPECT_EQ(c.layer_types[i], want) << i;
  }
  // No rope_scaling: the compress table is plain RoPE at compress_rope_theta.
  EXPECT_FALSE(c.compress_rope.rope.yarn);
  EXPECT_DOUBLE_EQ(c.compress_rope.rope.theta, 160000.0);
}

TEST(DeepseekV4ConfigTest, NestedRopeParametersAreTakenAsTheyAre) {
  Json j = TinyHf();
  j["rope_parameters"] = {
      {"main", {{"rope_type", "default"}, {"rope_theta", 5000.0}, {"partial_rotary_factor", 0.25}}},
      {"compress",
       {{"rope_type", "yarn"}, {"rope_theta", 160000.0}, {"partial_rotary_factor", 0.25}, {"factor", 4.0},
        {"original_max_position_embeddings", 16}, {"attention_factor", 1.0}}}};
  const DeepseekV4Config c = Parse(j);
  EXPECT_DOUBLE_EQ(c.main_rope.rope.theta, 5000.0);
  EXPECT_TRUE(c.compress_rope.rope.yarn);
  EXPECT_DOUBLE_EQ(c.compress_rope.AttentionFactor(), 1.0);
  // A nested YaRN table without attention_factor gets transformers' 0.1 ln(factor) + 1.
  j["rope_parameters"]["compress"].erase("attention_factor");
  EXPECT_NEAR(Parse(j).compress_rope.AttentionFactor(), 0.1 * std::log(4.0) + 1.0, 1e-12);
}

TEST(DeepseekV4ConfigTest, LegacyRatesFoldIn) {
  Json j = TinyHf();
  j.erase("compress_rates");
  j["compress_rate_csa"] = 4;
  j["compress_rate_hca"] = 16;
  EXPECT_EQ(Parse(j).compress_rate_hca, 16);
  // qk_rope_head_dim when partial_rotary_factor is absent.
  j.erase("partial_rotary_factor");
  j["qk_rope_head_dim"] = 16;
  EXPECT_EQ(Parse(j).qk_rope_head_dim, 16);
  EXPECT_EQ(Parse(j).compress_rope.rotary_dim, 16);
  // intermediate_size and num_local_experts are transformers' aliases.
  j.erase("moe_intermediate_size");
  j["intermediate_size"] = 48;
  j.erase("n_routed_experts");
  j["num_local_experts"] = 6;
  EXPECT_EQ(Parse(j).moe_intermediate_size, 48);
  EXPECT_EQ(Parse(j).n_routed_experts, 6);
}

TEST(DeepseekV4ConfigTest, QuantizationConfigOfTheInstructCheckpoints) {
  Json j = FlashOfficial();
  j["expert_dtype"] = "fp4";
  j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"scale_fmt", "ue8m0"},
                              {"activation_scheme", "dynamic"}, {"weight_block_size", {128, 128}}};
  const DeepseekV4Config c = Parse(j);
  EXPECT_TRUE(c.fp8_block_quantized);
  EXPECT_EQ(c.expert_dtype, "fp4");
}

TEST(DeepseekV4ConfigTest, BadValuesNameTheField) {
  const Json tiny = TinyHf();
  ExpectFieldError(ParseEdited(tiny, [](Json& j) { j["model_type"] = "deepseek_v3"; }), "model_type");
  ExpectFieldError(ParseEdited(tiny, [](Json& j) { j["layer_types"][1] = "full_attention"; }), "layer_types[1]");
  ExpectFieldError(ParseEdited(tiny, [](Json& j) { j["layer_types"].erase(3); }), "layer_types");
  ExpectFieldError(ParseEdited(tiny, [](Json& j) { j["mlp_layer_types"][0] = "dense"; }), "mlp_layer_types[0]");
  ExpectFieldError(ParseEdited(tiny,
                               [](Json& j) {
                                 j.erase("layer_types");
                                 j["compress_ratios"] = {0, 4, 16, 4};
                               }),
                   "compress_ratios[2]");
  ExpectFieldError(ParseEdited(tiny, [](Json& j) { j["compress_rates"] = {{"compressed_sparse_attention", 4}}; }),
                   "compress_rates");
  ExpectFieldError(ParseEdited(tiny, [](Json& j) { j["compress_rates"]["sliding_attention"] = 2; }),
                   "compress_rates.sliding_attention");
  ExpectFieldError(ParseEdited(tiny, [](Json& j) { j["scoring_func"] = "relu"; }), "scoring_func");
  ExpectFieldError(ParseEdited(tiny, [](Json& j) { j["num_key_value_heads"] = 4; }), "num_key_value_heads");
  ExpectFieldError(ParseEdited(tiny, [](Json& j) { j["o_groups"] = 3; }), "o_groups");
  ExpectFieldError(ParseEdited(tiny, [](Json& j) { j["num_experts_per_tok"] = 5; }), "num_experts_per_tok");
  ExpectFieldError(ParseEdited(tiny, [](Json& j) { j["hidden_size"] = "64"; }), "hidden_size");
  ExpectFieldError(ParseEdited(tiny, [](Json& j) { j["sliding_window"] = 0; }), "sliding_window");
  ExpectFieldError(ParseEdited(tiny, [](Json& j) { j["hidden_act"] = "gelu"; }), "hidden_act");
  ExpectFieldError(ParseEdited(tiny, [](Json& j) { j["rope_parameters"]["rope_type"] = "llama3"; }),
                   "rope_parameters.rope_type");
  ExpectFieldError(ParseEdited(tiny, [](Json& j) { j["partial_rotary_factor"] = 0.15625; }),  // 5 dims
                   "partial_rotary_factor");
  ExpectFieldError(ParseEdited(tiny, [](Json& j) { j["index_head_dim"] = 4; }), "index_head_dim");
  ExpectFieldError(ParseEdited(tiny, [](Json& j) { j["quantization_config"] = {{"quant_method", "gptq"}}; }),
                   "quantization_config.quant_method");
  ExpectFieldError(ParseEdited(tiny, [](Json& j) { j["expert_dtype"] = "int4"; }), "expert_dtype");
  EXPECT_EQ(ParseDeepseekV4Config("[1]").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseDeepseekV4Config("{").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::v4
