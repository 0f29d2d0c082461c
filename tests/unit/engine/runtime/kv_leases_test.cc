// The decode side's leases, their writers and the quarantine (kv_leases.h), on a block
// manager with a hand-driven clock: the blocks of a lease a writer may still write into
// are never handed out again, however much time passes, until proof that the writer
// stopped; a lease no writer began on is freed at its expiry.
#include "engine/runtime/kv_leases.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <utility>

namespace tandem {
namespace {

constexpr double kLease = 5.0;
constexpr double kStuck = 20.0;
const KvWriter kWriterA{.address = "10.0.0.1:7001", .incarnation = 0xa1};
const KvWriter kWriterB{.address = "10.0.0.2:7001", .incarnation = 0xb2};

std::set<int32_t> AsSet(const std::vector<int32_t>& v) { return {v.begin(), v.end()}; }

// What the listener heard, in order.
class Heard : public KvQuarantineListener {
 public:
  void OnQuarantined(const std::string& id, uint64_t token, const std::vector<KvWriter>& open) override {
    std::string who;
    for (const KvWriter& w : open) who += " " + w.address;
    events.push_back("in " + id + who);
    tokens.push_back(token);
  }
  void OnQuarantineEnded(const std::string& id, uint64_t token) override {
    events.push_back("out " + id);
    tokens.push_back(token);
  }
  std::vector<std::string> events;
  std::vector<uint64_t> tokens;
};

TEST(KvLeasesTest, AnExpiredLeaseWithAnOpenWriterStaysQuarantinedHoweverLongTimePasses) {
  BlockManager bm(4);
  KvLeases leases(&bm, kLease, kStuck);
  Heard heard;
  leases.set_listener(&heard);
  absl::StatusOr<KvLeases::Reservation> a = leases.Reserve("a", 2, 100, /*now=*/0);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(leases.BeginWrites("a", a->token, kWriterA).ok());
  leases.Tick(kLease - 0.01);
  EXPECT_NE(leases.Find("a"), nullptr);
  leases.Tick(kLease);  // expired: the writer may still be putting into a's blocks
  EXPECT_EQ(leases.Find("a"), nullptr);
  EXPECT_TRUE(leases.Contains("a"));
  EXPECT_EQ(leases.stats().expired, 1);
  EXPECT_EQ(leases.stats().quarantined_blocks, 2);
  EXPECT_EQ(leases.stats().quarantined_leases, 1);
  EXPECT_EQ(heard.events, std::vector<std::string>{"in a 10.0.0.1:7001"});
  EXPECT_EQ(heard.tokens, std::vector<uint64_t>{a->token});
  // No bound frees it: a day, a year later the blocks are still out of use (the old code
  // freed them after --kv-quarantine-ms).
  for (double t : {kLease + kStuck - 0.01, kLease + kStuck, 86400.0, 3.2e7}) {
    leases.Tick(t);
    EXPECT_EQ(bm.num_in_use(), 2) << "at " << t;
    EXPECT_EQ(leases.stats().quarantined_leases, 1) << "at " << t;
    absl::StatusOr<KvLeases::Reservation> b = leases.Reserve("b" + std::to_string(t), 2, 100, t);
    ASSERT_TRUE(b.ok()) << b.status();
    for (int32_t x : b->blocks) EXPECT_FALSE(AsSet(a->blocks).contains(x)) << "block " << x << " reused at " << t;
    EXPECT_EQ(leases.Reserve("c", 1, 10, t).status().code(), absl::StatusCode::kResourceExhausted);
    ASSERT_TRUE(leases.Release("b" + std::to_string(t), t));  // no writer: freed at once
  }
  // Past the warning threshold it counts as stuck, and only that.
  EXPECT_EQ(leases.stats().quarantine_stuck, 1);
  // The expired lease cannot be decoded from, written into again, nor its id reserved.
  EXPECT_EQ(leases.Take("a", 0, 3.2e7).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(leases.BeginWrites("a", a->token, kWriterB).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(leases.Reserve("a", 1, 10, 3.2e7).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(leases.stats().ends_writer_ended + leases.stats().ends_writer_gone + leases.stats().ends_decoded, 0);
  bm.CheckInvariants();
}

TEST(KvLeasesTest, TheWritersEndWritesFreesTheQuarantine) {
  BlockManager bm(4);
  KvLeases leases(&bm, kLease, kStuck);
  Heard heard;
  leases.set_listener(&heard);
  absl::StatusOr<KvLeases::Reservation> a = leases.Reserve("a", 3, 100, 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(leases.BeginWrites("a", a->token, kWriterA).ok());
  leases.Tick(kLease + 1);
  ASSERT_EQ(leases.stats().quarantined_blocks, 3);
  // Another reservation's token, or another writer's end, proves nothing about this one.
  leases.EndWrites("a", a->token + 1, kWriterA.incarnation, KvWriterProof::kEnded);
  leases.EndWrites("a", a->token, kWriterB.incarnation, KvWriterProof::kEnded);
  EXPECT_EQ(bm.num_in_use(), 3);
  leases.EndWrites("a", a->token, kWriterA.incarnation, KvWriterProof::kEnded);
  EXPECT_EQ(bm.num_in_use(), 0);
  EXPECT_EQ(leases.stats().quarantined_blocks, 0);
  EXPECT_EQ(leases.stats().ends_writer_ended, 1);
  EXPECT_EQ(heard.events, (std::vector<std::string>{"in a 10.0.0.1:7001", "out a"}));
  EXPECT_TRUE(leases.empty());
  // A late duplicate is ignored.
  leases.EndWrites("a", a->token, kWriterA.incarnation, KvWriterProof::kEnded);
  EXPECT_EQ(leases.stats().ends_writer_ended, 1);
  EXPECT_TRUE(leases.Reserve("d", 4, 100, kLease + 1).ok());
  bm.CheckInvariants();
}

TEST(KvLeasesTest, AWriterProvablyGoneFreesTheQuarantine) {
  BlockManager bm(4);
  KvLeases leases(&bm, kLease, kStuck);
  absl::StatusOr<KvLeases::Reservation> a = leases.Reserve("a", 2, 100, 0);
  ASSERT_TRUE(a.ok());
  // Two sessions of one process (two Prefill calls of it on the lease): "gone" ends both.
  ASSERT_TRUE(leases.BeginWrites("a", a->token, kWriterA).ok());
  ASSERT_TRUE(leases.BeginWrites("a", a->token, kWriterA).ok());
  leases.Tick(kLease);
  leases.EndWrites("a", a->token, kWriterA.incarnation, KvWriterProof::kEnded);
  EXPECT_EQ(bm.num_in_use(), 2) << "one of the process's two sessions is still open";
  leases.WriterStopped("a", a->token, kWriterA.incarnation, KvWriterProof::kGone);
  EXPECT_EQ(bm.num_in_use(), 0);
  EXPECT_EQ(leases.stats().ends_writer_gone, 1);
  EXPECT_EQ(leases.stats().ends_writer_ended, 0);
  bm.CheckInvariants();
}

TEST(KvLeasesTest, ALeaseNoWriterBeganOnIsFreedAtItsExpiry) {
  BlockManager bm(2);
  KvLeases leases(&bm, kLease, kStuck);
  Heard heard;
  leases.set_listener(&heard);
  absl::StatusOr<KvLeases::Reservation> a = leases.Reserve("a", 2, 100, 0);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(leases.NextDeadline(), kLease);
  leases.Tick(kLease - 0.01);
  EXPECT_EQ(bm.num_in_use(), 2);
  leases.Tick(kLease);
  EXPECT_EQ(bm.num_in_use(), 0);
  EXPECT_EQ(leases.stats().expired, 1);
  EXPECT_EQ(leases.stats().ends_no_writer, 1);
  EXPECT_EQ(leases.stats().quarantined_leases, 0);
  EXPECT_TRUE(heard.events.empty());
  EXPECT_TRUE(leases.empty());
  EXPECT_EQ(leases.NextDeadline(), std::numeric_limits<double>::infinity());
  // A writer whose BeginWrites arrives now is refused: it never writes into these blocks.
  EXPECT_EQ(leases.BeginWrites("a", a->token, kWriterA).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(leases.stats().writers_refused, 1);
  bm.CheckInvariants();
}

TEST(KvLeasesTest, ALeaseWhoseWritersAllEndedIsFreedAtItsExpiry) {
  BlockManager bm(2);
  KvLeases leases(&bm, kLease, kStuck);
  absl::StatusOr<KvLeases::Reservation> a = leases.Reserve("a", 2, 100, 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(leases.BeginWrites("a", a->token, kWriterA).ok());
  leases.EndWrites("a", a->token, kWriterA.incarnation, KvWriterProof::kEnded);
  leases.Tick(kLease);
  EXPECT_EQ(bm.num_in_use(), 0);
  EXPECT_EQ(leases.stats().ends_no_writer, 1);
}

TEST(KvLeasesTest, BeginWritesNeedsTheLiveLeaseOfItsToken) {
  BlockManager bm(4);
  KvLeases leases(&bm, kLease, kStuck);
  absl::StatusOr<KvLeases::Reservation> a = leases.Reserve("a", 2, 100, 0);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(leases.BeginWrites("a", a->token + 1, kWriterA).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(leases.BeginWrites("nope", a->token, kWriterA).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(leases.BeginWrites("a", a->token, {.address = "", .incarnation = 7}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(leases.BeginWrites("a", a->token, {.address = "x:1", .incarnation = 0}).code(),
            absl::StatusCode::kInvalidArgument);
  // A released lease, and one whose id was reserved again, refuse the old token.
  ASSERT_TRUE(leases.Release("a", 1));
  absl::StatusOr<KvLeases::Reservation> again = leases.Reserve("a", 2, 100, 1);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->token, a->token);
  EXPECT_EQ(leases.BeginWrites("a", a->token, kWriterA).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(leases.BeginWrites("a", again->token, kWriterA).ok());
}

TEST(KvLeasesTest, TwoWritersOnOneLeaseNeedBothEnds) {
  // A prefill retried on the same lease: the first writer (cut off) and the second.
  BlockManager bm(4);
  KvLeases leases(&bm, kLease, kStuck);
  absl::StatusOr<KvLeases::Reservation> a = leases.Reserve("a", 2, 100, 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(leases.BeginWrites("a", a->token, kWriterA).ok());
  ASSERT_TRUE(leases.BeginWrites("a", a->token, kWriterB).ok());
  leases.Tick(kLease);
  leases.EndWrites("a", a->token, kWriterB.incarnation, KvWriterProof::kEnded);
  EXPECT_EQ(bm.num_in_use(), 2) << "writer A may still be writing";
  leases.WriterStopped("a", a->token, kWriterA.incarnation, KvWriterProof::kGone);
  EXPECT_EQ(bm.num_in_use(), 0);
  EXPECT_EQ(leases.stats().ends_writer_gone, 1);
  bm.CheckInvariants();
}

TEST(KvLeasesTest, ADecodeAfterOneWritersAnswerCannotTakeALeaseAnotherWriterHolds) {
  BlockManager bm(4);
  KvLeases leases(&bm, kLease, kStuck);
  Heard heard;
  leases.set_listener(&heard);
  absl::StatusOr<KvLeases::Reservation> a = leases.Reserve("a", 2, 100, 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(leases.BeginWrites("a", a->token, kWriterA).ok());
  ASSERT_TRUE(leases.BeginWrites("a", a->token, kWriterB).ok());
  // B answered its Prefill call (its writes completed); A was cut off and may write on.
  absl::StatusOr<KvLeases::Reservation> took = leases.Take("a", kWriterB.incarnation, 1);
  EXPECT_EQ(took.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(heard.events, std::vector<std::string>{"in a 10.0.0.1:7001"});  // only A is open
  EXPECT_EQ(bm.num_in_use(), 2);
  leases.EndWrites("a", 0, kWriterA.incarnation, KvWriterProof::kEnded);
  EXPECT_EQ(bm.num_in_use(), 0);
}

TEST(KvLeasesTest, TheDecodeAfterTheWritersAnswerTakesTheLease) {
  BlockManager bm(4);
  KvLeases leases(&bm, kLease, kStuck);
  absl::StatusOr<KvLeases::Reservation> a = leases.Reserve("a", 2, 100, 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(leases.BeginWrites("a", a->token, kWriterA).ok());
  absl::StatusOr<KvLeases::Reservation> r = leases.Take("a", kWriterA.incarnation, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->num_tokens, 100);
  EXPECT_EQ(r->blocks, a->blocks);
  leases.Tick(kLease * 10);  // taken reservations never expire
  EXPECT_EQ(leases.stats().expired, 0);
  EXPECT_EQ(bm.num_in_use(), 2);  // the sequence holds them now
  // Its EndWrites arriving after the Decode is ignored.
  leases.EndWrites("a", a->token, kWriterA.incarnation, KvWriterProof::kEnded);
  EXPECT_TRUE(leases.empty());
  bm.Release(r->blocks);
  EXPECT_FALSE(leases.Release("a", 2));
  bm.CheckInvariants();
}

TEST(KvLeasesTest, ReleaseFreesOnlyWhatNoWriterMayTouch) {
  BlockManager bm(6);
  KvLeases leases(&bm, kLease, kStuck);
  Heard heard;
  leases.set_listener(&heard);
  absl::StatusOr<KvLeases::Reservation> idle = leases.Reserve("idle", 2, 100, 0);
  absl::StatusOr<KvLeases::Reservation> busy = leases.Reserve("busy", 2, 100, 0);
  ASSERT_TRUE(idle.ok() && busy.ok());
  ASSERT_TRUE(leases.BeginWrites("busy", busy->token, kWriterA).ok());
  // The router's Release after a cancelled Prefill call: the call ended for the router,
  // the writer may still be copying.
  EXPECT_TRUE(leases.Release("idle", 1));
  EXPECT_TRUE(leases.Release("busy", 1));
  EXPECT_EQ(bm.num_in_use(), 2);
  EXPECT_EQ(leases.stats().quarantined_leases, 1);
  EXPECT_EQ(heard.events, std::vector<std::string>{"in busy 10.0.0.1:7001"});
  EXPECT_TRUE(leases.Release("busy", 2));  // still quarantined
  EXPECT_EQ(bm.num_in_use(), 2);
  // The Decode (or Release) that follows the writer's answered Prefill call proves it.
  leases.EndWrites("busy", 0, kWriterA.incarnation, KvWriterProof::kDecoded);
  EXPECT_EQ(bm.num_in_use(), 0);
  EXPECT_EQ(leases.stats().ends_decoded, 1);
  EXPECT_FALSE(leases.Release("busy", 3));
  bm.CheckInvariants();
}

TEST(KvLeasesTest, AStuckQuarantineIsCountedOnceItsAgePassesTheThreshold) {
  BlockManager bm(2);
  KvLeases leases(&bm, kLease, kStuck);
  absl::StatusOr<KvLeases::Reservation> a = leases.Reserve("a", 2, 100, 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(leases.BeginWrites("a", a->token, kWriterA).ok());
  leases.Tick(kLease);
  EXPECT_EQ(leases.NextDeadline(), kLease + kStuck);
  leases.Tick(kLease + kStuck - 0.01);
  EXPECT_EQ(leases.stats().quarantine_stuck, 0);
  leases.Tick(kLease + kStuck);
  EXPECT_EQ(leases.stats().quarantine_stuck, 1);
  EXPECT_EQ(leases.NextDeadline(), std::numeric_limits<double>::infinity());
  EXPECT_EQ(bm.num_in_use(), 2);
  leases.WriterStopped("a", a->token, kWriterA.incarnation, KvWriterProof::kEnded);
  EXPECT_EQ(leases.stats().quarantine_stuck, 0);
  EXPECT_EQ(bm.num_in_use(), 0);
}

}  // namespace
}  // namespace tandem
