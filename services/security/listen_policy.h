// The secure default of internal ports: without credentials (neither mutual TLS nor a
// cluster token) an internal listener may bind loopback addresses only, and says loudly
// that any local process may use it; a listener that other hosts could reach needs
// credentials, or the service refuses to start.
//
// Why loopback and not "refuse always": `tandem serve-local`, tests and single-host
// experiments then keep working without setup, while nothing reachable from the network
// is ever open by accident. (An explicit "insecure" switch was left out on purpose: a
// token file is one line of setup, and an open control plane lets anyone register a fake
// replica and read other users' prompts.)
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace tandem::security {

// "localhost", 127.0.0.0/8, "::1" (bracketed or not).
bool IsLoopbackHost(std::string_view host);

// OK when `authenticated`, or when `host_port` binds a loopback address (then it logs a
// warning). Otherwise FAILED_PRECONDITION naming `flag` ("--internal-listen") and the
// credential flags. INVALID_ARGUMENT for an address that does not parse.
absl::Status CheckInternalListen(const std::string& host_port, bool authenticated, std::string_view flag);

}  // namespace tandem::security
