// The main() of tandem-router: the public Generation API and the Cluster membership
// service on one gRPC port, the admin HTTP server, and the ready file.
#pragma once

namespace tandem {

int RunRouter(int argc, char** argv);

}  // namespace tandem
