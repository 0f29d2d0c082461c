#include "engine/parallel/rank_processes.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"

namespace tandem::parallel {
namespace {

void Fill(RankExit* exit, int status) {
  if (WIFEXITED(status)) {
    exit->exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    exit->signal = WTERMSIG(status);
  }
}

}  // namespace

std::string RankExit::ToString() const {
  if (signal != 0) {
    return absl::StrCat("rank ", rank, " (pid ", pid, ") ended by signal ", signal,
                        killed ? " (killed at its deadline)" : "");
  }
  return absl::StrCat("rank ", rank, " (pid ", pid, ") exited with ", exit_code);
}

absl::StatusOr<std::unique_ptr<RankProcesses>> RankProcesses::Start(
    int world, const std::function<int(int rank)>& body) {
  if (world < 1) return absl::InvalidArgumentError(absl::StrCat("world size ", world));
  std::unique_ptr<RankProcesses> ranks(new RankProcesses());
  const pid_t parent = ::getpid();
  // Buffered output would otherwise be written once by each child too.
  std::fflush(nullptr);
  for (int r = 0; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));  // ~ kills
    }
    if (pid == 0) {
      // Die with the parent; if it died before the call, exit now.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(125);
      const int code = body(r);
      std::fflush(nullptr);
      ::_exit(code & 0xff);
    }
    ranks->pids_.push_back(pid);
    ranks->reaped_.push_back(false);
  }
  return ranks;
}

std::vector<RankExit> RankProcesses::Wait(absl::Duration timeout) {
  const bool forever = timeout == absl::InfiniteDuration();
  const auto deadline = std::chrono::steady_clock::now() +
                        (forever ? std::chrono::nanoseconds(0) : absl::ToChronoNanoseconds(timeout));
  std::vector<RankExit> exits(pids_.size());
  size_t left = 0;
  for (size_t r = 0; r < pids_.size(); ++r) {
    exits[r].rank = static_cast<int>(r);
    exits[r].pid = pids_[r];
    if (!reaped_[r]) ++left;
  }
  bool killing = false;
  while (left > 0) {
    for (size_t r = 0; r < pids_.size(); ++r) {
      if (reaped_[r]) continue;
      int status = 0;
      const pid_t got = ::waitpid(pids_[r], &status, killing ? 0 : WNOHANG);
      if (got == pids_[r] || (got < 0 && errno == ECHILD)) {
        if (got == pids_[r]) Fill(&exits[r], status);
        exits[r].killed = killing;
        reaped_[r] = true;
        --left;
      }
    }
    if (left == 0 || killing) continue;
    if (!forever && std::chrono::steady_clock::now() >= deadline) {
      for (size_t r = 0; r < pids_.size(); ++r) {
        if (!reaped_[r]) ::kill(pids_[r], SIGKILL);
      }
      killing = true;
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return exits;
}

RankProcesses::~RankProcesses() {
  for (size_t r = 0; r < pids_.size(); ++r) {
    if (reaped_[r]) continue;
    ::kill(pids_[r], SIGKILL);
    int status = 0;
    while (::waitpid(pids_[r], &status, 0) < 0 && errno == EINTR) {
    }
  }
}

absl::StatusOr<std::vector<RankExit>> RunRanks(int world, const std::function<int(int rank)>& body,
                                               absl::Duration timeout) {
  absl::StatusOr<std::unique_ptr<RankProcesses>> ranks = RankProcesses::Start(world, body);
  if (!ranks.ok()) return ranks.status();
  return (*ranks)->Wait(timeout);
}

struct RankWatch::State {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
};

RankWatch::RankWatch(std::vector<pid_t> pids, int first_rank, std::function<void(const std::string&)> on_exit,
                     absl::Duration period)
    : state_(std::make_shared<State>()) {
  thread_ = std::thread([state = state_, pids = std::move(pids), first_rank, on_exit = std::move(on_exit),
                         wait = absl::ToChronoMilliseconds(period)] {
    std::unique_lock<std::mutex> lock(state->mu);
    while (!state->cv.wait_for(lock, wait, [&] { return state->stop; })) {
      for (size_t i = 0; i < pids.size(); ++i) {
        // WNOWAIT: the owner's Wait reaps it.
        siginfo_t info{};
        if (::waitid(P_PID, static_cast<id_t>(pids[i]), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
            info.si_pid == 0) {
          continue;
        }
        RankExit e{.rank = first_rank + static_cast<int>(i), .pid = pids[i]};
        if (info.si_code == CLD_EXITED) {
          e.exit_code = info.si_status;
        } else {
          e.signal = info.si_status;
        }
        lock.unlock();
        on_exit(e.ToString());
        return;
      }
    }
  });
}

RankWatch::~RankWatch() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  thread_.join();
}

}  // namespace tandem::parallel
