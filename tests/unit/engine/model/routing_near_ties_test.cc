// The routing hooks of the CPU model (DeepseekForwardOptions::after_routing) and the
// near-tie helpers the GPU comparisons rely on: a near-tie is listed, a robust routing is
// not, alternative weights are RouteMoe's, and an override changes exactly what it should.
#include "tests/unit/engine/model/routing_near_ties.h"

#include <algorithm>
#include <numeric>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/model/test_models.h"

namespace tandem::testing {
namespace {

RecordedRouting OneRow(cpu::MoeRoutingParams params, std::vector<float> logits) {
  RecordedRouting r;
  r.params = params;
  r.params.num_tokens = 1;
  r.logits = std::move(logits);
  r.ids.resize(static_cast<size_t>(params.top_k));
  r.weights.resize(static_cast<size_t>(params.top_k));
  cpu::MoeRoutingParams p = r.params;
  p.logits = r.logits.data();
  p.expert_ids = r.ids.data();
  p.weights = r.weights.data();
  cpu::RouteMoe(p);
  return r;
}

std::vector<int32_t> Sorted(std::vector<int32_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(RoutingNearTiesTest, ANearTieIsListedAndARobustRoutingIsNot) {
  const cpu::MoeRoutingParams greedy{.num_experts = 4, .top_k = 2};
  // One bf16 step at magnitude 1 is 2^-7: experts 1 and 2 are 0.001 apart, 2 and 3 far.
  const RecordedRouting tied = OneRow(greedy, {1.0f, 0.5f, 0.499f, -1.0f});
  ASSERT_EQ(Sorted(tied.ids), (std::vector<int32_t>{0, 1}));
  const std::vector<RoutingChoice> alts = NearTieAlternatives(tied, 0);
  ASSERT_EQ(alts.size(), 1u);
  EXPECT_EQ(Sorted(alts[0].ids), (std::vector<int32_t>{0, 2}));
  // The alternative's weights are the unperturbed scores of its experts.
  const std::vector<float> w = RoutingWeights(greedy, tied.logits.data(), alts[0].ids);
  EXPECT_EQ(alts[0].weights, w);

  EXPECT_TRUE(NearTieAlternatives(OneRow(greedy, {1.0f, 0.5f, 0.45f, -1.0f}), 0).empty());
  EXPECT_FLOAT_EQ(LogitStep(tied.logits.data(), 4), 1.0f / 128);
  const std::vector<float> big = {-6.0f, 1.0f};
  EXPECT_FLOAT_EQ(LogitStep(big.data(), 2), 4.0f / 128);
}

TEST(RoutingNearTiesTest, GroupLimitedTiesAcrossGroupsAreListed) {
  // Four groups of two; the best two groups are taken, then the best two experts in them.
  const cpu::MoeRoutingParams grouped{.num_experts = 8, .num_groups = 4, .topk_groups = 2, .top_k = 2,
                                      .method = cpu::MoeTopk::kGroupLimitedGreedy};
  // Group 1's best (0.8) and group 2's best (0.799) tie for the second group.
  const RecordedRouting r = OneRow(grouped, {1.0f, 0.0f, 0.8f, 0.0f, 0.799f, 0.0f, -1.0f, -1.0f});
  ASSERT_EQ(Sorted(r.ids), (std::vector<int32_t>{0, 2}));
  const std::vector<RoutingChoice> alts = NearTieAlternatives(r, 0);
  ASSERT_EQ(alts.size(), 1u);
  EXPECT_EQ(Sorted(alts[0].ids), (std::vector<int32_t>{0, 4}));
}

TEST(RoutingNearTiesTest, WeightsAreRouteMoesForEveryScoring) {
  std::vector<float> logits = {0.3f, -1.2f, 2.0f, 0.9f, -0.1f, 1.7f, 0.0f, -2.5f};
  for (cpu::MoeScoring scoring : {cpu::MoeScoring::kSoftmax, cpu::MoeScoring::kSigmoid}) {
    for (bool normalize : {false, true}) {
      for (bool scale_normalized : {false, true}) {
        const cpu::MoeRoutingParams p{.num_experts = 8, .top_k = 3, .scoring = scoring, .normalize = normalize,
                                      .scale_normalized = scale_normalized, .routed_scaling_factor = 2.5f};
        const RecordedRouting r = OneRow(p, logits);
        const std::vector<float> w = RoutingWeights(p, logits.data(), r.ids);
        for (size_t k = 0; k < w.size(); ++k) EXPECT_NEAR(w[k], r.weights[k], 1e-6f * std::abs(r.weights[k]));
      }
    }
  }
}

class RoutingHooksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    nlohmann::json j = nlohmann::json::parse(PresetJson("tiny-v2"));
    j["vocab_size"] = 512;
    dir_ = MakeModel(tmp_, "tiny-v2", j.dump());
    absl::StatusOr<std::unique_ptr<DeepseekModel>> m = DeepseekModel::Load(dir_, {.num_threads = 2});
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    tokens_.resize(40);
    for (size_t i = 0; i < tokens_.size(); ++i) tokens_[i] = static_cast<int32_t>(3 + (i * 37) % 500);
  }
  std::vector<float> Run(const DeepseekForwardOptions& o) {
    const std::vector<int32_t> table = {0};
    ForwardSequence s{.tokens = tokens_, .start_position = 0, .block_table = table, .all_logits = true};
    LatentKvCache cache = model_->MakeKvCache(1);
    absl::StatusOr<std::vector<float>> logits = model_->Forward({&s, 1}, cache, o);
    EXPECT_TRUE(logits.ok()) << logits.status();
    return logits.value_or(std::vector<float>{});
  }
  TempDir tmp_;
  std::string dir_;
  std::unique_ptr<DeepseekModel> model_;
  std::vector<int32_t> tokens_;
};

TEST_F(RoutingHooksTest, RecordsEveryMoeLayerAndOverridesOnlyTheirRow) {
  const std::vector<float> plain = Run({});
  RecordedRoutings rec;
  EXPECT_EQ(Run(RoutingHooks(nullptr, &rec)), plain);  // recording changes nothing
  const ModelConfig& c = model_->config();
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) moe_layers += c.IsMoeLayer(l);
  ASSERT_GT(moe_layers, 0);
  ASSERT_EQ(static_cast<int64_t>(rec.size()), moe_layers);
  const int64_t layer = rec.begin()->first, k = c.num_experts_per_tok, e = c.n_routed_experts;
  const RecordedRouting& r = rec.begin()->second;
  ASSERT_EQ(r.logits.size(), tokens_.size() * e);
  ASSERT_EQ(r.ids.size(), tokens_.size() * k);

  // The CPU's own routing as an override: bitwise the same logits.
  const int64_t row = 25;
  RoutingOverrides same{{{layer, row}, {.ids = {r.ids.begin() + row * k, r.ids.begin() + (row + 1) * k},
                                        .weights = {r.weights.begin() + row * k, r.weights.begin() + (row + 1) * k}}}};
  EXPECT_EQ(Run(RoutingHooks(&same, nullptr)), plain);

  // Another expert for that row: its logits and later rows' move, earlier rows' do not.
  std::vector<int32_t> other(r.ids.begin() + row * k, r.ids.begin() + (row + 1) * k);
  int32_t unused = 0;
  while (std::find(other.begin(), other.end(), unused) != other.end()) ++unused;
  other[0] = unused;
  RoutingOverrides changed{
      {{layer, row}, {.ids = other, .weights = RoutingWeights(r.params, &r.logits[row * e], other)}}};
  const std::vector<float> moved = Run(RoutingHooks(&changed, nullptr));
  ASSERT_EQ(moved.size(), plain.size());
  const int64_t vocab = c.vocab_size;
  EXPECT_TRUE(std::equal(plain.begin(), plain.begin() + row * vocab, moved.begin()));
  float diff = 0;
  for (int64_t i = row * vocab; i < (row + 1) * vocab; ++i) diff = std::max(diff, std::abs(plain[i] - moved[i]));
  EXPECT_GT(diff, 1e-3f);
}

}  // namespace
}  // namespace tandem::testing
