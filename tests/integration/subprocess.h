// Runs a binary to completion with extra environment variables, capturing its exit
// code, stdout and stderr. For integration tests of the real executables.
#pragma once

#include <string>
#include <vector>

namespace tandem::testing {

struct ProcessResult {
  int exit_code = -1;  // -signal if killed by a signal
  std::string out;
  std::string err;
};

ProcessResult RunProcess(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env = {},
                         int timeout_seconds = 120);

// A process left running while the test talks to it (e.g. `tandem serve-local`), its
// stdout and stderr going to `log_file`. The destructor sends SIGTERM and waits up to
// 30 s, then SIGKILL.
class BackgroundProcess {
 public:
  BackgroundProcess(const std::vector<std::string>& argv, const std::string& log_file);
  ~BackgroundProcess();
  BackgroundProcess(const BackgroundProcess&) = delete;
  BackgroundProcess& operator=(const BackgroundProcess&) = delete;

  int pid() const { return pid_; }
  // SIGTERM, then the exit code as RunProcess reports it (SIGKILL after `grace_seconds`).
  int Stop(int grace_seconds = 30);

 private:
  int pid_ = -1;
};

// Path of a built binary: $TANDEM_BINARY_DIR/bin/<name>.
std::string BinaryPath(const std::string& name);

}  // namespace tandem::testing
