// Channels of the CLI's clients, with the credentials of client_security.h.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cli/client_security.h"

namespace tandem::cli {

// A client certificate or a cluster token: the internal credentials (mutual TLS needs
// --tls-ca, --tls-cert and --tls-key together); otherwise TLS against --tls-ca, or
// plaintext. With an API key every call on the channel carries it (authorization:
// Bearer KEY). Errors: INVALID_ARGUMENT / NOT_FOUND naming the flag.
absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenClientChannel(const std::string& addr,
                                                                 const ClientSecurityArgs& a);

}  // namespace tandem::cli
