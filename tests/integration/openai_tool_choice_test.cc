// tool_choice "required" and a named function end to end: the real router (HTTP API,
// --tool-call-parser deepseek_v3) and one aggregated worker on the tiny random-weight
// model, whose tokenizer is DeepSeek-V3's (the tool-call markers are its added tokens),
// driven by the official OpenAI Node SDK (tests/integration/openai/sdk_tool_choice.mjs),
// which checks every call's arguments with Ajv against the tool's schema. A random model
// writes no tool calls unconstrained; here every request must come back as calls.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/subprocess.h"

namespace tandem {
namespace {

TEST(OpenAiToolChoiceTest, RequiredAndNamedComeBackAsValidCalls) {
  const char* src = std::getenv("TANDEM_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  auto cluster = testing::StartCluster(0, 0, 1, {}, {"--http-listen=127.0.0.1:0", "--tool-call-parser=deepseek_v3"});
  ASSERT_NE(cluster, nullptr);
  const std::string http = cluster->router_http_address();
  ASSERT_FALSE(http.empty());
  const testing::ProcessResult r = testing::RunProcess(
      {"/usr/bin/env", "node", absl::StrCat(src, "/tests/integration/openai/sdk_tool_choice.mjs"),
       absl::StrCat("http://", http, "/v1"), "tiny"},
      {}, 600);
  std::fprintf(stderr, "%s", r.err.c_str());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The script's last line.
  std::string last = r.out;
  while (!last.empty() && last.back() == '\n') last.pop_back();
  last = last.substr(last.rfind('\n') == std::string::npos ? 0 : last.rfind('\n') + 1);
  const nlohmann::json seen = nlohmann::json::parse(last, nullptr, false);
  ASSERT_TRUE(seen.is_object()) << r.out;
  std::fprintf(stderr, "calls: %s\n", seen.dump().c_str());
  EXPECT_EQ(seen["required"].size(), 6u);
  EXPECT_EQ(seen["named"].size(), 3u);
}

// A model that reasons first (--reasoning-parser deepseek_r1): the named call comes after
// the reasoning, each part in its own field (sdk_tool_choice_reasoning.mjs says how).
TEST(OpenAiToolChoiceTest, AfterTheReasoningOfAModelThatReasonsFirst) {
  const char* src = std::getenv("TANDEM_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  auto cluster = testing::StartCluster(
      0, 0, 1, {}, {"--http-listen=127.0.0.1:0", "--tool-call-parser=deepseek_v3", "--reasoning-parser=deepseek_r1"});
  ASSERT_NE(cluster, nullptr);
  const std::string http = cluster->router_http_address();
  ASSERT_FALSE(http.empty());
  const testing::ProcessResult r = testing::RunProcess(
      {"/usr/bin/env", "node", absl::StrCat(src, "/tests/integration/openai/sdk_tool_choice_reasoning.mjs"),
       absl::StrCat("http://", http, "/v1"), "tiny"},
      {}, 600);
  std::fprintf(stderr, "%s%s", r.err.c_str(), r.out.c_str());
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

}  // namespace
}  // namespace tandem
