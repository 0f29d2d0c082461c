// The main() of tandem-prefill and tandem-decode: flags, the engine, the role's gRPC
// services, the admin HTTP server, registration with the router, the ready file, and an
// orderly shutdown on SIGINT/SIGTERM (deregister, finish in-flight work, stop).
#pragma once

#include "tandem/v1/internal.pb.h"

namespace tandem {

int RunWorker(int argc, char** argv, v1::Role default_role, const char* binary_name);

}  // namespace tandem
