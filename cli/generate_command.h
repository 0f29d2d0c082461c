#pragma once

#include "CLI/CLI.hpp"

namespace tandem::cli {

// `tandem generate`: streams a generation to stdout (--local: in-process engine).
void RegisterGenerate(CLI::App& app, int* exit_code);

}  // namespace tandem::cli
