#pragma once

#include "CLI/CLI.hpp"

namespace tandem::cli {

// `tandem bench`: a serving load generator (see cli/bench/load_generator.h).
void RegisterBench(CLI::App& app, int* exit_code);

}  // namespace tandem::cli
