// Seeded sampled outputs with speculative decoding (docs/speculative-decoding.md): on a
// small-vocabulary model whose MTP layer drafts well (make-model --mtp-acceptance 0.8) at
// temperature 2.5, thousands of seeds through the engine with 3 drafts and without. Each
// position's own seeded draw decides whether its draft stands, so every seed gives the same
// tokens both ways; the drafts were accepted and refused often enough for both outcomes to
// shape the samples, and Pearson's chi-square homogeneity test (p > 0.01 per position) says
// the same of the counts. The statistic sees a small change of distribution (temperature
// 3.0 against 2.5) at p < 1e-4, so it is not blind here. (sampler_verify_test.cc: the same
// statistic catches deliberately biased acceptance rules of the standard rule.)
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/model_generator.h"
#include "engine/runtime/engine.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/runtime/chi_square.h"
#include "tests/unit/engine/runtime/engine_test_support.h"

namespace tandem {
namespace {

constexpr int64_t kVocab = 320;
constexpr int kSeeds = 3000;
constexpr int kTokens = 3;  // the first from the prompt's step, the next two from verify steps

const std::string& ModelDir() {
  static testing::TempDir* tmp = new testing::TempDir();
  static const std::string dir = testing::MakeMtpTestModel(*tmp, "m", kVocab, /*seed=*/11, 0.8);
  return dir;
}

// counts[position][token] over kSeeds seeded requests of one prompt; each seed's tokens in
// `tokens` when given.
std::vector<std::vector<int64_t>> Counts(int32_t drafts, float temperature, EngineStats* stats,
                                         std::vector<std::vector<int32_t>>* tokens = nullptr) {
  EngineOptions o;
  o.num_threads = 2;
  o.speculative_tokens = drafts;
  o.speculative_adaptive = false;  // every step drafts: the test counts them
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(ModelDir(), o);
  EXPECT_TRUE(e.ok()) << e.status();
  std::vector<std::vector<int64_t>> counts(kTokens, std::vector<int64_t>(kVocab, 0));
  if (!e.ok()) return counts;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 12; ++i) prompt.push_back(3 + (i * 37 + 5) % 290);
  constexpr int kWave = 128;  // requests in flight together
  for (int first = 0; first < kSeeds; first += kWave) {
    std::vector<std::shared_ptr<OutputStream>> streams;
    for (int seed = first; seed < std::min(kSeeds, first + kWave); ++seed) {
      EngineRequest r = testing::GreedyRequest(absl::StrCat("s", seed), prompt, kTokens);
      r.sampling.temperature = temperature;
      r.sampling.seed = static_cast<uint64_t>(seed) * 7919 + 1;
      absl::StatusOr<std::shared_ptr<OutputStream>> s = (*e)->Submit(std::move(r));
      EXPECT_TRUE(s.ok()) << s.status();
      if (s.ok()) streams.push_back(*s);
    }
    for (auto& s : streams) {
      const testing::Result r = testing::Drain(*s);
      EXPECT_EQ(r.tokens.size(), static_cast<size_t>(kTokens));
      for (size_t i = 0; i < r.tokens.size() && i < kTokens; ++i) counts[i][r.tokens[i]]++;
      if (tokens != nullptr) tokens->push_back(r.tokens);
    }
  }
  if (stats != nullptr) *stats = (*e)->Stats();
  return counts;
}

TEST(EngineSpeculativeDistributionTest, SeededTokensAreTheSameWithAndWithoutDrafts) {
  EngineStats spec_stats;
  std::vector<std::vector<int32_t>> with_tokens, without_tokens;
  const auto with = Counts(3, 2.5f, &spec_stats, &with_tokens);
  const auto without = Counts(0, 2.5f, nullptr, &without_tokens);
  ASSERT_EQ(with_tokens.size(), static_cast<size_t>(kSeeds));
  EXPECT_EQ(with_tokens, without_tokens);
  // The drafts were checked often and accepted often, and refused often too: both of the
  // rule's branches shaped these samples.
  const double accepted = spec_stats.spec_accepted_by_position.empty() ? 0 : spec_stats.spec_accepted_by_position[0];
  int64_t steps = 0;
  for (int64_t n : spec_stats.spec_accepted_length) steps += n;
  std::printf("%lld verify steps, first draft accepted in %.3f of them\n", static_cast<long long>(steps),
              steps > 0 ? accepted / steps : 0.0);
  EXPECT_GE(steps, kSeeds);
  EXPECT_GT(accepted, 0.2 * steps);
  EXPECT_LT(accepted, 0.8 * steps);
  for (int position = 0; position < kTokens; ++position) {
    const chi_square::ChiSquare c = chi_square::Homogeneity(with[position], without[position]);
    std::printf("position %d: chi-square %.1f, df %d, p %.3f\n", position, c.statistic, c.df, c.p_value);
    EXPECT_GT(c.p_value, 0.01) << "position " << position;
  }
}

TEST(EngineSpeculativeDistributionTest, TheTestSeesASmallChangeOfDistribution) {
  const auto a = Counts(3, 2.5f, nullptr);
  const auto b = Counts(0, 3.0f, nullptr);
  const chi_square::ChiSquare c = chi_square::Homogeneity(a[1], b[1]);
  std::printf("temperature 2.5 with drafts against 3.0 without: chi-square %.1f, df %d, p %.2e\n", c.statistic,
              c.df, c.p_value);
  EXPECT_LT(c.p_value, 1e-4);
}

}  // namespace
}  // namespace tandem
