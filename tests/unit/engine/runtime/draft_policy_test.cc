// DraftPolicy (engine/runtime/draft_policy.h): measures drafting and not drafting per
// batch-size bucket, then drafts where drafting measured faster, trying the other way for
// explore_steps of every explore_every steps.
#include "engine/runtime/draft_policy.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

// Runs `steps` decisions for a batch of `decoding`, each step recorded at the rate of the
// way it went (tokens per second: with drafts `with`, without `without`); how many drafted.
int Steps(DraftPolicy& p, int64_t decoding, int steps, double with, double without) {
  int drafted = 0;
  for (int i = 0; i < steps; ++i) {
    const bool d = p.Drafts(decoding);
    drafted += d ? 1 : 0;
    p.Record(decoding, d, 100, 100.0 / (d ? with : without));
  }
  return drafted;
}

TEST(DraftPolicyTest, MeasuresBothThenKeepsTheFasterWithSomeExploration) {
  DraftPolicy p({.warmup_steps = 4, .explore_every = 50, .explore_steps = 5});
  // Warm-up: drafting first, then not.
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(p.Drafts(1));
    p.Record(1, true, 10, 1.0);
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_FALSE(p.Drafts(1));
    p.Record(1, false, 10, 2.0);
  }
  EXPECT_DOUBLE_EQ(p.Rate(1, true), 10.0);
  EXPECT_DOUBLE_EQ(p.Rate(1, false), 5.0);
  // Drafting is twice as fast: 45 of every 50 steps draft.
  EXPECT_EQ(Steps(p, 1, 500, 10.0, 5.0), 450);
}

TEST(DraftPolicyTest, StopsDraftingWhereItIsSlowerAndComesBackWhenItPays) {
  DraftPolicy p({.warmup_steps = 4, .explore_every = 40, .explore_steps = 4, .smoothing = 0.5});
  EXPECT_LE(Steps(p, 64, 400, 3.0, 5.0), 4 + 40);  // warm-up, then only exploration
  // The load changed: drafting pays again; the exploration steps see it.
  const int later = Steps(p, 64, 400, 9.0, 5.0);
  EXPECT_GE(later, 300);
}

TEST(DraftPolicyTest, BucketsAreIndependentAndBadMeasurementsIgnored) {
  DraftPolicy p({.warmup_steps = 2, .explore_every = 100, .explore_steps = 1});
  Steps(p, 1, 50, 10.0, 5.0);     // batch 1: drafting pays
  Steps(p, 100, 50, 2.0, 5.0);    // batch 100: it does not
  EXPECT_GT(p.Rate(1, true), p.Rate(1, false));
  EXPECT_LT(p.Rate(100, true), p.Rate(100, false));
  EXPECT_TRUE(p.Drafts(1));
  EXPECT_FALSE(p.Drafts(100));
  const double before = p.Rate(3, true);
  p.Record(3, true, 10, 0.0);   // no time: ignored
  p.Record(3, true, 0, 1.0);    // no tokens: ignored
  EXPECT_EQ(p.Rate(3, true), before);
}

}  // namespace
}  // namespace tandem
