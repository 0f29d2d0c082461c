// The GPU serving test's output comparison (sampled_output_match.h), on made-up outputs:
// it runs where the GPU test skips.
#include "tests/integration/sampled_output_match.h"

#include "gtest/gtest.h"

namespace tandem::testing {
namespace {

v1::TokenLogprob Dist(std::vector<std::pair<int32_t, float>> top) {
  v1::TokenLogprob l;
  for (auto [id, lp] : top) {
    v1::TopLogprob* t = l.add_top();
    t->set_token_id(id);
    t->set_logprob(lp);
  }
  return l;
}

const std::vector<v1::TokenLogprob> kNone;

TEST(SampledOutputMatchTest, IdenticalOutputsMatch) {
  EXPECT_TRUE(MatchOutputs(false, {1, 2, 3}, kNone, {1, 2, 3}, kNone).same);
  EXPECT_TRUE(MatchOutputs(true, {1, 2, 3}, kNone, {1, 2, 3}, kNone).same);
}

TEST(SampledOutputMatchTest, GreedyOutputsMustBeIdentical) {
  const OutputMatch m = MatchOutputs(false, {1, 2, 4}, kNone, {1, 2, 3}, kNone);
  EXPECT_FALSE(m.same);
  EXPECT_NE(m.why.find("parts at token 2 of 3"), std::string::npos) << m.why;
}

TEST(SampledOutputMatchTest, SampledOutputsMayPartWhereTheDistributionsAgree) {
  const std::vector<v1::TokenLogprob> a = {Dist({{1, -0.1f}}), Dist({{7, -5.30f}, {8, -5.51f}, {9, -5.58f}})};
  const std::vector<v1::TokenLogprob> b = {Dist({{1, -0.1f}}), Dist({{7, -5.30f}, {8, -5.5105f}, {9, -5.58f}})};
  const OutputMatch m = MatchOutputs(true, {1, 56, 3}, a, {1, 756, 4}, b);
  EXPECT_TRUE(m.same) << m.why;
  EXPECT_NE(m.note.find("parts at token 1 (56 vs 756)"), std::string::npos) << m.note;
}

TEST(SampledOutputMatchTest, SampledOutputsMustNotPartWhereTheDistributionsDiffer) {
  const std::vector<v1::TokenLogprob> a = {Dist({{7, -5.30f}, {8, -5.51f}})};
  const std::vector<v1::TokenLogprob> b = {Dist({{7, -5.30f}, {8, -5.40f}})};  // 0.11 apart
  const OutputMatch m = MatchOutputs(true, {56}, a, {756}, b);
  EXPECT_FALSE(m.same);
  EXPECT_NE(m.why.find("distributions differ"), std::string::npos) << m.why;
}

TEST(SampledOutputMatchTest, ASwapAtTheTopListsEdgeStillAgrees) {
  // Token 9 and 10 tie for the last place; each run lists another one.
  const std::vector<v1::TokenLogprob> a = {Dist({{7, -1.0f}, {9, -3.0000f}})};
  const std::vector<v1::TokenLogprob> b = {Dist({{7, -1.0f}, {10, -3.0005f}})};
  EXPECT_TRUE(MatchOutputs(true, {9}, a, {10}, b).same);
  // But a token well above the other list's last entry cannot be missing from it.
  const std::vector<v1::TokenLogprob> c = {Dist({{7, -1.0f}, {10, -3.5f}})};
  EXPECT_FALSE(MatchOutputs(true, {9}, a, {10}, c).same);
}

TEST(SampledOutputMatchTest, MissingLogprobsOrAnEarlyEndDoNotMatch) {
  EXPECT_FALSE(MatchOutputs(true, {1, 2}, kNone, {1, 3}, kNone).same);
  const std::vector<v1::TokenLogprob> a = {Dist({{1, -0.1f}})};
  EXPECT_FALSE(MatchOutputs(true, {1}, a, {1, 2}, a).same);
  EXPECT_FALSE(MatchOutputs(true, {1, 5}, {Dist({}), Dist({})}, {1, 6}, {Dist({}), Dist({})}).same);
}

}  // namespace
}  // namespace tandem::testing
