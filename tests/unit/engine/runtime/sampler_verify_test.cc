// Sampler::Verify (speculative decoding's acceptance step), UniformFromSeedStream and
// GreedyDraft. The central check is statistical: over many seeds, Verify's tokens must be
// distributed as Sample's p (Pearson chi-square), and deliberately biased copies of the
// rule must fail the same check, so that the check is known to have the power to catch
// a wrong rule. Every draw is seeded, so the test is deterministic and cannot flake.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "engine/runtime/sampler.h"
#include "tests/unit/engine/runtime/chi_square.h"
#include "tests/unit/engine/runtime/sampler_test_support.h"

namespace tandem {
namespace {

using sampler_test::RandomLogits;
using sampler_test::ReferenceKept;
using sampler_test::ReferenceKeptSet;
using sampler_test::SampleCopy;
using chi_square::ChiSquare;
using chi_square::ChiSquareSurvival;
using chi_square::GoodnessOfFit;
using chi_square::Homogeneity;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

TEST(ChiSquareTest, SurvivalFunctionAgainstKnownValues) {
  // (df, x, P(X >= x)), from mpmath's gammainc at 30 digits.
  struct Known {
    double df;
    double x;
    double q;
  };
  const Known known[] = {
      {1, 3.841458820694124, 0.050000000000000057},
      {2, 5.991464547107979, 0.050000000000000074},
      {10, 18.307038053275146, 0.050000000000000007},
      {10, 23.209251158954356, 0.010000000000000014},
      {30, 50.89218131151707, 0.010000000000000048},
      {100, 124.34211340400407, 0.050000000000000093},
      {5, 1.1454762260617695, 0.94999999999999998},
      {7, 0.5, 0.99944648139042497},
      {25, 24, 0.5193735712784872},
      {60, 30, 0.99958155033167231},
      {200, 260, 0.0027504083673065263},
      {2, 0.001, 0.99950012497916927},  // exp(-x / 2)
      {40, 150, 1.2397921541617167e-14},
      {3, 60, 5.8782307279069123e-13},
      {1, 100, 1.5239706048321052e-23},
  };
  for (const Known& k : known) {
    EXPECT_NEAR(ChiSquareSurvival(k.x, k.df) / k.q, 1.0, 1e-9) << k.df << " " << k.x;
  }
  // Closed forms: df 1 is erfc(sqrt(x / 2)), df 2 is exp(-x / 2), df 4 is
  // exp(-x / 2) (1 + x / 2); over both branches of the evaluation.
  for (double x = 0.05; x < 120.0; x *= 1.3) {
    EXPECT_NEAR(ChiSquareSurvival(x, 1) / std::erfc(std::sqrt(x / 2)), 1.0, 1e-9) << x;
    EXPECT_NEAR(ChiSquareSurvival(x, 2) / std::exp(-x / 2), 1.0, 1e-9) << x;
    EXPECT_NEAR(ChiSquareSurvival(x, 4) / (std::exp(-x / 2) * (1 + x / 2)), 1.0, 1e-9) << x;
  }
  EXPECT_EQ(ChiSquareSurvival(0.0, 3), 1.0);
}

TEST(ChiSquareTest, PearsonPoolsSmallCells) {
  // 30 vs 70 where 50 / 50 was expected: (20^2 / 50) * 2 = 16 on 1 df.
  ChiSquare c = GoodnessOfFit({30, 70}, {0.5, 0.5});
  EXPECT_DOUBLE_EQ(c.statistic, 16.0);
  EXPECT_EQ(c.df, 1);
  EXPECT_NEAR(c.p_value / std::erfc(std::sqrt(8.0)), 1.0, 1e-9);
  // Exact agreement.
  c = GoodnessOfFit({25, 25, 50}, {0.25, 0.25, 0.5});
  EXPECT_EQ(c.statistic, 0.0);
  EXPECT_EQ(c.p_value, 1.0);
  // Expectations 100, 94, 2, 2, 2 over 200 draws: the three small cells pool to 6.
  c = GoodnessOfFit({100, 94, 2, 2, 2}, {0.5, 0.47, 0.01, 0.01, 0.01});
  EXPECT_EQ(c.df, 2);
  EXPECT_NEAR(c.statistic, 0.0, 1e-12);
  // Expectations 100, 98, 1, 1: the pool (2) joins the cell of 98.
  c = GoodnessOfFit({100, 98, 1, 1}, {0.5, 0.49, 0.005, 0.005});
  EXPECT_EQ(c.df, 1);
  EXPECT_NEAR(c.statistic, 0.0, 1e-12);
  // An outcome of probability 0.
  EXPECT_EQ(GoodnessOfFit({10, 1}, {1.0, 0.0}).p_value, 0.0);
  // Two samples: identical counts, then clearly different ones.
  EXPECT_NEAR(Homogeneity({10, 20, 30}, {10, 20, 30}).statistic, 0.0, 1e-12);
  EXPECT_LT(Homogeneity({100, 200, 300}, {300, 200, 100}).p_value, 1e-20);
  EXPECT_EQ(Homogeneity({100, 200, 300}, {300, 200, 100}).df, 2);
}

// ---------------------------------------------------------------------------------------
// Verify's rule on a reference kept set, and the biased copies that the chi-square check
// must reject.

enum class Rule {
  kCorrect,
  kOverAccept,         // accepts with min(1, 1.5 p(draft))
  kRedrawWithDraft,    // redraws from p itself, the draft not removed
  kUntruncatedAccept,  // p(draft) from the weights before top-k, top-p and min-p
};

const char* RuleName(Rule rule) {
  switch (rule) {
    case Rule::kCorrect:
      return "correct";
    case Rule::kOverAccept:
      return "accept min(1, 1.5p)";
    case Rule::kRedrawWithDraft:
      return "redraw keeps draft";
    case Rule::kUntruncatedAccept:
      return "untruncated p(draft)";
  }
  return "?";
}

// sampler.h's description of Verify's non-greedy rule, written directly.
int32_t ReferenceVerify(const ReferenceKeptSet& kept, uint64_t seed, int64_t step, int32_t draft,
                        Rule rule) {
  const std::vector<float>& w = kept.weights;
  double draft_weight = kept.is_kept[draft] ? static_cast<double>(w[draft]) : 0.0;
  double mass = kept.mass;
  if (rule == Rule::kUntruncatedAccept) {
    draft_weight = w[draft];
    mass = std::accumulate(w.begin(), w.end(), 0.0);
  }
  if (rule == Rule::kOverAccept) draft_weight *= 1.5;
  if (UniformFromSeedStream(seed, step, SeedStream::kDraftAccept) * mass < draft_weight) {
    return draft;
  }
  const auto candidate = [&](size_t i) {
    return kept.is_kept[i] && (rule == Rule::kRedrawWithDraft || static_cast<int32_t>(i) != draft);
  };
  double rest = 0.0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (candidate(i)) rest += w[i];
  }
  if (!(rest > 0.0)) return draft;
  const double threshold = UniformFromSeedStream(seed, step, SeedStream::kDraftRedraw) * rest;
  double acc = 0.0;
  int32_t chosen = draft;
  for (size_t i = 0; i < w.size(); ++i) {
    if (!candidate(i)) continue;
    acc += w[i];
    chosen = static_cast<int32_t>(i);
    if (acc > threshold) break;
  }
  return chosen;
}

// The most likely token outside the kept set; `masked` (a token of weight 0) when there
// is none of positive weight.
int32_t MostLikelyTruncated(const ReferenceKeptSet& kept, int32_t masked) {
  int32_t truncated = masked;
  for (size_t i = 0; i < kept.weights.size(); ++i) {
    if (!kept.is_kept[i] && kept.weights[i] > kept.weights[truncated]) {
      truncated = static_cast<int32_t>(i);
    }
  }
  return truncated;
}

VerifiedToken VerifyCopy(Sampler& sampler, std::vector<float> logits, const SamplingParams& p,
                         uint64_t seed, int64_t step, int32_t draft,
                         std::span<const int32_t> prompt = {},
                         std::span<const int32_t> output = {}) {
  return sampler.Verify(logits, p, seed, step, prompt, output, draft);
}

std::vector<float> Penalized(Sampler& sampler, std::vector<float> logits, const SamplingParams& p,
                             std::span<const int32_t> prompt, std::span<const int32_t> output) {
  sampler.ApplyPenalties(logits, p, prompt, output);
  return logits;
}

// ---------------------------------------------------------------------------------------

TEST(SamplerVerifyTest, SeedStreams) {
  // kSample is UniformFromSeedStep bit for bit; the streams never repeat a value.
  std::set<double> seen;
  double sum[3] = {0, 0, 0};
  double cross = 0.0;  // sum of (u_a - 1/2)(u_r - 1/2) and (u_s - 1/2)(u_a - 1/2): ~0
  constexpr int kSeeds = 60;
  constexpr int kSteps = 60;
  std::vector<int64_t> bins(20, 0);
  for (uint64_t seed = 0; seed < kSeeds; ++seed) {
    for (int64_t step = 0; step < kSteps; ++step) {
      const double s = UniformFromSeedStream(seed * 7919, step, SeedStream::kSample);
      ASSERT_EQ(s, UniformFromSeedStep(seed * 7919, step));
      const double a = UniformFromSeedStream(seed * 7919, step, SeedStream::kDraftAccept);
      const double r = UniformFromSeedStream(seed * 7919, step, SeedStream::kDraftRedraw);
      for (const double u : {s, a, r}) {
        ASSERT_GE(u, 0.0);
        ASSERT_LT(u, 1.0);
        seen.insert(u);
        ++bins[static_cast<size_t>(u * 20)];
      }
      sum[0] += s;
      sum[1] += a;
      sum[2] += r;
      cross += (a - 0.5) * (r - 0.5) + (s - 0.5) * (a - 0.5);
    }
  }
  constexpr int kDraws = kSeeds * kSteps;
  EXPECT_EQ(seen.size(), 3u * kDraws);
  for (const double s : sum) EXPECT_NEAR(s / kDraws, 0.5, 0.02);
  // Correlation: each product has variance 1/144; 2 * kDraws of them.
  EXPECT_LT(std::abs(cross / (2 * kDraws)) * 12.0, 5.0 / std::sqrt(2.0 * kDraws));
  EXPECT_GT(GoodnessOfFit(bins, std::vector<double>(20, 0.05)).p_value, 0.01);
  // Steps of other streams do not alias: the accept stream at step s is not the sample
  // stream at any small step.
  std::set<double> sample_stream;
  for (int64_t step = 0; step < 100000; ++step) {
    sample_stream.insert(UniformFromSeedStep(3, step));
  }
  for (int64_t step = 0; step < 1000; ++step) {
    EXPECT_EQ(sample_stream.count(UniformFromSeedStream(3, step, SeedStream::kDraftAccept)), 0u);
    EXPECT_EQ(sample_stream.count(UniformFromSeedStream(3, step, SeedStream::kDraftRedraw)), 0u);
  }
}

TEST(SamplerVerifyTest, GreedyIsSamplesArgmax) {
  Sampler sampler;
  std::mt19937_64 rng(5);
  int accepted = 0;
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const size_t vocab = std::vector<size_t>{2, 7, 64, 1000, 5000}[trial % 5];
    std::vector<float> logits = RandomLogits(vocab, 2.0f, 100 + trial);
    if (trial % 3 == 0) {
      for (float& x : logits) x = std::round(x);  // many ties
    }
    if (trial % 7 == 0) logits[trial % vocab] = kNegInf;
    SamplingParams p;
    p.temperature = trial % 2 == 0 ? 0.0f : 5e-6f;
    p.logprobs = 3;
    std::vector<int32_t> history;
    if (trial % 4 == 0) {
      p.repetition_penalty = 1.5f;
      p.presence_penalty = 0.5f;
      for (int i = 0; i < 5; ++i) history.push_back(static_cast<int32_t>(rng() % vocab));
    }
    const SampledToken want = SampleCopy(sampler, logits, p, trial, trial, history, history);
    std::vector<int32_t> drafts = {want.token, static_cast<int32_t>(rng() % vocab), 0,
                                   static_cast<int32_t>(vocab - 1)};
    for (const int32_t draft : drafts) {
      const VerifiedToken got =
          VerifyCopy(sampler, logits, p, trial, trial, draft, history, history);
      ASSERT_EQ(got.sampled.token, want.token) << trial;
      ASSERT_EQ(got.accepted, draft == want.token) << trial << " " << draft;
      EXPECT_EQ(got.sampled.logprob, want.logprob);
      EXPECT_EQ(got.sampled.top_logprobs, want.top_logprobs);
      accepted += got.accepted;
      ++checked;
    }
  }
  EXPECT_GE(accepted, 400);
  EXPECT_LT(accepted, checked);
  // Ties: the lowest id is the argmax, so a tying draft of a higher id is refused.
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  EXPECT_FALSE(VerifyCopy(sampler, {1.0f, 5.0f, 5.0f}, greedy, 0, 0, 2).accepted);
  const VerifiedToken tie = VerifyCopy(sampler, {1.0f, 5.0f, 5.0f}, greedy, 0, 0, 1);
  EXPECT_TRUE(tie.accepted);
  EXPECT_EQ(tie.sampled.token, 1);
}

TEST(SamplerVerifyTest, SampledIsAPureFunctionOfItsInputs) {
  const std::vector<float> logits = RandomLogits(1000, 1.5f, 21);
  SamplingParams p;
  p.top_p = 0.9f;
  p.temperature = 0.8f;
  p.repetition_penalty = 1.1f;
  const std::vector<int32_t> history = {5, 6, 7};
  const int32_t draft = sampler_test::ReferenceKept(logits, p).ids[1];  // likely, not certain
  std::vector<VerifiedToken> alone;
  {
    Sampler sampler;
    for (int64_t step = 0; step < 200; ++step) {
      alone.push_back(VerifyCopy(sampler, logits, p, 42, step, draft, history, history));
    }
  }
  int accepted = 0;
  for (const VerifiedToken& v : alone) accepted += v.accepted;
  EXPECT_GT(accepted, 5);
  EXPECT_LT(accepted, 195);
  // The same calls in reverse order, interleaved with other rows, parameters and
  // vocabularies on one sampler, give the same results.
  Sampler sampler;
  const std::vector<float> other = RandomLogits(129280, 2.0f, 22);
  SamplingParams other_params;
  other_params.temperature = 1.3f;
  other_params.top_k = 50;
  for (int64_t step = 199; step >= 0; --step) {
    VerifyCopy(sampler, other, other_params, 7 + step, step * 3, 17, history, history);
    SampleCopy(sampler, other, other_params, 7 + step, step * 3, history, history);
    const VerifiedToken again = VerifyCopy(sampler, logits, p, 42, step, draft, history, history);
    EXPECT_EQ(again.sampled.token, alone[step].sampled.token) << step;
    EXPECT_EQ(again.accepted, alone[step].accepted) << step;
  }
  // Other seeds, or the same seed at other steps, give other draws.
  int token_differs = 0;
  int step_differs = 0;
  for (int64_t step = 0; step < 200; ++step) {
    token_differs +=
        VerifyCopy(sampler, logits, p, 43, step, draft, history, history).sampled.token !=
        alone[step].sampled.token;
    step_differs +=
        VerifyCopy(sampler, logits, p, 42, step + 200, draft, history, history).sampled.token !=
        alone[step].sampled.token;
  }
  EXPECT_GT(token_differs, 100);
  EXPECT_GT(step_differs, 100);
}

TEST(SamplerVerifyTest, MatchesTheReferenceRuleExactly) {
  // Every truncation on small and large vocabularies; drafts likely, random, truncated
  // and masked; against ReferenceVerify with the same draws. (Verify sums the redraw's
  // mass per block of ids, the reference in one run: they could part only where a draw
  // falls within rounding of a boundary, about 1e-16 of the time.)
  Sampler sampler;
  int checked = 0;
  int accepted = 0;
  for (const size_t vocab : {size_t{7}, size_t{300}, size_t{20000}}) {
    std::vector<float> logits = RandomLogits(vocab, 2.0f, vocab + 1);
    logits[vocab / 2] = logits[vocab / 3];  // a tie
    logits[1] = kNegInf;                    // a masked token
    for (const SamplingParams& p : sampler_test::TruncationGrid(
             {0.05f, 1.0f, 2.0f}, {0, 2, 200}, {1.0f, 0.5f, 0.95f}, {0.0f, 0.02f})) {
      const ReferenceKeptSet kept = ReferenceKept(logits, p);
      const int32_t drafts[] = {kept.ids[0], static_cast<int32_t>((vocab * 5) / 7),
                                MostLikelyTruncated(kept, 1), 1};
      for (const int32_t draft : drafts) {
        for (int64_t step = 0; step < 6; ++step) {
          const uint64_t seed = 500 + step;
          const VerifiedToken got = VerifyCopy(sampler, logits, p, seed, step, draft);
          ASSERT_EQ(got.sampled.token, ReferenceVerify(kept, seed, step, draft, Rule::kCorrect))
              << "vocab " << vocab << " t " << p.temperature << " k " << p.top_k << " top_p "
              << p.top_p << " min_p " << p.min_p << " draft " << draft << " step " << step;
          ASSERT_EQ(got.accepted, got.sampled.token == draft);
          ASSERT_TRUE(kept.is_kept[got.sampled.token]);
          accepted += got.accepted;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 3 * 3 * 3 * 3 * 2 * 4 * 6);
  EXPECT_GT(accepted, checked / 10);
}

TEST(SamplerVerifyTest, CertainAndImpossibleDrafts) {
  Sampler sampler;
  const std::vector<float> logits = {0.5f, 2.0f, 1.0f, kNegInf, 1.5f, -1.0f};
  SamplingParams top1;
  top1.top_k = 1;
  SamplingParams top3;
  top3.top_k = 3;  // keeps 1, 4, 2
  for (int64_t step = 0; step < 300; ++step) {
    // p(draft) = 1: always accepted.
    EXPECT_TRUE(VerifyCopy(sampler, logits, top1, 9, step, 1).accepted);
    // Truncated or masked drafts: never accepted, never the corrected token.
    for (const int32_t draft : {0, 3, 5}) {
      const VerifiedToken v = VerifyCopy(sampler, logits, top3, 9, step, draft);
      EXPECT_FALSE(v.accepted);
      EXPECT_TRUE(v.sampled.token == 1 || v.sampled.token == 4 || v.sampled.token == 2)
          << v.sampled.token;
    }
    // A refused draft is never the corrected token.
    const VerifiedToken v = VerifyCopy(sampler, logits, top3, 9, step, 4);
    EXPECT_EQ(v.accepted, v.sampled.token == 4);
  }
}

TEST(SamplerVerifyTest, LogprobsAreSamples) {
  Sampler sampler;
  const std::vector<float> logits = RandomLogits(20, 2.0f, 31);
  const std::vector<int32_t> output = {3, 3, 8};
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 6;
  p.repetition_penalty = 1.3f;
  p.frequency_penalty = 0.4f;
  p.logprobs = kMaxLogprobs;  // the whole vocabulary of 20
  const SampledToken all = SampleCopy(sampler, logits, p, 1, 0, {}, output);
  ASSERT_EQ(all.top_logprobs.size(), 20u);
  std::vector<float> logprob(20);
  for (const auto& [id, lp] : all.top_logprobs) logprob[id] = lp;
  std::set<int32_t> tokens;
  for (int64_t step = 0; step < 200; ++step) {
    const VerifiedToken v = VerifyCopy(sampler, logits, p, 77, step, step % 20, {}, output);
    EXPECT_EQ(v.sampled.logprob, logprob[v.sampled.token]);
    EXPECT_EQ(v.sampled.top_logprobs, all.top_logprobs);
    tokens.insert(v.sampled.token);
  }
  EXPECT_GE(tokens.size(), 3u);  // top-k 6
  EXPECT_LE(tokens.size(), 6u);
}

TEST(SamplerVerifyDeathTest, DraftOutsideTheVocabulary) {
  Sampler sampler;
  std::vector<float> logits(4, 0.0f);
  EXPECT_DEATH(sampler.Verify(logits, SamplingParams{}, 0, 0, {}, {}, -1), "vocabulary");
  EXPECT_DEATH(sampler.Verify(logits, SamplingParams{}, 0, 0, {}, {}, 4), "vocabulary");
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  EXPECT_DEATH(sampler.Verify(logits, greedy, 0, 0, {}, {}, 4), "vocabulary");
}

// ---------------------------------------------------------------------------------------
// Distribution preservation.

struct TargetRow {
  const char* name;
  size_t vocab;
  uint64_t logits_seed;
  SamplingParams params;
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
};

std::vector<TargetRow> TargetRows() {
  std::vector<TargetRow> rows;
  SamplingParams p;
  p.temperature = 1.0f;
  rows.push_back({"T 1.0, untruncated", 12, 1, p, {}, {}});
  p = SamplingParams{};
  p.temperature = 0.7f;
  p.top_k = 8;
  rows.push_back({"T 0.7, top-k 8", 30, 2, p, {}, {}});
  p = SamplingParams{};
  p.temperature = 1.3f;
  p.top_p = 0.8f;
  rows.push_back({"T 1.3, top-p 0.8", 50, 3, p, {}, {}});
  p = SamplingParams{};
  p.temperature = 1.0f;
  p.min_p = 0.1f;
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.5f;
  rows.push_back({"min-p 0.1, repetition, presence", 40, 4, p, {0, 1, 2, 3}, {0, 4, 4}});
  p = SamplingParams{};
  p.temperature = 0.9f;
  p.top_k = 12;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.repetition_penalty = 1.2f;
  p.frequency_penalty = 0.3f;
  rows.push_back({"T 0.9, top-k/p/min-p, penalties", 25, 5, p, {1, 2}, {2, 2, 7, 9}});
  return rows;
}

TEST(SamplerVerifyTest, DistributionPreservedChiSquare) {
  // For each row, drafts likely, unlikely and truncated: Verify's counts over kDraws
  // seeds against the exact p, and against Sample's counts; each p-value must exceed
  // 0.01. Every check draws at its own step, so the checks are independent. The biased
  // rules, on the same draws, must fall below 1e-6 wherever their bias moves the
  // distribution by a clear margin.
  //
  // The draws are fixed, so the test is deterministic. Under a correct rule p-values are
  // uniform: over 2000 other steps per (row, draft) the share below 0.01 was 0.95% (so
  // with these 35 checks a fresh choice of steps fails one about 3 times in 10, and the
  // step base is fixed once; a wrong rule fails by dozens of orders of magnitude).
  constexpr int kDraws = 30000;
  constexpr double kPass = 0.01;
  constexpr double kBiasFails = 1e-6;
  const Rule kBiased[] = {Rule::kOverAccept, Rule::kRedrawWithDraft, Rule::kUntruncatedAccept};
  int biased_checked[4] = {0, 0, 0, 0};
  Sampler sampler;
  int64_t row_id = 0;
  for (const TargetRow& row : TargetRows()) {
    ++row_id;
    std::vector<float> logits = RandomLogits(row.vocab, 1.5f, row.logits_seed);
    logits[row.vocab - 1] = kNegInf;  // never a candidate
    const SamplingParams& p = row.params;
    const ReferenceKeptSet kept =
        ReferenceKept(Penalized(sampler, logits, p, row.prompt, row.output), p);
    const std::vector<double> exact = kept.Probabilities();
    const double total = std::accumulate(kept.weights.begin(), kept.weights.end(), 0.0);

    std::vector<int64_t> sampled(row.vocab, 0);
    for (int i = 0; i < kDraws; ++i) {
      ++sampled[SampleCopy(sampler, logits, p, i, 1000 * row_id, row.prompt, row.output).token];
    }
    const ChiSquare sample_fit = GoodnessOfFit(sampled, exact);
    std::printf("%s: %zu kept of %zu; Sample vs p: chi2 %.1f df %d p-value %.3f\n", row.name,
                kept.ids.size(), row.vocab, sample_fit.statistic, sample_fit.df,
                sample_fit.p_value);
    EXPECT_GT(sample_fit.p_value, kPass) << row.name;

    // Likely: the most probable. Unlikely: the least probable kept token with p >= 0.02.
    // Truncated: the most probable token outside the kept set (the masked one when
    // nothing is truncated).
    int32_t unlikely = kept.ids[0];
    for (const int32_t id : kept.ids) {
      if (exact[id] >= 0.02) unlikely = id;
    }
    const int32_t truncated = MostLikelyTruncated(kept, static_cast<int32_t>(row.vocab - 1));
    const std::pair<const char*, int32_t> drafts[] = {
        {"likely", kept.ids[0]}, {"unlikely", unlikely}, {"truncated", truncated}};
    int64_t step = 1000 * row_id;
    for (const auto& [kind, draft] : drafts) {
      ++step;
      std::vector<int64_t> verified(row.vocab, 0);
      int64_t accepted = 0;
      int mismatches = 0;
      std::vector<std::vector<int64_t>> biased(4, std::vector<int64_t>(row.vocab, 0));
      for (int i = 0; i < kDraws; ++i) {
        const VerifiedToken v =
            VerifyCopy(sampler, logits, p, i, step, draft, row.prompt, row.output);
        ++verified[v.sampled.token];
        accepted += v.accepted;
        mismatches += v.sampled.token != ReferenceVerify(kept, i, step, draft, Rule::kCorrect);
        for (const Rule rule : kBiased) {
          ++biased[static_cast<int>(rule)][ReferenceVerify(kept, i, step, draft, rule)];
        }
      }
      const ChiSquare fit = GoodnessOfFit(verified, exact);
      const ChiSquare same = Homogeneity(verified, sampled);
      const double pd = exact[draft];
      std::printf(
          "  draft %-9s p %.3f accepted %.3f: vs p chi2 %.1f df %d p-value %.3f; "
          "vs Sample p-value %.3f\n",
          kind, pd, static_cast<double>(accepted) / kDraws, fit.statistic, fit.df, fit.p_value,
          same.p_value);
      EXPECT_GT(fit.p_value, kPass) << row.name << ", " << kind;
      EXPECT_GT(same.p_value, kPass) << row.name << ", " << kind;
      EXPECT_EQ(mismatches, 0) << row.name << ", " << kind;
      // The acceptance count is Binomial(kDraws, p(draft)).
      EXPECT_LE(std::abs(accepted - pd * kDraws), 5.0 * std::sqrt(kDraws * pd * (1 - pd)) + 0.5)
          << row.name << ", " << kind;

      for (const Rule rule : kBiased) {
        const ChiSquare b = GoodnessOfFit(biased[static_cast<int>(rule)], exact);
        // Where each bias moves p(draft) by a clear margin (elsewhere it is no bias:
        // 1.5 * 0 is 0, and removing a draft of p 0 changes nothing).
        // A truncated draft accepted even rarely is an impossible outcome.
        const double untruncated = kept.weights[draft] / total;
        const bool expect_fail =
            (rule == Rule::kOverAccept && pd >= 0.02) ||
            (rule == Rule::kRedrawWithDraft && pd >= 0.02 && pd <= 0.98) ||
            (rule == Rule::kUntruncatedAccept &&
             (std::abs(untruncated - pd) >= 0.02 || (pd == 0.0 && untruncated * kDraws >= 20)));
        std::printf("    %-22s chi2 %9.1f p-value %.3g%s\n", RuleName(rule), b.statistic, b.p_value,
                    expect_fail ? "" : " (not required to fail)");
        if (expect_fail) {
          EXPECT_LT(b.p_value, kBiasFails) << row.name << ", " << kind << ", " << RuleName(rule);
          ++biased_checked[static_cast<int>(rule)];
        }
      }
    }
  }
  // Each bias was caught in several cases.
  EXPECT_GE(biased_checked[static_cast<int>(Rule::kOverAccept)], 8);
  EXPECT_GE(biased_checked[static_cast<int>(Rule::kRedrawWithDraft)], 8);
  EXPECT_GE(biased_checked[static_cast<int>(Rule::kUntruncatedAccept)], 4);
}

TEST(SamplerVerifyTest, Speed) {
  // Prints Verify's time against Sample's on a full vocabulary (sampler.h quotes it); a
  // draft outside the kept set, so that every call takes the refusal path. No bound is
  // asserted: timings on shared machines flake.
  std::vector<float> logits = RandomLogits(129280, 2.0f, 1);
  logits[0] = -1000.0f;  // weight 0: never accepted
  Sampler sampler;
  for (const float top_p : {1.0f, 0.9f}) {
    SamplingParams p;
    p.top_p = top_p;
    constexpr int kIters = 100;
    double sample_us = 0.0;
    double verify_us = 0.0;
    for (int i = 0; i < kIters; ++i) {
      std::vector<float> copy = logits;
      auto start = std::chrono::steady_clock::now();
      sampler.Sample(copy, p, i, 0, {}, {});
      sample_us +=
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count();
      copy = logits;
      start = std::chrono::steady_clock::now();
      const VerifiedToken v = sampler.Verify(copy, p, i, 0, {}, {}, 0);
      verify_us +=
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count();
      ASSERT_FALSE(v.accepted);
    }
    std::printf("vocab 129280, top_p %.1f: Sample %.0f us, Verify (refused) %.0f us\n", top_p,
                sample_us / kIters, verify_us / kIters);
  }
}

// ---------------------------------------------------------------------------------------

TEST(GreedyDraftTest, ArgmaxAndConfidence) {
  for (const size_t vocab : {size_t{1}, size_t{5}, size_t{1000}, size_t{129280}}) {
    for (const float stddev : {0.5f, 3.0f}) {
      std::vector<float> logits = RandomLogits(vocab, stddev, vocab + 7);
      if (vocab > 4) logits[3] = kNegInf;
      const DraftChoice choice = GreedyDraft(logits);
      const int32_t argmax =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      double sum = 0.0;
      for (const float x : logits) sum += std::exp(static_cast<double>(x - logits[argmax]));
      EXPECT_EQ(choice.token, argmax) << vocab;
      EXPECT_NEAR(choice.confidence * sum, 1.0, 1e-6) << vocab;
    }
  }
  // Ties to the lowest id; masked tokens have no mass.
  DraftChoice tie = GreedyDraft(std::vector<float>{2.0f, 2.0f, 1.0f});
  EXPECT_EQ(tie.token, 0);
  EXPECT_NEAR(tie.confidence, 1.0 / (2.0 + std::exp(-1.0)), 1e-7);
  const DraftChoice sure = GreedyDraft(std::vector<float>{kNegInf, 3.0f, kNegInf});
  EXPECT_EQ(sure.token, 1);
  EXPECT_EQ(sure.confidence, 1.0f);
}

TEST(GreedyDraftDeathTest, InvalidRows) {
  EXPECT_DEATH(GreedyDraft(std::vector<float>{1.0f, std::nanf("")}), "NaN");
  EXPECT_DEATH(GreedyDraft(std::vector<float>{kNegInf, kNegInf}), "finite");
}

}  // namespace
}  // namespace tandem
