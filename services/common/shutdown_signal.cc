#include "services/common/shutdown_signal.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "kernels/common/check.h"

namespace tandem::service {
namespace {

struct ShutdownState {
  std::mutex mu;
  std::condition_variable cv;
  bool requested = false;
  int signal_number = 0;
  bool installed = false;
};

ShutdownState& State() {
  static ShutdownState* state = new ShutdownState();  // never destroyed: the watcher uses it
  return *state;
}

sigset_t ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

void WatchSignals() {
  const sigset_t set = ShutdownSignals();
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    ShutdownState& state = State();
    std::lock_guard<std::mutex> lock(state.mu);
    if (state.requested && state.signal_number != 0) {
      std::fprintf(stderr, "second signal %d during shutdown: exiting now\n", sig);
      std::fflush(stderr);
      std::_Exit(128 + sig);
    }
    state.requested = true;
    state.signal_number = sig;
    state.cv.notify_all();
  }
}

}  // namespace

void InstallShutdownSignalHandling() {
  ShutdownState& state = State();
  std::lock_guard<std::mutex> lock(state.mu);
  if (state.installed) return;
  const sigset_t set = ShutdownSignals();
  TANDEM_CHECK(pthread_sigmask(SIG_BLOCK, &set, nullptr) == 0);
  ::signal(SIGPIPE, SIG_IGN);
  // Lives as long as the process: sigwait() cannot be interrupted portably, and the
  // thread holds nothing that needs releasing.
  std::thread(WatchSignals).detach();
  state.installed = true;
}

int WaitForShutdownSignal() {
  ShutdownState& state = State();
  std::unique_lock<std::mutex> lock(state.mu);
  state.cv.wait(lock, [&] { return state.requested; });
  return state.signal_number;
}

std::optional<int> WaitForShutdownSignalFor(std::chrono::milliseconds timeout) {
  ShutdownState& state = State();
  std::unique_lock<std::mutex> lock(state.mu);
  if (!state.cv.wait_for(lock, timeout, [&] { return state.requested; })) return std::nullopt;
  return state.signal_number;
}

void RequestShutdown() {
  ShutdownState& state = State();
  std::lock_guard<std::mutex> lock(state.mu);
  state.requested = true;
  state.cv.notify_all();
}

bool ShutdownRequested() {
  ShutdownState& state = State();
  std::lock_guard<std::mutex> lock(state.mu);
  return state.requested;
}

void ResetShutdownForTesting() {
  ShutdownState& state = State();
  std::lock_guard<std::mutex> lock(state.mu);
  state.requested = false;
  state.signal_number = 0;
}

}  // namespace tandem::service
