// Starts transfer_test_peer as a child process and talks to it over pipes (tests only).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/common/transfer/remote_memory_descriptor.h"
#include "tests/unit/services/transfer/transfer_test_pattern.h"

namespace tandem::transfer::testing {

class PeerProcess {
 public:
  // Spawns the peer with a buffer of `bytes` (from AllocateMemory, or a registered heap
  // buffer) and waits for its descriptor. The binary is $TANDEM_TRANSFER_TEST_PEER, else
  // transfer_test_peer next to this test binary.
  static absl::StatusOr<std::unique_ptr<PeerProcess>> Spawn(size_t bytes,
                                                            bool register_memory = false);
  // Asks the peer to quit; kills it if it does not within a few seconds.
  ~PeerProcess();

  const RemoteMemoryDescriptor& descriptor() const { return descriptor_; }
  pid_t pid() const { return pid_; }

  // "" when the peer's buffer holds the pattern inside `ranges` and zeros elsewhere.
  absl::StatusOr<std::string> Verify(uint64_t seed, const std::vector<Range>& ranges);
  absl::Status Clear();
  // Sends a signal (SIGKILL, SIGSTOP, SIGCONT); after SIGKILL also reaps the child.
  void Signal(int signal);

 private:
  PeerProcess() = default;
  absl::StatusOr<std::string> ReadLine(absl::Duration timeout);
  absl::Status WriteLine(const std::string& line);

  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  bool dead_ = false;
  std::string pending_;
  RemoteMemoryDescriptor descriptor_;
};

}  // namespace tandem::transfer::testing
