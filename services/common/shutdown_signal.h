// Orderly shutdown on SIGINT / SIGTERM. A service's main() calls
// InstallShutdownSignalHandling() first (before starting any thread), starts its
// servers, then blocks in WaitForShutdownSignal() and stops them:
//
//   tandem::service::InstallShutdownSignalHandling();
//   ... start servers ...
//   int sig = tandem::service::WaitForShutdownSignal();
//   spdlog::info("shutting down ({})", sig == 0 ? "requested" : strsignal(sig));
//
// SIGINT and SIGTERM are blocked in the calling thread, so every thread it creates
// afterwards inherits the mask and none is interrupted; one dedicated watcher thread
// receives them with sigwait(). A second signal after the first one exits the process
// at once (status 128 + signal) so that a stuck shutdown can still be interrupted.
// SIGPIPE is ignored (a peer closing a socket must not kill a server).
#pragma once

#include <chrono>
#include <optional>

namespace tandem::service {

// Blocks SIGINT/SIGTERM in the calling thread, ignores SIGPIPE and starts the watcher
// thread. Idempotent. Threads created before this call keep their old mask: call it
// at the top of main().
void InstallShutdownSignalHandling();

// Blocks until a shutdown is requested: returns the signal number (SIGINT, SIGTERM), or
// 0 when RequestShutdown() asked. Returns at once once a shutdown has been requested.
int WaitForShutdownSignal();

// The same with a limit: std::nullopt when `timeout` passes without a request.
std::optional<int> WaitForShutdownSignalFor(std::chrono::milliseconds timeout);

// Requests a shutdown programmatically (tests, an admin endpoint, a fatal error in a
// component); wakes every waiter. Thread-safe, async-signal-unsafe.
void RequestShutdown();

// Whether a shutdown has been requested (by a signal or RequestShutdown()).
bool ShutdownRequested();

// Clears a previous request so that a test can wait again. Tests only.
void ResetShutdownForTesting();

}  // namespace tandem::service
