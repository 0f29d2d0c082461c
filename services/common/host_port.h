// "HOST:PORT" addresses as the services' flags spell them: "127.0.0.1:9000",
// "localhost:0", "[::1]:9000" (IPv6 literals in brackets, as gRPC and URLs write them).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem::service {

struct HostPort {
  std::string host;  // without brackets: "::1", "127.0.0.1", "localhost"
  uint16_t port = 0;  // 0 = let the system pick a free port when binding

  // "host:port", with brackets around an IPv6 host.
  std::string ToString() const;
  bool operator==(const HostPort&) const = default;
};

// Parses "HOST:PORT" or "[V6]:PORT". The port is decimal, 0..65535 (0 is accepted: a
// listener reads it as "any free port"). Errors: INVALID_ARGUMENT naming the problem
// (empty address, missing ':PORT', bad or out-of-range port, empty host, an IPv6
// literal without brackets, an invalid bracketed IPv6 literal, characters a host name
// cannot hold).
absl::StatusOr<HostPort> ParseHostPort(std::string_view address);

// "host:port", with brackets when `host` is an IPv6 literal (contains ':').
std::string FormatHostPort(std::string_view host, uint16_t port);

}  // namespace tandem::service
