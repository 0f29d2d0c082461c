#include "engine/runtime/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "tests/unit/engine/runtime/sampler_test_support.h"

namespace tandem {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using sampler_test::RandomLogits;
using sampler_test::SampleCopy;

int32_t Argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// The sampler's definition (sampler.h) on the reference kept set. Logits already
// penalized.
int32_t ReferenceSample(const std::vector<float>& logits, const SamplingParams& p, double u) {
  if (p.temperature < kGreedyTemperature) return Argmax(logits);
  const sampler_test::ReferenceKeptSet kept = sampler_test::ReferenceKept(logits, p);
  double cum = 0.0;
  for (const int32_t id : kept.ids) {
    cum += kept.weights[id];
    if (cum > u * kept.mass) return id;
  }
  return kept.ids.back();
}

// softmax(logits / t) restricted to `keep` (all when empty), renormalized.
std::vector<double> Softmax(const std::vector<float>& logits, double t,
                            const std::vector<bool>& keep = {}) {
  std::vector<double> p(logits.size(), 0.0);
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!keep.empty() && !keep[i]) continue;
    p[i] = std::exp((logits[i] - max) / t);
    sum += p[i];
  }
  for (double& x : p) x /= sum;
  return p;
}

// Samples `draws` steps and compares frequencies with `expected`: tokens of probability
// 0 never appear; max abs difference < 0.01; chi-square (cells with expectation >= 5)
// within 6 standard deviations of its mean. Deterministic (fixed seed), so it cannot
// flake; the bounds are loose enough that any correct sampler passes them.
void ExpectFrequencies(const std::vector<float>& logits, const SamplingParams& p,
                       const std::vector<double>& expected, int draws = 20000) {
  Sampler sampler;
  std::vector<int> counts(logits.size(), 0);
  for (int step = 0; step < draws; ++step) {
    ++counts[SampleCopy(sampler, logits, p, /*seed=*/1234, step).token];
  }
  double max_diff = 0.0;
  double chi2 = 0.0;
  int cells = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (expected[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " should have been truncated";
      continue;
    }
    const double e = expected[i] * draws;
    max_diff = std::max(max_diff, std::abs(counts[i] / double(draws) - expected[i]));
    if (e >= 5.0) {
      chi2 += (counts[i] - e) * (counts[i] - e) / e;
      ++cells;
    }
  }
  const double df = std::max(cells - 1, 1);
  std::printf("  max |freq - p| = %.4f, chi2 = %.1f (df %.0f)\n", max_diff, chi2, df);
  EXPECT_LT(max_diff, 0.01);
  EXPECT_LT(chi2, df + 6.0 * std::sqrt(2.0 * df));
}

TEST(SamplerTest, GreedyPicksArgmaxTiesToLowestId) {
  Sampler sampler;
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_EQ(SampleCopy(sampler, {0.1f, 3.0f, -2.0f, 2.9f}, p, 0, 0).token, 1);
  EXPECT_EQ(SampleCopy(sampler, {1.0f, 5.0f, 2.0f, 5.0f, 5.0f}, p, 0, 0).token, 1);
  EXPECT_EQ(SampleCopy(sampler, {kNegInf, -7.0f, kNegInf, -7.0f}, p, 0, 0).token, 1);
  EXPECT_EQ(SampleCopy(sampler, {-1.0f, -0.0f, 0.0f}, p, 0, 0).token, 1);  // -0 == +0
  const std::vector<float> logits = RandomLogits(129280, 3.0f, 7);
  for (int64_t step = 0; step < 5; ++step) {
    EXPECT_EQ(SampleCopy(sampler, logits, p, step * 77, step).token, Argmax(logits));
  }
}

TEST(SamplerTest, LowTemperatureLimitIsGreedy) {
  Sampler sampler;
  // Gaps >= 0.5 between logits: at T = 1e-3 every other weight is exp(-500) = 0.
  std::vector<float> logits = {1.0f, 2.5f, 0.0f, 3.0f, -1.0f, 2.0f};
  for (const float t : {1e-3f, 1e-4f, 9.9e-6f /* below kGreedyTemperature */}) {
    SamplingParams p;
    p.temperature = t;
    for (int64_t step = 0; step < 500; ++step) {
      ASSERT_EQ(SampleCopy(sampler, logits, p, 5, step).token, 3) << t << " " << step;
    }
  }
  // A gap of 0.03 at T = 0.01 leaves the runner-up e^-3 / (1 + e^-3) = 4.7%: not greedy.
  logits = {0.0f, 1.0f, 0.97f};
  SamplingParams p;
  p.temperature = 0.01f;
  int runner_up = 0;
  for (int64_t step = 0; step < 2000; ++step) {
    runner_up += SampleCopy(sampler, logits, p, 5, step).token == 2;
  }
  EXPECT_GT(runner_up, 60);  // expected 95, standard deviation 9.5
  EXPECT_LT(runner_up, 130);
}

TEST(SamplerTest, TopKOneAndTinyTopPAreGreedy) {
  Sampler sampler;
  for (const size_t vocab : {size_t{3}, size_t{1000}, size_t{129280}}) {
    const std::vector<float> logits = RandomLogits(vocab, 2.0f, vocab);
    const int32_t argmax = Argmax(logits);
    SamplingParams top_k;
    top_k.top_k = 1;
    top_k.temperature = 1.5f;
    SamplingParams top_p;
    top_p.top_p = 1e-6f;
    top_p.temperature = 1.5f;
    for (int64_t step = 0; step < 20; ++step) {
      EXPECT_EQ(SampleCopy(sampler, logits, top_k, 99, step).token, argmax);
      EXPECT_EQ(SampleCopy(sampler, logits, top_p, 99, step).token, argmax);
    }
  }
  // Ties: the lower id is the first in canonical order.
  SamplingParams p;
  p.top_k = 1;
  for (int64_t step = 0; step < 50; ++step) {
    EXPECT_EQ(SampleCopy(sampler, {0.0f, 2.0f, 1.0f, 2.0f}, p, 3, step).token, 1);
  }
}

TEST(SamplerTest, MinPDropsUnlikelyTokens) {
  // Probabilities proportional to 1, 0.6, 0.5, 0.3, 0.05 at T = 1.
  const std::vector<float> logits = {0.0f, std::log(0.6f), std::log(0.5f), std::log(0.3f),
                                     std::log(0.05f)};
  SamplingParams p;
  p.min_p = 0.45f;  // keeps ids 0, 1, 2
  ExpectFrequencies(logits, p, Softmax(logits, 1.0, {true, true, true, false, false}));
  p.min_p = 1.0f;  // only the most likely
  ExpectFrequencies(logits, p, Softmax(logits, 1.0, {true, false, false, false, false}));
}

TEST(SamplerTest, PenaltiesAsSpecified) {
  Sampler sampler;
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  const std::vector<int32_t> prompt = {0, 1, 1};
  const std::vector<int32_t> output = {2, 2, 4, 0};
  std::vector<float> logits = {2.0f, -1.0f, 0.5f, -3.0f, 4.0f, 0.0f};
  sampler.ApplyPenalties(logits, p, prompt, output);
  // Repetition over {0, 1, 2, 4}: positive / 2, negative * 2. Then output counts
  // {0: 1, 2: 2, 4: 1}: minus 0.25 * count, minus 0.5.
  const std::vector<float> expected = {2.0f / 2 - 0.25f - 0.5f, -1.0f * 2,
                                       0.5f / 2 - 0.5f - 0.5f,  -3.0f,
                                       4.0f / 2 - 0.25f - 0.5f, 0.0f};
  EXPECT_EQ(logits, expected);

  // Only repetition; the prompt alone counts; a token repeated is penalized once.
  SamplingParams rep;
  rep.repetition_penalty = 1.25f;
  logits = {2.0f, -1.0f, 0.5f};
  sampler.ApplyPenalties(logits, rep, std::vector<int32_t>{2, 2, 2, 1}, {});
  EXPECT_EQ(logits, (std::vector<float>{2.0f, -1.25f, 0.4f}));

  // Presence and frequency do not look at the prompt.
  SamplingParams pf;
  pf.presence_penalty = -1.0f;
  pf.frequency_penalty = 1.5f;
  logits = {1.0f, 1.0f, 1.0f};
  sampler.ApplyPenalties(logits, pf, std::vector<int32_t>{0, 0}, std::vector<int32_t>{1, 1, 1});
  EXPECT_EQ(logits, (std::vector<float>{1.0f, 1.0f - 4.5f + 1.0f, 1.0f}));

  // Sample applies them first: a repeated favourite loses to the runner-up.
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.repetition_penalty = 3.0f;
  EXPECT_EQ(SampleCopy(sampler, {3.0f, 2.0f}, greedy, 0, 0, {}, std::vector<int32_t>{0}).token,
            1);
  // Its log-probabilities are those of the penalized logits: log_softmax({1, 2})[1].
  const SampledToken t =
      SampleCopy(sampler, {3.0f, 2.0f}, greedy, 0, 0, {}, std::vector<int32_t>{0});
  EXPECT_NEAR(t.logprob, 2.0 - std::log(std::exp(1.0) + std::exp(2.0)), 1e-6);
}

TEST(SamplerDeathTest, HistoryOutsideTheVocabulary) {
  Sampler sampler;
  SamplingParams p;
  p.repetition_penalty = 1.1f;
  std::vector<float> logits(4, 0.0f);
  EXPECT_DEATH(sampler.ApplyPenalties(logits, p, std::vector<int32_t>{4}, {}), "vocabulary");
  std::vector<float> all_masked(4, kNegInf);
  EXPECT_DEATH(sampler.Sample(all_masked, SamplingParams{}, 0, 0, {}, {}), "finite");
}

TEST(SamplerTest, FrequenciesMatchSoftmaxAtTemperature) {
  const std::vector<float> logits = RandomLogits(40, 1.5f, 11);
  SamplingParams p;
  p.temperature = 0.7f;
  ExpectFrequencies(logits, p, Softmax(logits, 0.7));
}

TEST(SamplerTest, FrequenciesWithTopKAndTopP) {
  const std::vector<float> logits = RandomLogits(40, 1.5f, 12);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });

  SamplingParams top_k;
  top_k.temperature = 0.7f;
  top_k.top_k = 5;
  std::vector<bool> keep(logits.size(), false);
  for (int i = 0; i < 5; ++i) keep[order[i]] = true;
  ExpectFrequencies(logits, top_k, Softmax(logits, 0.7, keep));

  SamplingParams top_p;
  top_p.temperature = 0.7f;
  top_p.top_p = 0.8f;
  const std::vector<double> full = Softmax(logits, 0.7);
  std::fill(keep.begin(), keep.end(), false);
  double mass = 0.0;
  for (const int32_t id : order) {
    keep[id] = true;
    mass += full[id];
    if (mass >= 0.8) break;
  }
  ExpectFrequencies(logits, top_p, Softmax(logits, 0.7, keep));
}

TEST(SamplerTest, FrequenciesOnALargeVocabulary) {
  // 5000 tokens: 10 likely ones and a long tail, so that top-p's selection runs through
  // its partitioning steps. Cells: the 10 head tokens and the tail as one.
  std::vector<float> logits = RandomLogits(5000, 1.0f, 13);
  for (int i = 0; i < 10; ++i) logits[i * 331] += 7.0f;
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.97f;
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  const std::vector<double> full = Softmax(logits, 0.9);
  std::vector<bool> keep(logits.size(), false);
  double mass = 0.0;
  size_t kept = 0;
  for (const int32_t id : order) {
    keep[id] = true;
    ++kept;
    mass += full[id];
    if (mass >= 0.97) break;
  }
  ASSERT_GT(kept, 600u) << "the test wants a cut deep in the tail";
  const std::vector<double> expected = Softmax(logits, 0.9, keep);
  Sampler sampler;
  constexpr int kDraws = 20000;
  std::vector<int> counts(logits.size(), 0);
  for (int step = 0; step < kDraws; ++step) ++counts[SampleCopy(sampler, logits, p, 8, step).token];
  double tail_expected = 0.0;
  int tail_count = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!keep[i]) {
      EXPECT_EQ(counts[i], 0) << i;
    } else if (i % 331 == 0 && i / 331 < 10) {
      EXPECT_NEAR(counts[i] / double(kDraws), expected[i], 0.01) << i;
    } else {
      tail_expected += expected[i];
      tail_count += counts[i];
    }
  }
  EXPECT_NEAR(tail_count / double(kDraws), tail_expected, 0.01);
}

TEST(SamplerTest, MatchesTheReferenceDefinitionExactly) {
  // Every combination, on vocabularies small and large, against a full-sort reference
  // using the same uniform number.
  Sampler sampler;
  int checked = 0;
  for (const size_t vocab : {size_t{7}, size_t{300}, size_t{20000}}) {
    for (const float stddev : {0.5f, 3.0f, -1.0f /* few distinct values */}) {
      std::vector<float> logits = RandomLogits(vocab, std::abs(stddev), vocab * 10 + stddev);
      if (stddev < 0.0f) {
        for (float& x : logits) x = std::round(x * 2.0f) / 2.0f;
      }
      logits[vocab / 2] = logits[vocab / 3];  // a tie
      logits[1] = kNegInf;                     // a masked token
      // At temperature 0.05 most weights underflow.
      for (const SamplingParams& p : sampler_test::TruncationGrid(
               {0.05f, 1.0f, 2.0f}, {0, 1, 5, 200}, {1.0f, 0.5f, 0.95f}, {0.0f, 0.02f})) {
        for (int64_t step = 0; step < 8; ++step) {
          const uint64_t seed = 1000 + step;
          const int32_t got = SampleCopy(sampler, logits, p, seed, step).token;
          const int32_t want = ReferenceSample(logits, p, UniformFromSeedStep(seed, step));
          ASSERT_EQ(got, want) << "vocab " << vocab << " t " << p.temperature << " k "
                               << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 3 * 3 * 3 * 4 * 3 * 2 * 8);
}

TEST(SamplerTest, NearlyEqualAndExtremeLogits) {
  // Logits a few ulps apart, huge magnitudes, and masked tokens, against the reference.
  Sampler sampler;
  std::mt19937 rng(3);
  std::vector<float> close(3000);
  for (float& x : close) {
    x = 7.0f;
    for (int k = std::uniform_int_distribution<int>(0, 5)(rng); k > 0; --k) {
      x = std::nextafter(x, 0.0f);
    }
  }
  std::vector<float> extreme = RandomLogits(3000, 1.0f, 4);
  extreme[10] = 3e38f;
  extreme[11] = -3e38f;
  extreme[12] = 3e38f;
  for (size_t i = 100; i < 3000; i += 3) extreme[i] = kNegInf;
  for (const std::vector<float>* logits : {&close, &extreme}) {
    for (const float top_p : {1.0f, 0.5f}) {
      SamplingParams p;
      p.top_p = top_p;
      p.temperature = 0.8f;
      for (int64_t step = 0; step < 50; ++step) {
        ASSERT_EQ(SampleCopy(sampler, *logits, p, 9, step).token,
                  ReferenceSample(*logits, p, UniformFromSeedStep(9, step)))
            << step;
      }
    }
  }
  // Two tokens at 3e38 share all the mass: ties to the lower id for top-k 1.
  SamplingParams k1;
  k1.top_k = 1;
  EXPECT_EQ(SampleCopy(sampler, extreme, k1, 1, 1).token, 10);
}

TEST(SamplerTest, SuppressTokens) {
  std::vector<float> logits = {1.0f, 5.0f, 2.0f, 4.0f};
  SuppressTokens(logits, std::vector<int32_t>{1, 3});
  EXPECT_EQ(logits[1], kNegInf);
  EXPECT_EQ(logits[3], kNegInf);
  Sampler sampler;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  EXPECT_EQ(SampleCopy(sampler, logits, greedy, 0, 0).token, 2);
  for (int64_t step = 0; step < 100; ++step) {
    const int32_t token = SampleCopy(sampler, logits, SamplingParams{}, 0, step).token;
    EXPECT_TRUE(token == 0 || token == 2) << token;
  }
}

TEST(SamplerTest, ReproducibleWhateverHappensInBetween) {
  const std::vector<float> logits = RandomLogits(1000, 1.0f, 21);
  SamplingParams p;
  p.top_p = 0.9f;
  std::vector<int32_t> alone;
  {
    Sampler sampler;
    for (int64_t step = 0; step < 100; ++step) {
      alone.push_back(SampleCopy(sampler, logits, p, 42, step).token);
    }
  }
  // Same (seed, step) pairs, in reverse order, interleaved with other sequences of other
  // seeds, parameters and vocabulary sizes on the same sampler.
  Sampler sampler;
  const std::vector<float> other = RandomLogits(129280, 2.0f, 22);
  SamplingParams other_params;
  other_params.temperature = 1.3f;
  other_params.top_k = 50;
  other_params.repetition_penalty = 1.2f;
  const std::vector<int32_t> history = {1, 2, 3, 3};
  for (int64_t step = 99; step >= 0; --step) {
    SampleCopy(sampler, other, other_params, 7 + step, step * 3, history, history);
    EXPECT_EQ(SampleCopy(sampler, logits, p, 42, step).token, alone[step]) << step;
  }
  // Another seed gives another sequence.
  int differ = 0;
  for (int64_t step = 0; step < 100; ++step) {
    differ += SampleCopy(sampler, logits, p, 43, step).token != alone[step];
  }
  EXPECT_GT(differ, 80);
}

TEST(SamplerTest, UniformFromSeedStep) {
  std::set<double> seen;
  double sum = 0.0;
  for (uint64_t seed = 0; seed < 100; ++seed) {
    for (int64_t step = 0; step < 100; ++step) {
      const double u = UniformFromSeedStep(seed, step);
      ASSERT_GE(u, 0.0);
      ASSERT_LT(u, 1.0);
      seen.insert(u);
      sum += u;
    }
  }
  EXPECT_EQ(seen.size(), 10000u);
  EXPECT_NEAR(sum / 10000, 0.5, 0.01);
  EXPECT_EQ(UniformFromSeedStep(5, 6), UniformFromSeedStep(5, 6));
}

TEST(SamplerTest, Logprobs) {
  Sampler sampler;
  const std::vector<float> logits = RandomLogits(20, 2.0f, 31);
  SamplingParams p;
  p.logprobs = 20;
  p.temperature = 0.5f;  // logprobs ignore temperature and truncation
  p.top_k = 3;
  const SampledToken t = SampleCopy(sampler, logits, p, 1, 0);
  ASSERT_EQ(t.top_logprobs.size(), 20u);
  double sum = 0.0;
  for (size_t i = 0; i < t.top_logprobs.size(); ++i) {
    const auto [id, lp] = t.top_logprobs[i];
    sum += std::exp(lp);
    if (i > 0) {
      EXPECT_GE(t.top_logprobs[i - 1].second, lp);
    }
    EXPECT_NEAR(lp, std::log(Softmax(logits, 1.0)[id]), 1e-5);
    if (id == t.token) {
      EXPECT_EQ(lp, t.logprob);
    }
  }
  EXPECT_NEAR(sum, 1.0, 1e-5);
  std::set<int32_t> ids;
  for (const auto& [id, lp] : t.top_logprobs) ids.insert(id);
  EXPECT_EQ(ids.size(), 20u);

  // Fewer than the vocabulary: the most likely ones, in order, ties to the lower id.
  p.logprobs = 3;
  const SampledToken small = SampleCopy(sampler, {0.5f, 2.0f, 1.0f, 2.0f, -1.0f}, p, 1, 0);
  ASSERT_EQ(small.top_logprobs.size(), 3u);
  EXPECT_EQ(small.top_logprobs[0].first, 1);
  EXPECT_EQ(small.top_logprobs[1].first, 3);
  EXPECT_EQ(small.top_logprobs[2].first, 2);
  EXPECT_EQ(small.top_logprobs[0].second, small.top_logprobs[1].second);
  // More than the vocabulary: all of it.
  p.logprobs = 10;
  EXPECT_EQ(SampleCopy(sampler, {0.5f, 2.0f}, p, 1, 0).top_logprobs.size(), 2u);
  // None requested.
  p.logprobs = 0;
  const SampledToken none = SampleCopy(sampler, logits, p, 1, 0);
  EXPECT_TRUE(none.top_logprobs.empty());
  EXPECT_NEAR(none.logprob, std::log(Softmax(logits, 1.0)[none.token]), 1e-5);
  // Large vocabulary, greedy.
  const std::vector<float> big = RandomLogits(129280, 2.0f, 32);
  p.temperature = 0.0f;
  p.logprobs = 5;
  const SampledToken g = SampleCopy(sampler, big, p, 1, 0);
  ASSERT_EQ(g.top_logprobs.size(), 5u);
  EXPECT_EQ(g.top_logprobs[0].first, g.token);
  EXPECT_EQ(g.top_logprobs[0].second, g.logprob);
  EXPECT_LT(g.logprob, 0.0f);
}

TEST(SamplerTest, LogitBiasIsAddedBeforeSampling) {
  Sampler sampler;
  std::vector<float> logits = {0.0f, 3.0f, 1.0f, 2.0f};
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.logprobs = 4;
  EXPECT_EQ(SampleCopy(sampler, logits, greedy, 1, 0).token, 1);
  // -100 all but bans the argmax; +100 all but forces a token.
  greedy.logit_bias = {{1, -100.0f}};
  EXPECT_EQ(SampleCopy(sampler, logits, greedy, 1, 0).token, 3);
  greedy.logit_bias = {{0, 100.0f}};
  const SampledToken forced = SampleCopy(sampler, logits, greedy, 1, 0);
  EXPECT_EQ(forced.token, 0);
  // The logprobs are those of the biased logits: log-softmax of {100, 3, 1, 2}.
  const double z = std::log(std::exp(0.0) + std::exp(-97.0) + std::exp(-99.0) + std::exp(-98.0));
  EXPECT_NEAR(forced.logprob, -z, 1e-6);
  // Sampling at temperature 1 with +100 on one token picks it for every seed.
  SamplingParams sampled;
  sampled.logit_bias = {{2, 100.0f}};
  for (uint64_t seed = 0; seed < 50; ++seed) EXPECT_EQ(SampleCopy(sampler, logits, sampled, seed, 0).token, 2);
}

}  // namespace
}  // namespace tandem
