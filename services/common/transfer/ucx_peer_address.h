// The address a UcxTransferEngine publishes: the ucp worker address plus who owns it (pid,
// process start time, boot id, pid namespace). UCX 1.13's shared-memory transports cannot
// report a dead peer, so for such endpoints the engine watches the peer process itself
// (a pidfd), which needs to know which process that is. Internal to the transfer layer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem::transfer::internal {

struct ProcessIdentity {
  uint32_t pid = 0;
  uint64_t start_time = 0;    // /proc/PID/stat field 22 (clock ticks since boot)
  std::string boot_id;        // /proc/sys/kernel/random/boot_id
  std::string pid_namespace;  // readlink /proc/self/ns/pid

  static ProcessIdentity Self();
  // True when `other` is a process this one can watch by pid: same boot, same pid namespace.
  bool CanWatch(const ProcessIdentity& other) const;
};

struct UcxPeerAddress {
  ProcessIdentity owner;
  std::string worker_address;  // ucp_worker_get_address bytes

  // "TUA" | version | owner | worker address, integers little-endian.
  std::string Encode() const;
  // INVALID_ARGUMENT for anything Encode() did not produce.
  static absl::StatusOr<UcxPeerAddress> Decode(std::string_view bytes);
};

// A pidfd for `process` if it is still running (and is the same process, not a reuse of
// its pid); UNAVAILABLE when it exited. Close it with close().
absl::StatusOr<int> OpenProcessHandle(const ProcessIdentity& process);
// Whether the process behind a pidfd has exited (non-blocking).
bool ProcessExited(int pidfd);

}  // namespace tandem::transfer::internal
