// The registry: built-in names, unknown names listing the known ones, registration of
// further parsers; and tool-call ids.
#include "engine/output_parsing/parser_registry.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "engine/output_parsing/think_reasoning_parser.h"
#include "engine/output_parsing/tool_call_id.h"

namespace tandem::output_parsing {
namespace {

TEST(OutputParserRegistryTest, HasTheBuiltInNames) {
  const OutputParserRegistry registry = OutputParserRegistry::WithBuiltins();
  EXPECT_EQ(registry.ReasoningParserNames(), std::vector<std::string>({"deepseek_r1", "deepseek_v3"}));
  EXPECT_EQ(registry.ToolCallParserNames(), std::vector<std::string>({"deepseek_v3", "deepseek_v31"}));
  for (const std::string& name : registry.ReasoningParserNames()) {
    EXPECT_TRUE(registry.MakeReasoningParser(name, {}).ok()) << name;
  }
  for (const std::string& name : registry.ToolCallParserNames()) {
    EXPECT_TRUE(registry.MakeToolCallParser(name).ok()) << name;
  }
}

TEST(OutputParserRegistryTest, UnknownNamesListTheKnownOnes) {
  const OutputParserRegistry registry = OutputParserRegistry::WithBuiltins();
  const absl::Status r = registry.CheckReasoningParser("qwen3");
  EXPECT_EQ(r.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.message(), "unknown reasoning parser \"qwen3\" (known: deepseek_r1, deepseek_v3)");
  const absl::Status t = registry.MakeToolCallParser("deepseek_v32").status();
  EXPECT_EQ(t.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t.message(), "unknown tool-call parser \"deepseek_v32\" (known: deepseek_v3, deepseek_v31)");
  EXPECT_EQ(OutputParserRegistry().CheckToolCallParser("x").message(), "unknown tool-call parser \"x\" (known: none)");
}

TEST(OutputParserRegistryTest, RegistersFurtherParsersOnce) {
  OutputParserRegistry registry = OutputParserRegistry::WithBuiltins();
  auto identity = [](const ReasoningOptions&) { return std::make_unique<IdentityReasoningParser>(); };
  EXPECT_TRUE(registry.RegisterReasoningParser("identity", identity).ok());
  EXPECT_TRUE(registry.CheckReasoningParser("identity").ok());
  EXPECT_EQ(registry.RegisterReasoningParser("deepseek_r1", identity).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.RegisterReasoningParser("", identity).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ToolCallIdTest, RandomIdsLookLikeOpenAIsAndDiffer) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = RandomToolCallId();
    ASSERT_EQ(id.size(), 5u + 24u) << id;
    EXPECT_EQ(id.rfind("call_", 0), 0u) << id;
    for (char c : id.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << id;
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 1000u);
}

}  // namespace
}  // namespace tandem::output_parsing
