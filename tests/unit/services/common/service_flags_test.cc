#include "services/common/service_flags.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"

namespace tandem::service {
namespace {

namespace fs = std::filesystem;

// A service-like app: the common flags plus binary-specific options declared before
// and after them.
struct TestService {
  CLI::App app{"test service"};
  CommonFlags common;
  int max_batch_tokens = 256;
  std::string role = "prefill";
  std::vector<std::string> stop;
  bool ignore_eos = false;
  double temperature = 1.0;

  explicit TestService(CommonFlagDefaults defaults = {}) {
    app.add_option("--role", role, "prefill, decode or both");
    AddCommonFlags(app, &common, defaults);
    app.add_option("--max-batch-tokens", max_batch_tokens, "Token budget of one batch");
    app.add_option("--stop", stop, "Stop strings");
    app.add_flag("--ignore-eos", ignore_eos, "Keep generating after EOS");
    app.add_option("--temperature", temperature, "Sampling temperature");
    BindEnvironment(app);
  }

  // The exit code, or -1 to continue.
  int Parse(std::vector<std::string> args) {
    args.insert(args.begin(), "tandem-test");
    std::vector<const char*> argv;
    for (const auto& arg : args) argv.push_back(arg.c_str());
    std::optional<int> rc = ParseCommandLine(app, static_cast<int>(argv.size()), argv.data());
    return rc.value_or(-1);
  }

  // Parses and returns what went to stderr.
  std::string ParseForError(std::vector<std::string> args, int* rc) {
    ::testing::internal::CaptureStderr();
    *rc = Parse(std::move(args));
    return ::testing::internal::GetCapturedStderr();
  }
};

const char* const kVariables[] = {
    "TANDEM_LISTEN",     "TANDEM_ADMIN_LISTEN", "TANDEM_READY_FILE",       "TANDEM_ROUTER",
    "TANDEM_MODEL",      "TANDEM_LOG_LEVEL",    "TANDEM_LOG_FORMAT",       "TANDEM_CONFIG",
    "TANDEM_ROLE",       "TANDEM_STOP",         "TANDEM_MAX_BATCH_TOKENS", "TANDEM_IGNORE_EOS",
    "TANDEM_TEMPERATURE"};

class ServiceFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kVariables) unsetenv(name);
    dir_ = fs::temp_directory_path() /
           ("tandem_flags_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    for (const char* name : kVariables) unsetenv(name);
    fs::remove_all(dir_);
  }

  std::string WriteFile(const std::string& name, const std::string& contents) {
    fs::path path = dir_ / name;
    std::ofstream(path) << contents;
    return path.string();
  }

  fs::path dir_;
};

TEST_F(ServiceFlagsTest, Defaults) {
  TestService service({.listen = "127.0.0.1:50051", .model = "tiny"});
  ASSERT_EQ(service.Parse({}), -1);
  EXPECT_EQ(service.common.listen, "127.0.0.1:50051");
  EXPECT_EQ(service.common.admin_listen, "127.0.0.1:0");
  EXPECT_EQ(service.common.ready_file, "");
  EXPECT_EQ(service.common.router, "");
  EXPECT_EQ(service.common.model, "tiny");
  EXPECT_EQ(service.common.log_level, "info");
  EXPECT_EQ(service.common.log_format, "text");
  EXPECT_EQ(service.common.config, "");
  EXPECT_EQ(service.max_batch_tokens, 256);
}

TEST_F(ServiceFlagsTest, CommandLine) {
  TestService service;
  ASSERT_EQ(service.Parse({"--listen", "[::1]:9000", "--admin-listen=localhost:9001", "--ready-file",
                           "/tmp/r.json", "--router", "router:50051", "--model", "/models/x",
                           "--log-level", "debug", "--log-format", "json", "--max-batch-tokens",
                           "512", "--stop", "a", "--stop", "b", "--ignore-eos"}),
            -1);
  EXPECT_EQ(service.common.listen, "[::1]:9000");
  EXPECT_EQ(service.common.admin_listen, "localhost:9001");
  EXPECT_EQ(service.common.ready_file, "/tmp/r.json");
  EXPECT_EQ(service.common.router, "router:50051");
  EXPECT_EQ(service.common.model, "/models/x");
  EXPECT_EQ(service.common.log_level, "debug");
  EXPECT_EQ(service.common.log_format, "json");
  EXPECT_EQ(service.max_batch_tokens, 512);
  EXPECT_EQ(service.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(service.ignore_eos);
}

TEST_F(ServiceFlagsTest, EveryOptionReadsItsEnvironmentVariable) {
  TestService service;
  for (const CLI::Option* opt : service.app.get_options()) {
    if (opt == service.app.get_help_ptr()) continue;
    EXPECT_EQ(opt->get_envname(), EnvironmentVariableFor(opt->get_lnames().front()))
        << opt->get_name();
  }
  EXPECT_EQ(EnvironmentVariableFor("--admin-listen"), "TANDEM_ADMIN_LISTEN");
  EXPECT_EQ(EnvironmentVariableFor("max-batch-tokens"), "TANDEM_MAX_BATCH_TOKENS");

  setenv("TANDEM_ADMIN_LISTEN", "127.0.0.1:7001", 1);
  setenv("TANDEM_ROLE", "decode", 1);  // declared before the common flags
  setenv("TANDEM_MAX_BATCH_TOKENS", "1024", 1);
  setenv("TANDEM_LOG_LEVEL", "warn", 1);
  setenv("TANDEM_IGNORE_EOS", "true", 1);
  setenv("TANDEM_MODEL", "", 1);  // empty = unset
  ASSERT_EQ(service.Parse({}), -1);
  EXPECT_EQ(service.common.admin_listen, "127.0.0.1:7001");
  EXPECT_EQ(service.role, "decode");
  EXPECT_EQ(service.max_batch_tokens, 1024);
  EXPECT_EQ(service.common.log_level, "warn");
  EXPECT_TRUE(service.ignore_eos);
  EXPECT_EQ(service.common.model, "tiny");
}

TEST_F(ServiceFlagsTest, EnvironmentValuesAreValidated) {
  setenv("TANDEM_LISTEN", "no-port", 1);
  TestService service;
  int rc = 0;
  std::string error = service.ParseForError({}, &rc);
  EXPECT_GT(rc, 0);
  EXPECT_NE(error.find("missing ':PORT'"), std::string::npos) << error;
}

TEST_F(ServiceFlagsTest, PrecedenceCommandLineEnvironmentConfigDefault) {
  const std::string config = WriteFile("service.yaml",
                                       "listen: 127.0.0.1:1001\n"
                                       "admin-listen: 127.0.0.1:1002\n"
                                       "max-batch-tokens: 300\n"
                                       "model: /from/config\n");
  setenv("TANDEM_LISTEN", "127.0.0.1:2001", 1);
  setenv("TANDEM_ADMIN_LISTEN", "127.0.0.1:2002", 1);
  TestService service;
  ASSERT_EQ(service.Parse({"--config", config, "--listen", "127.0.0.1:3001"}), -1);
  EXPECT_EQ(service.common.listen, "127.0.0.1:3001");        // command line
  EXPECT_EQ(service.common.admin_listen, "127.0.0.1:2002");  // environment over config
  EXPECT_EQ(service.max_batch_tokens, 300);                   // config over default
  EXPECT_EQ(service.common.model, "/from/config");
  EXPECT_EQ(service.common.log_level, "info");                // default
  EXPECT_EQ(service.common.config, config);
}

TEST_F(ServiceFlagsTest, YamlConfig) {
  const std::string config = WriteFile("service.yaml",
                                       "# a comment\n"
                                       "listen: \"[::1]:9000\"\n"
                                       "max_batch_tokens: 512   # '_' for '-'\n"
                                       "stop:\n"
                                       "  - \"\\n\\n\"\n"
                                       "  - '###'\n"
                                       "ignore-eos: true\n"
                                       "temperature: 0.25\n"
                                       "log-format: json\n");
  TestService service;
  ASSERT_EQ(service.Parse({"--config", config}), -1);
  EXPECT_EQ(service.common.listen, "[::1]:9000");
  EXPECT_EQ(service.max_batch_tokens, 512);
  EXPECT_EQ(service.stop, (std::vector<std::string>{"\n\n", "###"}));
  EXPECT_TRUE(service.ignore_eos);
  EXPECT_DOUBLE_EQ(service.temperature, 0.25);
  EXPECT_EQ(service.common.log_format, "json");
}

TEST_F(ServiceFlagsTest, JsonConfig) {
  const std::string config = WriteFile(
      "service.json",
      "{\n\t\"listen\": \"127.0.0.1:9000\",\n  \"max-batch-tokens\": 512,\n"
      "  \"stop\": [\"a\", \"b\"],\n  \"ignore-eos\": false,\"temperature\":0.5,\n"
      "  \"router\": \"[::1]:1\"\n}\n");
  TestService service;
  ASSERT_EQ(service.Parse({"--config", config}), -1);
  EXPECT_EQ(service.common.listen, "127.0.0.1:9000");
  EXPECT_EQ(service.max_batch_tokens, 512);
  EXPECT_EQ(service.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(service.ignore_eos);
  EXPECT_DOUBLE_EQ(service.temperature, 0.5);
  EXPECT_EQ(service.common.router, "[::1]:1");
}

TEST_F(ServiceFlagsTest, ConfigFileFromEnvironment) {
  const std::string config = WriteFile("env.yaml", "max-batch-tokens: 77\n");
  setenv("TANDEM_CONFIG", config.c_str(), 1);
  {
    TestService service;
    ASSERT_EQ(service.Parse({}), -1);
    EXPECT_EQ(service.max_batch_tokens, 77);
    EXPECT_EQ(service.common.config, config);
  }
  {
    // --config on the command line wins over TANDEM_CONFIG.
    const std::string other = WriteFile("other.yaml", "max-batch-tokens: 88\n");
    TestService service;
    ASSERT_EQ(service.Parse({"--config", other}), -1);
    EXPECT_EQ(service.max_batch_tokens, 88);
  }
  {
    setenv("TANDEM_CONFIG", (dir_ / "missing.yaml").c_str(), 1);
    TestService service;
    int rc = 0;
    std::string error = service.ParseForError({}, &rc);
    EXPECT_GT(rc, 0);
    EXPECT_NE(error.find("missing.yaml"), std::string::npos) << error;
  }
}

TEST_F(ServiceFlagsTest, ConfigErrorsNameTheKey) {
  struct Case {
    const char* contents;
    const char* expected;
  };
  const Case cases[] = {
      {"listen: 127.0.0.1:1\nmax-batch-token: 5\n", "unknown key 'max-batch-token'"},
      {"max-batch-tokens: lots\n", "max-batch-tokens"},  // a type error
      {"listen: {host: a}\n", "key 'listen': expected a value or a list of values, not a map"},
      {"listen: [\"a:1\", \"b:2\"]\n", "--listen takes one value, got a list of 2"},
      {"listen:\n", "key 'listen': has no value"},
      {"config: other.yaml\n", "key 'config' cannot be set from a config file"},
      {"help: true\n", "unknown key 'help'"},
      {"- listen\n", "expected a map of flag names to values"},
      {"listen: [unclosed\n", "not valid YAML or JSON"},
      {"log-level: loud\n", "loud"},
      {"listen: nowhere\n", "missing ':PORT'"},
  };
  for (const Case& c : cases) {
    const std::string config = WriteFile("bad.yaml", c.contents);
    TestService service;
    int rc = 0;
    std::string error = service.ParseForError({"--config", config}, &rc);
    EXPECT_GT(rc, 0) << c.contents;
    EXPECT_NE(error.find(c.expected), std::string::npos) << c.contents << "\n" << error;
  }
}

TEST_F(ServiceFlagsTest, CommandLineErrors) {
  {
    TestService service;
    int rc = 0;
    std::string error = service.ParseForError({"--listen", "[::1]80"}, &rc);
    EXPECT_GT(rc, 0);
    EXPECT_NE(error.find("[::1]80"), std::string::npos) << error;
  }
  {
    TestService service;
    int rc = 0;
    std::string error = service.ParseForError({"--log-level", "verbose"}, &rc);
    EXPECT_GT(rc, 0);
    EXPECT_NE(error.find("verbose"), std::string::npos) << error;
  }
  {
    TestService service;
    int rc = 0;
    service.ParseForError({"--no-such-flag"}, &rc);
    EXPECT_GT(rc, 0);
  }
}

TEST_F(ServiceFlagsTest, HelpDocumentsEveryFlagWithItsVariableAndDefault) {
  TestService service({.listen = "127.0.0.1:50051"});
  const std::string help = service.app.help();
  for (const CLI::Option* opt : service.app.get_options()) {
    if (opt == service.app.get_help_ptr()) continue;
    const std::string name = opt->get_lnames().front();
    EXPECT_NE(help.find("--" + name), std::string::npos) << name << "\n" << help;
    EXPECT_NE(help.find("(Env:" + EnvironmentVariableFor(name) + ")"), std::string::npos)
        << name << "\n" << help;
  }
  for (const char* shown : {"HOST:PORT=127.0.0.1:50051", "HOST:PORT=127.0.0.1:0", "=tiny", "=info",
                            "=text", "=256", "FILE", "(command line > environment > file > default)"}) {
    EXPECT_NE(help.find(shown), std::string::npos) << shown << "\n" << help;
  }
}

void ParseHelpOrExit() {
  if (std::freopen("/dev/null", "w", stdout) == nullptr) std::exit(4);  // keep the log quiet
  TestService exiting;
  char arg0[] = "tandem-test";
  char arg1[] = "--help";
  char* argv[] = {arg0, arg1};
  ParseOrExit(exiting.app, 2, argv);
  std::exit(3);  // not reached
}

TEST_F(ServiceFlagsTest, HelpReturnsZeroAndParseOrExitExits) {
  TestService service;
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(service.Parse({"--help"}), 0);
  EXPECT_NE(::testing::internal::GetCapturedStdout().find("--admin-listen"), std::string::npos);

  EXPECT_EXIT(ParseHelpOrExit(), ::testing::ExitedWithCode(0), "");
}

// The app's settings written as a config file (CLI11's config_to_str) read back the same.
TEST_F(ServiceFlagsTest, WrittenConfigReadsBack) {
  TestService first;
  ASSERT_EQ(first.Parse({"--listen", "[::1]:9000", "--max-batch-tokens", "64", "--stop", "a b", "--stop",
                         "c", "--ignore-eos", "--temperature", "0.5", "--log-format", "json"}),
            -1);
  const std::string config = WriteFile("written.yaml", first.app.config_to_str(/*default_also=*/true));
  TestService second;
  ASSERT_EQ(second.Parse({"--config", config}), -1) << config;
  EXPECT_EQ(second.common.listen, "[::1]:9000");
  EXPECT_EQ(second.common.admin_listen, "127.0.0.1:0");
  EXPECT_EQ(second.common.log_format, "json");
  EXPECT_EQ(second.max_batch_tokens, 64);
  EXPECT_EQ(second.stop, (std::vector<std::string>{"a b", "c"}));
  EXPECT_TRUE(second.ignore_eos);
  EXPECT_DOUBLE_EQ(second.temperature, 0.5);
}

TEST_F(ServiceFlagsTest, OptionalFlagsCanBeLeftOut) {
  TestService service({.with_router = false, .with_model = false});
  EXPECT_EQ(service.app.get_option_no_throw("--router"), nullptr);
  EXPECT_EQ(service.app.get_option_no_throw("--model"), nullptr);
  EXPECT_NE(service.app.get_option_no_throw("--listen"), nullptr);
}

}  // namespace
}  // namespace tandem::service
