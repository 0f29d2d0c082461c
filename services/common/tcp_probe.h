// Whether anything accepts TCP connections at an address. The decode replica uses it to
// tell a writer's process that is gone (nothing listens at its address: the connection is
// refused) from one that is only stopped or slow: the kernel completes connections to a
// stopped process's listening socket, so a gRPC call to it times out, which proves nothing.
#pragma once

#include <chrono>
#include <string>

namespace tandem::service {

enum class TcpProbeResult {
  kRefused,   // every address the host resolves to refused the connection
  kAccepted,  // one accepted it
  kUnknown,   // no answer in time, unreachable, or the host does not resolve
};

// Blocks for at most about `timeout` per resolved address. `address` is "HOST:PORT"
// (host_port.h).
TcpProbeResult ProbeTcp(const std::string& address, std::chrono::milliseconds timeout);

}  // namespace tandem::service
