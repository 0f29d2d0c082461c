#include "services/security/token_bucket.h"

#include "gtest/gtest.h"

namespace tandem::security {
namespace {

using Clock = TokenBucket::Clock;
using std::chrono::milliseconds;

TEST(TokenBucketTest, StartsFullTakesBurstThenRefusesWithTheWaitForOneToken) {
  const Clock::time_point t0{};
  TokenBucket b(/*rate=*/2.0, /*burst=*/3.0, t0);
  EXPECT_EQ(b.TryTake(t0), Clock::duration::zero());
  EXPECT_EQ(b.TryTake(t0), Clock::duration::zero());
  EXPECT_EQ(b.TryTake(t0), Clock::duration::zero());
  // Empty: one token comes every 500 ms.
  EXPECT_EQ(std::chrono::duration_cast<milliseconds>(b.TryTake(t0)), milliseconds(500));
  // A refusal takes nothing: 200 ms later the wait is 300 ms.
  EXPECT_EQ(std::chrono::duration_cast<milliseconds>(b.TryTake(t0 + milliseconds(200))), milliseconds(300));
  EXPECT_EQ(b.TryTake(t0 + milliseconds(500)), Clock::duration::zero());
  EXPECT_GT(b.TryTake(t0 + milliseconds(500)), Clock::duration::zero());
}

TEST(TokenBucketTest, RefillStopsAtTheBurst) {
  const Clock::time_point t0{};
  TokenBucket b(/*rate=*/10.0, /*burst=*/2.0, t0);
  // An hour idle refills two tokens, not 36000.
  const Clock::time_point later = t0 + std::chrono::hours(1);
  EXPECT_EQ(b.TryTake(later), Clock::duration::zero());
  EXPECT_EQ(b.TryTake(later), Clock::duration::zero());
  EXPECT_GT(b.TryTake(later), Clock::duration::zero());
}

TEST(TokenBucketTest, SustainedRateIsTheConfiguredOne) {
  const Clock::time_point t0{};
  TokenBucket b(/*rate=*/5.0, /*burst=*/1.0, t0);
  int admitted = 0;
  // Ten seconds of attempts every 10 ms: 1 (the initial token) + 5/s x 10 s.
  for (int i = 0; i <= 1000; ++i) admitted += b.TryTake(t0 + milliseconds(10 * i)) == Clock::duration::zero();
  EXPECT_EQ(admitted, 51);
}

TEST(TokenBucketTest, TimeGoingBackwardsAddsNothing) {
  const Clock::time_point t0 = Clock::time_point{} + std::chrono::seconds(100);
  TokenBucket b(/*rate=*/1.0, /*burst=*/1.0, t0);
  EXPECT_EQ(b.TryTake(t0), Clock::duration::zero());
  EXPECT_GT(b.TryTake(t0 - std::chrono::seconds(50)), Clock::duration::zero());
  EXPECT_GT(b.TryTake(t0 + milliseconds(999)), Clock::duration::zero());
  EXPECT_EQ(b.TryTake(t0 + milliseconds(1000)), Clock::duration::zero());
}

}  // namespace
}  // namespace tandem::security
