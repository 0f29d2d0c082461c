#pragma once

#include "CLI/CLI.hpp"

namespace tandem::cli {

// `tandem serve-local`: a whole cluster on this machine until Ctrl-C / SIGTERM.
void RegisterServeLocal(CLI::App& app, int* exit_code);
// `tandem status --addr`: the cluster's replicas.
void RegisterStatus(CLI::App& app, int* exit_code);

}  // namespace tandem::cli
