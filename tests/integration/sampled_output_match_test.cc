// The GPU serving test's output comparison (sampled_output_match.h), on made-up outputs:
// it runs where the GPU test skips. The distributions are built around the real draw
// (UniformFromSeedStep) of the position where the outputs part, so that its boundary
// between two tokens lies where each case needs it.
#include "tests/integration/sampled_output_match.h"

#include <cmath>

#include "engine/runtime/sampler.h"
#include "gtest/gtest.h"

namespace tandem::testing {
namespace {

constexpr uint64_t kSeed = 17;

v1::TokenLogprob Dist(std::vector<std::pair<int32_t, double>> probabilities) {
  v1::TokenLogprob l;
  for (auto [id, p] : probabilities) {
    v1::TopLogprob* t = l.add_top();
    t->set_token_id(id);
    t->set_logprob(static_cast<float>(std::log(p)));
  }
  return l;
}

const std::vector<v1::TokenLogprob> kNone;

// The first output position whose draw lies in [lo, hi].
int64_t StepWithDrawIn(double lo, double hi) {
  for (int64_t s = 0;; ++s) {
    const double u = UniformFromSeedStep(kSeed, s);
    if (u >= lo && u <= hi) return s;
  }
}

// Three tokens at temperature 1 kept whole (top_k 3): 7 with probability a, then 8 and 9
// sharing the rest; for a >= 0.375 that is their canonical order and the boundary between
// 7 and 8 lies at a.
v1::TokenLogprob ThreeTokens(double a) { return Dist({{7, a}, {8, (1 - a) * 0.6}, {9, (1 - a) * 0.4}}); }

SampledDraw Draw(int64_t first_step = 0) {
  return {.seed = kSeed, .first_step = first_step, .temperature = 1.0f, .top_k = 3};
}

TEST(SampledOutputMatchTest, IdenticalOutputsMatch) {
  EXPECT_TRUE(MatchOutputs(std::nullopt, {1, 2, 3}, kNone, {1, 2, 3}, kNone).same);
  EXPECT_TRUE(MatchOutputs(Draw(), {1, 2, 3}, kNone, {1, 2, 3}, kNone).same);
}

TEST(SampledOutputMatchTest, GreedyOutputsMustBeIdentical) {
  const OutputMatch m = MatchOutputs(std::nullopt, {1, 2, 4}, kNone, {1, 2, 3}, kNone);
  EXPECT_FALSE(m.same);
  EXPECT_NE(m.why.find("parts at token 2 of 3"), std::string::npos) << m.why;
}

TEST(SampledOutputMatchTest, DrawOfTakesTheRequestsSampling) {
  v1::GenerateRequest r;
  r.mutable_sampling()->set_temperature(0.0f);
  EXPECT_FALSE(DrawOf(r).has_value());
  r.mutable_sampling()->set_temperature(0.8f);
  r.mutable_sampling()->set_seed(99);
  r.mutable_sampling()->set_top_k(20);
  r.mutable_sampling()->set_top_p(0.9f);
  const std::optional<SampledDraw> d = DrawOf(r);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->seed, 99u);
  EXPECT_EQ(d->top_k, 20);
  EXPECT_FLOAT_EQ(d->top_p, 0.9f);
  EXPECT_FLOAT_EQ(d->temperature, 0.8f);
  // A temperature-1 default is sampled.
  v1::GenerateRequest plain;
  EXPECT_TRUE(DrawOf(plain).has_value());
}

// The draw 1e-4 below the boundary in one run and 1e-4 above it in the other (their
// log-probabilities a few 1e-4 apart): each run drew its own token, the parting is the
// boundary's.
TEST(SampledOutputMatchTest, APartingOnTheDrawsBoundaryMatches) {
  const int64_t step = StepWithDrawIn(0.45, 0.7);
  const double u = UniformFromSeedStep(kSeed, step);
  std::vector<v1::TokenLogprob> got(static_cast<size_t>(step + 1), ThreeTokens(0.5));
  std::vector<v1::TokenLogprob> want = got;
  got[step] = ThreeTokens(u - 1e-4);   // u above 7's interval: 8
  want[step] = ThreeTokens(u + 1e-4);  // u inside 7's interval: 7
  std::vector<int32_t> prefix(static_cast<size_t>(step), 1);
  std::vector<int32_t> g = prefix, w = prefix;
  g.push_back(8);
  w.push_back(7);
  const OutputMatch m = MatchOutputs(Draw(), g, got, w, want);
  EXPECT_TRUE(m.same) << m.why;
  EXPECT_NE(m.note.find("parts at token " + std::to_string(step) + " (8 vs 7)"), std::string::npos) << m.note;
  // One run without log-probabilities (its tokens chosen on the GPU): checked against the
  // other's distribution alone.
  EXPECT_TRUE(MatchOutputs(Draw(), g, kNone, w, want).same);
}

// The old matcher's blind spot: two runs with the same distribution part where the draw
// lies far inside one token's interval. However well the log-probabilities agree, that is
// no rounding: a wrong seed, step or sampler chose the token.
TEST(SampledOutputMatchTest, APartingFarFromTheBoundaryIsRejected) {
  const int64_t step = StepWithDrawIn(0.3, 0.6);
  const double u = UniformFromSeedStep(kSeed, step);
  std::vector<v1::TokenLogprob> dist(static_cast<size_t>(step + 1), ThreeTokens(u + 0.2));
  std::vector<int32_t> prefix(static_cast<size_t>(step), 1);
  std::vector<int32_t> g = prefix, w = prefix;
  g.push_back(8);  // u is 0.2 inside 7's interval: 8 cannot be the draw
  w.push_back(7);
  OutputMatch m = MatchOutputs(Draw(), g, dist, w, dist);
  EXPECT_FALSE(m.same);
  EXPECT_NE(m.why.find("not its own distribution's draw"), std::string::npos) << m.why;
  // Without the other run's log-probabilities: its token is too far from the draw under
  // the reference's distribution.
  m = MatchOutputs(Draw(), g, kNone, w, dist);
  EXPECT_FALSE(m.same);
  EXPECT_NE(m.why.find("more than the"), std::string::npos) << m.why;
  // Just beyond the rounding bound (δ / 2T = 1e-3 at δ 2e-3, T 1) is rejected too.
  std::vector<v1::TokenLogprob> near(static_cast<size_t>(step + 1), ThreeTokens(u + 1.5e-3));
  EXPECT_FALSE(MatchOutputs(Draw(), g, kNone, w, near).same);
  std::vector<v1::TokenLogprob> within(static_cast<size_t>(step + 1), ThreeTokens(u + 0.5e-3));
  EXPECT_TRUE(MatchOutputs(Draw(), g, kNone, w, within).same);
}

// The draw at the boundary of output position `step`, but the request resumed after one
// token generated elsewhere (first_step 1): the positions' draws are others.
TEST(SampledOutputMatchTest, TheDrawIsTheOutputPositionsOwn) {
  const int64_t step = StepWithDrawIn(0.45, 0.7);
  const double u = UniformFromSeedStep(kSeed, step);
  const double shifted = UniformFromSeedStep(kSeed, step + 1);
  ASSERT_GT(std::fabs(shifted - u), 0.01);
  std::vector<v1::TokenLogprob> got(static_cast<size_t>(step + 1), ThreeTokens(0.5));
  std::vector<v1::TokenLogprob> want = got;
  got[step] = ThreeTokens(u - 1e-4);
  want[step] = ThreeTokens(u + 1e-4);
  std::vector<int32_t> g(static_cast<size_t>(step), 1), w = g;
  g.push_back(8);
  w.push_back(7);
  EXPECT_TRUE(MatchOutputs(Draw(0), g, got, w, want).same);
  EXPECT_FALSE(MatchOutputs(Draw(1), g, got, w, want).same);
}

// top_p, min_p and temperature as the sampler applies them: the boundary is relative to
// the kept mass.
TEST(SampledOutputMatchTest, TruncationAndTemperatureMoveTheBoundary) {
  const int64_t step = StepWithDrawIn(0.55, 0.7);
  const double u = UniformFromSeedStep(kSeed, step);
  // 7 and 8 weigh 0.8 together, 9 and 10 0.1 each: top_p 0.75 keeps 7 and 8, whose
  // boundary is at p7 / 0.8.
  auto four = [](double p7) { return Dist({{7, p7}, {8, 0.8 - p7}, {9, 0.1}, {10, 0.1}}); };
  std::vector<v1::TokenLogprob> got = {four(0.8 * u - 1e-4)}, want = {four(0.8 * u + 1e-4)};
  SampledDraw d{.seed = kSeed, .first_step = step, .temperature = 1.0f, .top_k = 4, .top_p = 0.75f};
  EXPECT_TRUE(MatchOutputs(d, {8}, got, {7}, want).same);
  // Without top_p the boundary is at p7 = 0.8u, 0.2u away from the draw.
  d.top_p = 1.0f;
  EXPECT_FALSE(MatchOutputs(d, {8}, got, {7}, want).same);
  // min_p 0.3 drops 9 and 10 (weights 0.1 / p7 < 0.3), keeps 8 (>= 0.43): the same two.
  d.min_p = 0.3f;
  EXPECT_TRUE(MatchOutputs(d, {8}, got, {7}, want).same);
  // Temperature 0.5 squares the weights: the boundary lies at p7² / (p7² + p8²).
  const double t7 = std::sqrt(u), t8 = std::sqrt(1 - u);  // weights u and 1 - u at T 0.5
  SampledDraw cold{.seed = kSeed, .first_step = step, .temperature = 0.5f, .top_k = 2};
  EXPECT_TRUE(MatchOutputs(cold, {8}, {Dist({{7, t7 * 0.9995}, {8, t8}})}, {7}, {Dist({{7, t7 * 1.0005}, {8, t8}})}).same);
  EXPECT_FALSE(MatchOutputs(cold, {8}, {Dist({{7, t7 * 1.2}, {8, t8}})}, {7}, {Dist({{7, t7 * 1.2}, {8, t8}})}).same);
}

TEST(SampledOutputMatchTest, SampledOutputsMustNotPartWhereTheDistributionsDiffer) {
  const std::vector<v1::TokenLogprob> a = {Dist({{7, 0.5}, {8, 0.3}, {9, 0.2}})};
  const std::vector<v1::TokenLogprob> b = {Dist({{7, 0.45}, {8, 0.35}, {9, 0.2}})};
  const OutputMatch m = MatchOutputs(Draw(), {8}, a, {7}, b);
  EXPECT_FALSE(m.same);
  EXPECT_NE(m.why.find("distributions differ"), std::string::npos) << m.why;
}

TEST(SampledOutputMatchTest, ASwapAtTheTopListsEdgeStillAgreesAsDistributions) {
  // Tokens 9 and 10 tie for the last place; each run lists another one. The top_k of the
  // draw reaches past the lists, so the draw cannot be recomputed: rejected, saying so.
  const std::vector<v1::TokenLogprob> a = {Dist({{7, 0.6}, {9, 0.05}})};
  const std::vector<v1::TokenLogprob> b = {Dist({{7, 0.6}, {10, 0.04998}})};
  SampledDraw d = Draw();
  d.top_k = 0;
  const OutputMatch m = MatchOutputs(d, {9}, a, {10}, b);
  EXPECT_FALSE(m.same);
  EXPECT_NE(m.why.find("not within the 2 listed"), std::string::npos) << m.why;
  // A token well above the other list's last entry cannot be missing from it.
  const std::vector<v1::TokenLogprob> c = {Dist({{7, 0.6}, {10, 0.03}})};
  EXPECT_NE(MatchOutputs(d, {9}, a, {10}, c).why.find("distributions differ"), std::string::npos);
}

TEST(SampledOutputMatchTest, MissingLogprobsOrAnEarlyEndDoNotMatch) {
  EXPECT_FALSE(MatchOutputs(Draw(), {1, 2}, kNone, {1, 3}, kNone).same);
  const std::vector<v1::TokenLogprob> a = {Dist({{1, 0.9}})};
  EXPECT_FALSE(MatchOutputs(Draw(), {1}, a, {1, 2}, a).same);
  EXPECT_FALSE(MatchOutputs(Draw(), {1, 5}, {Dist({}), Dist({})}, {1, 6}, {Dist({}), Dist({})}).same);
}

}  // namespace
}  // namespace tandem::testing
