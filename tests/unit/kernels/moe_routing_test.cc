#include "kernels/cpu/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::cpu {
namespace {

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed Route(MoeRoutingParams p, const std::vector<float>& logits) {
  Routed r;
  r.ids.resize(static_cast<size_t>(p.num_tokens * p.top_k));
  r.weights.resize(r.ids.size());
  p.logits = logits.data();
  p.expert_ids = r.ids.data();
  p.weights = r.weights.data();
  RouteMoe(p);
  return r;
}

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

TEST(MoeRoutingTest, GreedySoftmaxPicksLargestScores) {
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.5f};
  MoeRoutingParams p{.num_tokens = 1, .num_experts = 4, .top_k = 2, .routed_scaling_factor = 2.0f};
  Routed r = Route(p, logits);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 3}));
  double z = 0;
  for (float l : logits) z += std::exp(l);
  EXPECT_NEAR(r.weights[0], 2.0 * std::exp(2.0) / z, 1e-6);
  EXPECT_NEAR(r.weights[1], 2.0 * std::exp(1.5) / z, 1e-6);
}

TEST(MoeRoutingTest, GroupLimitedGreedyRanksGroupsByBestExpert) {
  // Groups {0,1}, {2,3}, {4,5}: best scores 3.0 (group 1), 2.9 (group 2), 2.0 (group 0).
  // With topk_group=1 only group 1 may be used even though expert 5 beats expert 2.
  const std::vector<float> logits = {2.0f, 1.9f, 3.0f, 0.0f, 2.9f, 2.8f};
  MoeRoutingParams p{.num_tokens = 1, .num_experts = 6, .num_groups = 3, .topk_groups = 1, .top_k = 2,
                     .method = MoeTopk::kGroupLimitedGreedy};
  Routed r = Route(p, logits);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 3}));
}

TEST(MoeRoutingTest, NoauxTcUsesBiasForChoiceOnlyAndTopTwoGroupScore) {
  // Group 0 = {0,1,2}: top-2 sum of biased sigmoid scores; group 1 = {3,4,5}.
  const std::vector<float> logits = {3.0f, -3.0f, -3.0f, 1.0f, 1.0f, -5.0f};
  // Bias makes group 1 win: its two experts at 1.0 plus 0.5 each beat 3.0's ~0.95 + ~0.05.
  const std::vector<float> bias = {0.0f, 0.0f, 0.0f, 0.5f, 0.5f, 0.0f};
  MoeRoutingParams p{.num_tokens = 1, .num_experts = 6, .num_groups = 2, .topk_groups = 1, .top_k = 2,
                     .scoring = MoeScoring::kSigmoid, .method = MoeTopk::kNoauxTc, .correction_bias = bias.data(),
                     .normalize = true, .scale_normalized = true, .routed_scaling_factor = 2.5f};
  Routed r = Route(p, logits);
  std::vector<int32_t> ids = r.ids;
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<int32_t>{3, 4}));
  // Weights come from the unbiased scores, normalized, then scaled.
  EXPECT_NEAR(r.weights[0], 2.5 * 0.5, 1e-6);
  EXPECT_NEAR(r.weights[1], 2.5 * 0.5, 1e-6);
}

TEST(MoeRoutingTest, V2ScalesOnlyUnnormalizedWeights) {
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f};
  MoeRoutingParams p{.num_tokens = 1, .num_experts = 3, .top_k = 2, .normalize = true,
                     .scale_normalized = false, .routed_scaling_factor = 16.0f};
  Routed r = Route(p, logits);
  EXPECT_NEAR(r.weights[0] + r.weights[1], 1.0, 1e-6);
  p.normalize = false;
  r = Route(p, logits);
  EXPECT_GT(r.weights[0] + r.weights[1], 10.0);
  EXPECT_NEAR(Sigmoid(0.0f), 0.5f, 1e-7);  // keep the helper honest
}

TEST(MoeRoutingTest, SeveralTokensRouteIndependently) {
  const std::vector<float> logits = {5, 0, 0, 0, /**/ 0, 0, 0, 5};
  MoeRoutingParams p{.num_tokens = 2, .num_experts = 4, .top_k = 1};
  Routed r = Route(p, logits);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 3}));
}

}  // namespace
}  // namespace tandem::cpu
