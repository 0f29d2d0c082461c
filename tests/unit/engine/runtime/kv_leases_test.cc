// The decode side's leases and the quarantine of expired ones (kv_leases.h), on a block
// manager with a hand-driven clock: an expired reservation's blocks are never handed out
// again until the writer is known to have ended or the fallback bound passed.
#include "engine/runtime/kv_leases.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace tandem {
namespace {

constexpr double kLease = 5.0;
constexpr double kQuarantine = 20.0;

std::set<int32_t> AsSet(const std::vector<int32_t>& v) { return {v.begin(), v.end()}; }

TEST(KvLeasesTest, ExpiredBlocksAreQuarantinedNotReused) {
  BlockManager bm(4);
  KvLeases leases(&bm, kLease, kQuarantine);
  absl::StatusOr<std::vector<int32_t>> a = leases.Reserve("a", 2, 100, /*now=*/0);
  ASSERT_TRUE(a.ok()) << a.status();
  leases.Tick(kLease - 0.01);
  EXPECT_NE(leases.Find("a"), nullptr);
  leases.Tick(kLease);  // expired: a prefill may still be writing into a's blocks
  EXPECT_EQ(leases.Find("a"), nullptr);
  EXPECT_TRUE(leases.Contains("a"));
  EXPECT_EQ(leases.stats().expired, 1);
  EXPECT_EQ(leases.stats().quarantined_blocks, 2);
  EXPECT_EQ(leases.stats().quarantined_leases, 1);
  EXPECT_EQ(bm.num_in_use(), 2);
  // Another request gets only the two other blocks, never a's, however often it asks.
  absl::StatusOr<std::vector<int32_t>> b = leases.Reserve("b", 2, 100, kLease);
  ASSERT_TRUE(b.ok()) << b.status();
  for (int32_t x : *b) EXPECT_FALSE(AsSet(*a).contains(x)) << "block " << x << " of the expired lease reused";
  absl::StatusOr<std::vector<int32_t>> c = leases.Reserve("c", 1, 10, kLease);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("2 quarantined"), std::string::npos) << c.status();
  // The expired lease cannot be decoded from, nor its id reserved again while quarantined.
  EXPECT_FALSE(leases.Take("a").has_value());
  EXPECT_EQ(leases.Reserve("a", 1, 10, kLease).status().code(), absl::StatusCode::kInvalidArgument);
  bm.CheckInvariants();
}

TEST(KvLeasesTest, ReleaseEndsTheQuarantineAtOnce) {
  BlockManager bm(4);
  KvLeases leases(&bm, kLease, kQuarantine);
  ASSERT_TRUE(leases.Reserve("a", 3, 100, 0).ok());
  leases.Tick(kLease + 1);
  ASSERT_EQ(leases.stats().quarantined_blocks, 3);
  EXPECT_TRUE(leases.Release("a"));  // the writer ended (the router's Release, or the Decode call)
  EXPECT_EQ(leases.stats().quarantined_blocks, 0);
  EXPECT_EQ(leases.stats().quarantine_released, 1);
  EXPECT_EQ(bm.num_in_use(), 0);
  EXPECT_FALSE(leases.Release("a"));
  EXPECT_TRUE(leases.empty());
  EXPECT_TRUE(leases.Reserve("d", 4, 100, kLease + 1).ok());
  bm.CheckInvariants();
}

TEST(KvLeasesTest, QuarantineEndsAtItsBoundAndNotBefore) {
  BlockManager bm(2);
  KvLeases leases(&bm, kLease, kQuarantine);
  ASSERT_TRUE(leases.Reserve("a", 2, 100, 0).ok());
  EXPECT_EQ(leases.NextDeadline(), kLease);
  leases.Tick(kLease + 0.5);
  EXPECT_EQ(leases.NextDeadline(), kLease + 0.5 + kQuarantine);
  leases.Tick(kLease + 0.5 + kQuarantine - 0.01);
  EXPECT_EQ(bm.num_in_use(), 2);
  EXPECT_EQ(leases.Reserve("b", 1, 10, kLease + kQuarantine).status().code(), absl::StatusCode::kResourceExhausted);
  leases.Tick(kLease + 0.5 + kQuarantine);
  EXPECT_EQ(bm.num_in_use(), 0);
  EXPECT_EQ(leases.stats().quarantine_timeouts, 1);
  EXPECT_EQ(leases.stats().quarantine_released, 0);
  EXPECT_TRUE(leases.empty());
  EXPECT_EQ(leases.NextDeadline(), std::numeric_limits<double>::infinity());
  bm.CheckInvariants();
}

TEST(KvLeasesTest, TakenReservationsNeverExpire) {
  BlockManager bm(4);
  KvLeases leases(&bm, kLease, kQuarantine);
  ASSERT_TRUE(leases.Reserve("a", 2, 100, 0).ok());
  std::optional<KvLeases::Reservation> r = leases.Take("a");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->num_tokens, 100);
  leases.Tick(kLease * 10);
  EXPECT_EQ(leases.stats().expired, 0);
  EXPECT_EQ(bm.num_in_use(), 2);  // the sequence holds them now
  bm.Release(r->blocks);
  EXPECT_FALSE(leases.Release("a"));
  bm.CheckInvariants();
}

}  // namespace
}  // namespace tandem
