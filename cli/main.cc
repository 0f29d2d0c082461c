// The `tandem` command line: one binary, a subcommand per job.
#include <cstdio>

#include "CLI/CLI.hpp"
#include "cli/generate_command.h"
#include "cli/make_model_command.h"
#ifdef TANDEM_WITH_SERVICES
#include "cli/bench_command.h"
#include "cli/serve_local_command.h"
#endif

int main(int argc, char** argv) {
  CLI::App app{"Tandem: disaggregated LLM serving. Run `tandem <command> --help` for a command's flags."};
  app.require_subcommand(1);
  int exit_code = 0;
  tandem::cli::RegisterMakeModel(app, &exit_code);
  tandem::cli::RegisterGenerate(app, &exit_code);
#ifdef TANDEM_WITH_SERVICES
  tandem::cli::RegisterServeLocal(app, &exit_code);
  tandem::cli::RegisterStatus(app, &exit_code);
  tandem::cli::RegisterBench(app, &exit_code);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}
