// The gRPC backend of `tandem bench`: streaming tandem.v1.Generation/Generate calls (the
// callback API, one reactor per call), timed per streamed message.
#pragma once

#include <memory>
#include <string>

#include "cli/bench/bench_backend.h"
#include "cli/client_security.h"

namespace tandem::cli {

// `addr`: HOST:PORT of the router (or of a worker's internal port).
std::unique_ptr<BenchBackend> MakeGrpcBackend(std::string addr, ClientSecurityArgs security, RequestSettings settings);

}  // namespace tandem::cli
