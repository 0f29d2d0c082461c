#pragma once

#include "CLI/CLI.hpp"

namespace tandem::cli {

// `tandem make-model`: writes a deterministic random-weight checkpoint.
void RegisterMakeModel(CLI::App& app, int* exit_code);

}  // namespace tandem::cli
