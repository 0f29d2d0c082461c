#include "engine/model/model_config.h"

#include <cmath>

#include "engine/model/model_generator.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

nlohmann::json Tiny() { return nlohmann::json::parse(PresetConfig("tiny").value()); }

absl::Status ParseWith(const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = Tiny();
  j["vocab_size"] = 1024;
  edit(j);
  return ParseModelConfig(j.dump()).status();
}

TEST(ModelConfigTest, ParsesDeepseekV3Preset) {
  nlohmann::json j = Tiny();
  j["vocab_size"] = 1024;
  absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "deepseek_v3");
  EXPECT_EQ(c->q_lora_rank, 64);
  EXPECT_EQ(c->kv_entry_dim(), 64 + 16);
  EXPECT_EQ(c->topk_method, TopkMethod::kNoauxTc);
  EXPECT_EQ(c->scoring_func, ScoringFunc::kSigmoid);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_TRUE(c->rope.yarn);
  EXPECT_EQ(c->num_nextn_predict_layers, 1);
  EXPECT_FALSE(c->IsMoeLayer(0));
  EXPECT_TRUE(c->IsMoeLayer(1));
  EXPECT_EQ(c->eos_token_ids, std::vector<int64_t>{1});
  // YaRN: mscale == mscale_all_dim gives attention factor 1 and softmax scale
  // (0.1 ln 4 + 1)^2 / sqrt(48).
  EXPECT_DOUBLE_EQ(c->RopeAttentionFactor(), 1.0);
  const double m = 0.1 * std::log(4.0) + 1.0;
  EXPECT_NEAR(c->SoftmaxScale(), m * m / std::sqrt(48.0), 1e-12);
}

TEST(ModelConfigTest, ParsesDeepseekV2Preset) {
  nlohmann::json j = nlohmann::json::parse(PresetConfig("tiny-v2").value());
  j["vocab_size"] = 1024;
  absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->q_lora_rank.has_value());
  EXPECT_EQ(c->topk_method, TopkMethod::kGroupLimitedGreedy);
  EXPECT_EQ(c->scoring_func, ScoringFunc::kSoftmax);
}

TEST(ModelConfigTest, RopeParametersAndRopeScalingAreEquivalent) {
  // transformers 5 writes rope_parameters (theta inside); DeepSeek's own configs write
  // rope_scaling plus a top-level rope_theta.
  nlohmann::json legacy = Tiny();
  legacy["vocab_size"] = 1024;
  legacy["rope_theta"] = 20000;
  nlohmann::json modern = legacy;
  modern.erase("rope_scaling");
  modern.erase("rope_theta");
  modern["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 20000}, {"factor", 4.0},
                               {"original_max_position_embeddings", 1024}, {"beta_fast", 32},
                               {"beta_slow", 1}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}};
  absl::StatusOr<ModelConfig> a = ParseModelConfig(legacy.dump());
  absl::StatusOr<ModelConfig> b = ParseModelConfig(modern.dump());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->RopeInverseFrequencies(), b->RopeInverseFrequencies());
  EXPECT_EQ(a->rope.theta, 20000);
  EXPECT_EQ(a->SoftmaxScale(), b->SoftmaxScale());
}

TEST(ModelConfigTest, YarnInverseFrequenciesInterpolateLowFrequencies) {
  nlohmann::json j = Tiny();
  j["vocab_size"] = 1024;
  ModelConfig yarn = ParseModelConfig(j.dump()).value();
  j.erase("rope_scaling");
  ModelConfig plain = ParseModelConfig(j.dump()).value();
  const std::vector<float> y = yarn.RopeInverseFrequencies(), p = plain.RopeInverseFrequencies();
  ASSERT_EQ(y.size(), 8u);
  EXPECT_FLOAT_EQ(y[0], p[0]);                           // fastest: extrapolated, unchanged
  EXPECT_NEAR(y.back(), p.back() / 4.0f, 1e-9f);         // slowest: interpolated by the factor
}

TEST(ModelConfigTest, ErrorsNameTheField) {
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](auto& j) { j["model_type"] = "llama"; }, "model_type"},
      {[](auto& j) { j.erase("model_type"); }, "model_type"},
      {[](auto& j) { j["topk_method"] = "random"; }, "topk_method"},
      {[](auto& j) { j["scoring_func"] = "relu"; }, "scoring_func"},
      {[](auto& j) { j["hidden_act"] = "gelu"; }, "hidden_act"},
      {[](auto& j) { j["rope_scaling"]["type"] = "dynamic"; }, "rope_scaling.type"},
      {[](auto& j) { j["n_group"] = 3; }, "n_group"},
      {[](auto& j) { j["topk_group"] = 5; }, "topk_group"},
      {[](auto& j) { j["num_experts_per_tok"] = 9; }, "num_experts_per_tok"},
      {[](auto& j) { j["hidden_size"] = "big"; }, "hidden_size"},
      {[](auto& j) { j["hidden_size"] = -4; }, "hidden_size"},
      {[](auto& j) { j["num_key_value_heads"] = 2; }, "num_key_value_heads"},
      {[](auto& j) { j["qk_rope_head_dim"] = 15; }, "qk_rope_head_dim"},
      {[](auto& j) { j["attention_bias"] = true; }, "attention_bias"},
      {[](auto& j) { j["rms_norm_eps"] = 0; }, "rms_norm_eps"},
      {[](auto& j) { j["norm_topk_prob"] = "yes"; }, "norm_topk_prob"},
      {[](auto& j) { j["eos_token_id"] = "x"; }, "eos_token_id"},
      {[](auto& j) { j["quantization_config"] = {{"quant_method", "gptq"}}; }, "quantization_config.quant_method"},
      {[](auto& j) { j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {64, 64}}}; },
       "quantization_config.weight_block_size"},
      {[](auto& j) { j.erase("vocab_size"); }, "vocab_size"},
  };
  for (const Case& c : cases) {
    absl::Status s = ParseWith(c.edit);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field << ": " << s;
    EXPECT_NE(std::string(s.message()).find("'" + c.field + "'"), std::string::npos) << s.message();
  }
}

TEST(ModelConfigTest, AbsorbedAttentionIsCheaperForShortChunks) {
  nlohmann::json t = Tiny();
  t["vocab_size"] = 1024;
  absl::StatusOr<ModelConfig> tiny = ParseModelConfig(t.dump());
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  // R 64, rope 16, nope = v = 32: fresh prompts while n + 1 < 2 (nope+v) R / (2R+P-nope-rope-v) = 128.
  EXPECT_TRUE(tiny->AbsorbedAttentionCheaper(2, 0));
  EXPECT_TRUE(tiny->AbsorbedAttentionCheaper(126, 0));
  EXPECT_FALSE(tiny->AbsorbedAttentionCheaper(127, 0));  // a tie is not cheaper
  EXPECT_FALSE(tiny->AbsorbedAttentionCheaper(500, 0));
  // After a long cached prefix only chunks under (nope+v) R / (2R+P-nope-rope-v) = 64 tokens.
  EXPECT_TRUE(tiny->AbsorbedAttentionCheaper(60, 10000));
  EXPECT_FALSE(tiny->AbsorbedAttentionCheaper(70, 10000));
  nlohmann::json v2 = nlohmann::json::parse(PresetConfig("tiny-v2").value());
  v2["kv_lora_rank"] = 512;
  v2["qk_rope_head_dim"] = 64;
  v2["qk_nope_head_dim"] = 128;
  v2["v_head_dim"] = 128;
  v2["vocab_size"] = 1024;
  absl::StatusOr<ModelConfig> lite = ParseModelConfig(v2.dump());  // V2-Lite's attention shapes
  ASSERT_TRUE(lite.ok()) << lite.status();
  EXPECT_TRUE(lite->AbsorbedAttentionCheaper(338, 0));
  EXPECT_FALSE(lite->AbsorbedAttentionCheaper(341, 0));
}

TEST(ModelConfigTest, BadJsonIsAnError) {
  EXPECT_EQ(ParseModelConfig("{\"model_type\": ").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseModelConfig("[1, 2]").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadModelConfig("/nonexistent/dir").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tandem
