// The main() of tandem-router: the public Generation API on --listen, the Cluster
// membership service on --internal-listen (with the cluster's credentials), the admin
// HTTP server, and the ready file.
#pragma once

namespace tandem {

int RunRouter(int argc, char** argv);

}  // namespace tandem
