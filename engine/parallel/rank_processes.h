// Starts the ranks of a group as processes forked from this one, and reaps them: what the
// collectives' tests use, and what the worker will (one process per GPU, forked before
// anything initializes CUDA: a forked child cannot use its parent's CUDA context).
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::parallel {

// How one rank's process ended.
struct RankExit {
  int rank = -1;
  pid_t pid = 0;
  int exit_code = -1;  // its exit status, or -1 when a signal ended it
  int signal = 0;      // the signal that ended it, or 0
  bool killed = false; // SIGKILLed by Wait at its deadline, or by the destructor

  bool ok() const { return exit_code == 0; }
  std::string ToString() const;
};

// The running ranks. The destructor SIGKILLs and reaps any still running, so that no
// rank outlives its owner; a rank also gets SIGKILL if the process that started it dies
// (PR_SET_PDEATHSIG).
class RankProcesses {
 public:
  // Forks `world` processes; process r runs body(r) and exits with its return value
  // through _exit (no atexit handlers or static destructors of the parent's state run in
  // the child). Call it from a single-threaded process (fork copies only the calling
  // thread). Errors: INVALID_ARGUMENT for world < 1, INTERNAL when fork fails (the ranks
  // already started are killed).
  static absl::StatusOr<std::unique_ptr<RankProcesses>> Start(int world,
                                                              const std::function<int(int rank)>& body);
  ~RankProcesses();
  RankProcesses(const RankProcesses&) = delete;
  RankProcesses& operator=(const RankProcesses&) = delete;

  const std::vector<pid_t>& pids() const { return pids_; }

  // Waits until every rank has exited, or until `timeout` has passed, when those still
  // running are SIGKILLed (killed = true). Returns one RankExit per rank, in rank order.
  // Call it once.
  std::vector<RankExit> Wait(absl::Duration timeout = absl::InfiniteDuration());

 private:
  RankProcesses() = default;
  std::vector<pid_t> pids_;
  std::vector<bool> reaped_;
};

// Watches ranks this process started (their pids, in rank order, `first_rank` the first's
// rank) on a thread of its own and calls `on_exit` once, from that thread, with a line
// naming the first one found to have ended (exit code or signal), without reaping it
// (RankProcesses::Wait still does). Polls every `period`; the destructor stops watching.
// For a server whose replica cannot run without every rank.
class RankWatch {
 public:
  RankWatch(std::vector<pid_t> pids, int first_rank, std::function<void(const std::string&)> on_exit,
            absl::Duration period = absl::Milliseconds(50));
  ~RankWatch();
  RankWatch(const RankWatch&) = delete;
  RankWatch& operator=(const RankWatch&) = delete;

 private:
  struct State;
  std::shared_ptr<State> state_;
  std::thread thread_;
};

// Start, then Wait: the ranks' exits in rank order.
absl::StatusOr<std::vector<RankExit>> RunRanks(int world, const std::function<int(int rank)>& body,
                                               absl::Duration timeout = absl::InfiniteDuration());

}  // namespace tandem::parallel
