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

// Path of a built binary: $TANDEM_BINARY_DIR/bin/<name>.
std::string BinaryPath(const std::string& name);

}  // namespace tandem::testing
