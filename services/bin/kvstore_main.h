// The main() of tandem-kvstore: flags, the DRAM tier in transfer-layer memory, the SSD
// tier, the KvStore gRPC service, the admin HTTP server (/stats), registration with the
// router as ROLE_KVSTORE, the ready file, and an orderly shutdown on SIGINT/SIGTERM.
#pragma once

namespace tandem {

int RunKvStore(int argc, char** argv);

}  // namespace tandem
