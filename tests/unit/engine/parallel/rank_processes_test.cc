// The launcher of rank processes: exit codes and signals in rank order, the deadline, and
// no process outliving its owner.
#include "engine/parallel/rank_processes.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace tandem::parallel {
namespace {

bool Exists(pid_t pid) { return ::kill(pid, 0) == 0; }

TEST(RankProcessesTest, ReturnsEveryRanksExitInRankOrder) {
  absl::StatusOr<std::vector<RankExit>> exits = RunRanks(4, [](int rank) {
    if (rank == 2) ::raise(SIGKILL);
    return rank * 10;
  });
  ASSERT_TRUE(exits.ok()) << exits.status();
  ASSERT_EQ(exits->size(), 4u);
  for (int r = 0; r < 4; ++r) {
    const RankExit& e = (*exits)[r];
    EXPECT_EQ(e.rank, r);
    EXPECT_GT(e.pid, 0);
    EXPECT_FALSE(e.killed);
    if (r == 2) {
      EXPECT_EQ(e.signal, SIGKILL);
      EXPECT_EQ(e.exit_code, -1);
      EXPECT_FALSE(e.ok());
    } else {
      EXPECT_EQ(e.exit_code, r * 10);
      EXPECT_EQ(e.ok(), r == 0);
    }
  }
}

TEST(RankProcessesTest, KillsRanksStillRunningAtTheDeadline) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<RankExit>> exits = RunRanks(
      2,
      [](int rank) {
        if (rank == 1) std::this_thread::sleep_for(std::chrono::seconds(30));
        return 0;
      },
      absl::Milliseconds(200));
  ASSERT_TRUE(exits.ok()) << exits.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE((*exits)[0].ok());
  EXPECT_TRUE((*exits)[1].killed);
  EXPECT_EQ((*exits)[1].signal, SIGKILL);
}

TEST(RankProcessesTest, DestructorLeavesNoProcessBehind) {
  std::vector<pid_t> pids;
  {
    absl::StatusOr<std::unique_ptr<RankProcesses>> ranks = RankProcesses::Start(3, [](int) {
      std::this_thread::sleep_for(std::chrono::seconds(30));
      return 0;
    });
    ASSERT_TRUE(ranks.ok()) << ranks.status();
    pids = (*ranks)->pids();
    for (pid_t pid : pids) EXPECT_TRUE(Exists(pid));
  }
  // Reaped, not only killed: kill(pid, 0) fails for a pid with no process, zombie or not.
  for (pid_t pid : pids) EXPECT_FALSE(Exists(pid)) << pid;
}

TEST(RankProcessesTest, RefusesAnEmptyWorld) {
  EXPECT_TRUE(absl::IsInvalidArgument(RunRanks(0, [](int) { return 0; }).status()));
}

}  // namespace
}  // namespace tandem::parallel
