// The flags every Tandem service shares (docs/design.md §1) and the flag plumbing of every
// service binary: TANDEM_* environment variables and --config files for all options.
//
//   CLI::App app{"tandem-decode: ..."};
//   CommonFlags common;
//   AddCommonFlags(app, &common, {.listen = "127.0.0.1:50052"});
//   app.add_option("--max-batch-tokens", max_batch_tokens, "...");
//   BindEnvironment(app);                       // after the last option is declared
//   if (int rc = ParseOrExit(app, argc, argv); rc != 0) return rc;
//
// Every option then reads, from highest to lowest precedence: the command line, the
// environment variable TANDEM_<NAME> (--admin-listen -> TANDEM_ADMIN_LISTEN; an empty
// value counts as unset), the --config file (or the one named by TANDEM_CONFIG), and the
// default. (CLI11 2.1.2 alone lets the config file win over the environment; the config
// reader here drops config keys whose variable is set, to give the order above.)
//
// Config files are YAML or JSON (JSON is YAML), a flat map of long flag names (without
// "--"; '_' is accepted for '-') to values: scalars, lists for options that take several
// values, booleans for flags:
//
//   listen: 127.0.0.1:9000
//   max-batch-tokens: 512
//   stop: ["\n\n", "###"]
//
// An unknown key, a nested map, a null value or a list for a one-value option is an
// error naming the key; a value of the wrong type is CLI11's conversion error naming the
// flag.
#pragma once

#include <optional>
#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace tandem::service {

// Per-binary defaults of the common flags.
struct CommonFlagDefaults {
  std::string listen = "127.0.0.1:0";        // gRPC; port 0 = any free port
  std::string admin_listen = "127.0.0.1:0";  // HTTP admin (/metrics, /healthz, /readyz)
  std::string router;                        // empty: do not register anywhere
  std::string model = "tiny";
  std::string log_level = "info";
  std::string log_format = "text";
  bool with_router = true;  // declare --router (the router itself has no use for it)
  bool with_model = true;   // declare --model
};

// Values of the common flags after parsing.
struct CommonFlags {
  std::string listen;        // HOST:PORT, validated by ParseHostPort
  std::string admin_listen;  // HOST:PORT
  std::string ready_file;    // empty: write none
  std::string router;        // HOST:PORT or empty
  std::string model;         // a checkpoint directory or "tiny"
  std::string log_level;     // one of LogLevelNames()
  std::string log_format;    // one of LogFormatNames()
  std::string config;        // the config file read, if any
};

// Declares --listen, --admin-listen, --ready-file, --router (unless !with_router),
// --model (unless !with_model), --log-level, --log-format and --config on `app`, bound
// to `*flags` (which must outlive parsing), with `defaults` as defaults, and installs the
// YAML/JSON config reader. Call once per app.
void AddCommonFlags(CLI::App& app, CommonFlags* flags, const CommonFlagDefaults& defaults);

// Gives every option of `app` and of its subcommands and option groups that has no
// environment variable yet the variable TANDEM_<NAME> (NAME: the first long name, else
// the short or positional name, upper case, '-' -> '_'), and shows its default in
// --help. Call after the last option is declared. --help and --help-all are skipped.
void BindEnvironment(CLI::App& app);

// The variable BindEnvironment gives an option named `name` ("--admin-listen",
// "admin-listen", "-v"): "TANDEM_ADMIN_LISTEN".
std::string EnvironmentVariableFor(const std::string& name);

// Parses the command line. Returns std::nullopt to continue; otherwise the process
// should exit with the returned code: 0 after --help (printed to stdout), non-zero after
// an error (printed to stderr, with a hint to use --help).
std::optional<int> ParseCommandLine(CLI::App& app, int argc, const char* const* argv);

// For main(): parses; returns 0 to continue or a non-zero exit code to return from
// main() after an error; after --help it exits the process with status 0 itself (so 0
// always means "continue").
int ParseOrExit(CLI::App& app, int argc, char** argv);

}  // namespace tandem::service
