// How a group of the shared-memory collectives fails: a peer that dies ends the others'
// calls with UNAVAILABLE promptly, one that does not arrive with DEADLINE_EXCEEDED at the
// timeout, disagreeing calls with INVALID_ARGUMENT; later calls are FAILED_PRECONDITION;
// a stale segment of a killed group does not disturb a new one of the same name; nothing
// is left in /dev/shm.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "engine/parallel/rank_processes.h"
#include "engine/parallel/shm_collectives.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/parallel/group_test_util.h"

namespace tandem::parallel {
namespace {

using testing::ExpectAllOk;
using testing::Input;
using testing::LeftoverSegments;
using testing::RankOrderSum;
using testing::RunGroup;
using testing::SecondsSince;
using testing::TestOptions;
using testing::UniqueName;
using Clock = std::chrono::steady_clock;

class ShmFailureTest : public ::testing::TestWithParam<int> {
 protected:
  int world() const { return GetParam(); }
  void TearDown() override { EXPECT_TRUE(LeftoverSegments().empty()); }
};

// The peers of a rank that SIGKILLs itself (or simply exits) between two operations: the
// next call ends with UNAVAILABLE well before the 30 s timeout, the one after it with
// FAILED_PRECONDITION.
void ExpectPeersSeeDeath(int world, int dying, bool kill) {
  const std::vector<RankExit> exits = RunGroup(
      world, UniqueName("death"),
      [dying, kill](ShmCollectives& g) {
        for (int i = 0; i < 2; ++i) {
          absl::Status s = g.Barrier();
          RANK_EXPECT(g.rank(), s.ok(), s.ToString());
        }
        if (g.rank() == dying) {
          if (kill) ::raise(SIGKILL);
          ::_exit(0);  // without closing the group
        }
        std::vector<float> data(1000, 1.0f);
        const Clock::time_point start = Clock::now();
        absl::Status s = g.AllReduceSum(data);
        const double took = SecondsSince(start);
        RANK_EXPECT(g.rank(), absl::IsUnavailable(s), s.ToString());
        RANK_EXPECT(g.rank(), took < 3.0, "took ", took, " s");
        s = g.Barrier();
        RANK_EXPECT(g.rank(), absl::IsFailedPrecondition(s), s.ToString());
        return 0;
      },
      [](ShmGroupOptions& o) { o.timeout = absl::Seconds(30); });
  ASSERT_EQ(exits.size(), static_cast<size_t>(world));
  for (const RankExit& e : exits) {
    if (e.rank == dying) {
      EXPECT_EQ(e.signal, kill ? SIGKILL : 0) << e.ToString();
    } else {
      EXPECT_TRUE(e.ok()) << e.ToString();
    }
  }
}

TEST_P(ShmFailureTest, APeerThatDiesEndsTheOthersCallsWithUnavailable) {
  ExpectPeersSeeDeath(world(), world() - 1, /*kill=*/true);
}

TEST_P(ShmFailureTest, RankZeroExitingEndsTheOthersCallsWithUnavailable) {
  ExpectPeersSeeDeath(world(), 0, /*kill=*/false);
}

TEST_P(ShmFailureTest, APeerThatDoesNotArriveGivesDeadlineExceededAtTheTimeout) {
  const int late = world() - 1;
  ExpectAllOk(RunGroup(
      world(), UniqueName("late"),
      [late](ShmCollectives& g) {
        if (g.rank() == late) {
          std::this_thread::sleep_for(std::chrono::milliseconds(900));
          return 0;  // alive all along, and closes the group only after the others gave up
        }
        const Clock::time_point start = Clock::now();
        absl::Status s = g.Barrier();
        const double took = SecondsSince(start);
        RANK_EXPECT(g.rank(), absl::IsDeadlineExceeded(s), s.ToString());
        // Each rank waited the timeout (300 ms), or heard of a peer's a little sooner.
        RANK_EXPECT(g.rank(), took > 0.2 && took < 0.85, "took ", took, " s");
        s = g.Barrier();
        RANK_EXPECT(g.rank(), absl::IsFailedPrecondition(s), s.ToString());
        return 0;
      },
      [](ShmGroupOptions& o) { o.timeout = absl::Milliseconds(300); }));
}

TEST_P(ShmFailureTest, ARankThatNeverJoinsGivesDeadlineExceededFromOpen) {
  const std::string name = UniqueName("nojoin");
  const int w = world();
  absl::StatusOr<std::vector<RankExit>> exits = RunRanks(w, [&](int rank) {
    if (rank == w - 1) return 0;
    ShmGroupOptions o = TestOptions(name, w, rank);
    o.timeout = absl::Milliseconds(300);
    const Clock::time_point start = Clock::now();
    absl::StatusOr<std::unique_ptr<ShmCollectives>> g = ShmCollectives::Open(o);
    const double took = SecondsSince(start);
    RANK_EXPECT(rank, absl::IsDeadlineExceeded(g.status()), g.status().ToString());
    RANK_EXPECT(rank, took > 0.2 && took < 1.5, "took ", took, " s");
    return 0;
  });
  ASSERT_TRUE(exits.ok()) << exits.status();
  ExpectAllOk(*exits);
}

TEST_P(ShmFailureTest, DisagreeingOperationsAreInvalidArgumentOnEveryRank) {
  ExpectAllOk(RunGroup(world(), UniqueName("disagree"), [](ShmCollectives& g) {
    std::vector<std::byte> data(16);
    absl::Status s = g.rank() == 1 ? g.Broadcast(data, 0) : g.Barrier();
    RANK_EXPECT(g.rank(), absl::IsInvalidArgument(s), s.ToString());
    s = g.Barrier();
    RANK_EXPECT(g.rank(), absl::IsFailedPrecondition(s), s.ToString());
    return 0;
  }));
}

TEST_P(ShmFailureTest, OneRanksBadArgumentsEndTheOthersCallsPromptly) {
  ExpectAllOk(RunGroup(
      world(), UniqueName("badarg"),
      [](ShmCollectives& g) {
        std::vector<std::byte> send(8);
        // Rank 1's receive buffer is one block short.
        std::vector<std::byte> recv(8 * (g.world_size() - (g.rank() == 1 ? 1 : 0)));
        const Clock::time_point start = Clock::now();
        absl::Status s = g.AllGather(send, recv);
        RANK_EXPECT(g.rank(), absl::IsInvalidArgument(s), s.ToString());
        RANK_EXPECT(g.rank(), SecondsSince(start) < 3.0);
        return 0;
      },
      [](ShmGroupOptions& o) { o.timeout = absl::Seconds(30); }));
}

TEST_P(ShmFailureTest, AStaleSegmentOfAKilledGroupDoesNotDisturbANewOne) {
  const std::string name = UniqueName("stale");
  const std::string path = SegmentPath({name, ""});
  // A group whose rank 0 is killed while it waits for rank 1 to join: its segment stays,
  // marked ready, with a dead rank 0.
  {
    absl::StatusOr<std::unique_ptr<RankProcesses>> stale = RankProcesses::Start(1, [&](int) {
      absl::StatusOr<std::unique_ptr<ShmCollectives>> g = ShmCollectives::Open(TestOptions(name, 2, 0));
      return 3;  // not reached: killed while Open waits
    });
    ASSERT_TRUE(stale.ok()) << stale.status();
    struct stat st;
    const Clock::time_point start = Clock::now();
    while ((::stat(path.c_str(), &st) != 0 || st.st_size == 0) && SecondsSince(start) < 10) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_EQ(::kill((*stale)->pids()[0], SIGKILL), 0);
    const std::vector<RankExit> exits = (*stale)->Wait();
    ASSERT_EQ(exits[0].signal, SIGKILL);
  }
  ASSERT_EQ(::access(path.c_str(), F_OK), 0) << "the killed group left no segment to test with";
  // The new group's joiners start first and meet the stale segment; its rank 0 comes
  // 100 ms later and replaces it.
  ExpectAllOk(RunRanks(world(), [&](int rank) {
    if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    absl::StatusOr<std::unique_ptr<ShmCollectives>> g =
        ShmCollectives::Open(TestOptions(name, world(), rank));
    RANK_EXPECT(rank, g.ok(), g.status().ToString());
    std::vector<float> data(3001);
    for (size_t i = 0; i < data.size(); ++i) data[i] = Input(rank, i);
    absl::Status s = (*g)->AllReduceSum(data);
    RANK_EXPECT(rank, s.ok(), s.ToString());
    const std::vector<float> want = RankOrderSum(world(), data.size());
    RANK_EXPECT(rank, std::memcmp(data.data(), want.data(), data.size() * 4) == 0);
    return 0;
  }).value());
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
}

TEST_P(ShmFailureTest, OptionsThatDifferFromRankZerosAreRefused) {
  const std::string name = UniqueName("options");
  const int w = world();
  ExpectAllOk(RunRanks(w, [&](int rank) {
    ShmGroupOptions o = TestOptions(name, w, rank);
    o.timeout = absl::Milliseconds(300);
    if (rank == w - 1) o.slot_bytes = 8192;
    absl::StatusOr<std::unique_ptr<ShmCollectives>> g = ShmCollectives::Open(o);
    if (rank == w - 1) {
      RANK_EXPECT(rank, absl::IsInvalidArgument(g.status()), g.status().ToString());
    } else {
      RANK_EXPECT(rank, absl::IsDeadlineExceeded(g.status()), g.status().ToString());
    }
    return 0;
  }).value());
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShmFailureTest, ::testing::Values(2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "ranks");
                         });

// A second process for a rank already held, during the join: ALREADY_EXISTS for it, and
// the group it tried to enter goes on unharmed.
TEST(ShmJoinTest, ASecondProcessForAHeldRankIsRefusedAndTheGroupGoesOn) {
  const std::string name = UniqueName("dup");
  ExpectAllOk(RunRanks(4, [&](int process) {
    // Processes 0, 1, 2 are ranks 0, 1, 2; process 3 claims rank 1 again while rank 2
    // has not joined yet.
    const int rank = process == 3 ? 1 : process;
    if (process == 3) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (process == 2) std::this_thread::sleep_for(std::chrono::milliseconds(400));
    absl::StatusOr<std::unique_ptr<ShmCollectives>> g = ShmCollectives::Open(TestOptions(name, 3, rank));
    if (process == 3) {
      RANK_EXPECT(process, absl::IsAlreadyExists(g.status()), g.status().ToString());
      return 0;
    }
    RANK_EXPECT(process, g.ok(), g.status().ToString());
    std::vector<float> data(100);
    for (size_t i = 0; i < data.size(); ++i) data[i] = Input(rank, i);
    absl::Status s = (*g)->AllReduceSum(data);
    RANK_EXPECT(process, s.ok(), s.ToString());
    const std::vector<float> want = RankOrderSum(3, data.size());
    RANK_EXPECT(process, std::memcmp(data.data(), want.data(), data.size() * 4) == 0);
    return 0;
  }).value());
}

TEST(ShmOptionsTest, BadOptionsAreInvalidArgument) {
  const auto open = [](auto adjust) {
    ShmGroupOptions o = TestOptions(UniqueName("bad"), 2, 0);
    adjust(o);
    return ShmCollectives::Open(o).status();
  };
  EXPECT_TRUE(absl::IsInvalidArgument(open([](ShmGroupOptions& o) { o.world_size = 0; })));
  EXPECT_TRUE(absl::IsInvalidArgument(open([](ShmGroupOptions& o) { o.world_size = kShmMaxWorld + 1; })));
  EXPECT_TRUE(absl::IsInvalidArgument(open([](ShmGroupOptions& o) { o.rank = 2; })));
  EXPECT_TRUE(absl::IsInvalidArgument(open([](ShmGroupOptions& o) { o.slot_bytes = 1000; })));
  EXPECT_TRUE(absl::IsInvalidArgument(open([](ShmGroupOptions& o) { o.slot_bytes = 4100; })));
  EXPECT_TRUE(absl::IsInvalidArgument(open([](ShmGroupOptions& o) { o.name = "a/b"; })));
  EXPECT_TRUE(absl::IsInvalidArgument(open([](ShmGroupOptions& o) { o.name = ""; })));
  EXPECT_TRUE(absl::IsInvalidArgument(open([](ShmGroupOptions& o) { o.timeout = absl::ZeroDuration(); })));
  EXPECT_TRUE(LeftoverSegments().empty());
}

TEST(ShmOptionsTest, OneRankIsAGroupToo) {
  absl::StatusOr<std::unique_ptr<ShmCollectives>> g = ShmCollectives::Open(TestOptions(UniqueName("one"), 1, 0));
  ASSERT_TRUE(g.ok()) << g.status();
  std::vector<float> data = {1.5f, -0.0f};
  EXPECT_TRUE((*g)->AllReduceSum(data).ok());
  EXPECT_EQ(data[0], 1.5f);
  EXPECT_TRUE(std::signbit(data[1]));
  EXPECT_TRUE((*g)->Barrier().ok());
  g->reset();
  EXPECT_TRUE(LeftoverSegments().empty());
}

}  // namespace
}  // namespace tandem::parallel
