// tool_choice resolution (OpenAI's rules) and the after-the-fact check of required and
// named choices.
#include "engine/output_parsing/tool_choice.h"

#include <gtest/gtest.h>

#include <string>

#include "nlohmann/json.hpp"

namespace tandem::output_parsing {
namespace {

using nlohmann::json;

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
  {"type": "function", "function": {"name": "get_time"}}
])");

ToolChoice Resolve(const json& tools, const json& choice) {
  absl::StatusOr<ToolChoice> c = ResolveToolChoice(tools, choice);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ToolChoice{};
}

std::string ErrorOf(const json& tools, const json& choice) {
  absl::StatusOr<ToolChoice> c = ResolveToolChoice(tools, choice);
  EXPECT_FALSE(c.ok());
  if (c.ok()) return "";
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(c.status().message());
}

TEST(ToolChoiceTest, DefaultsAsOpenAI) {
  EXPECT_EQ(Resolve(nullptr, nullptr).mode, ToolChoiceMode::kNone);
  EXPECT_EQ(Resolve(kTools, nullptr).mode, ToolChoiceMode::kAuto);
  EXPECT_EQ(Resolve(json::array(), nullptr).mode, ToolChoiceMode::kNone);
  EXPECT_EQ(Resolve(kTools, nullptr).tool_names, std::vector<std::string>({"get_weather", "get_time"}));
}

TEST(ToolChoiceTest, ReadsEveryForm) {
  EXPECT_EQ(Resolve(kTools, "none").mode, ToolChoiceMode::kNone);
  EXPECT_FALSE(Resolve(kTools, "none").parse_tool_calls());
  EXPECT_EQ(Resolve(kTools, "auto").mode, ToolChoiceMode::kAuto);
  EXPECT_TRUE(Resolve(kTools, "auto").parse_tool_calls());
  EXPECT_EQ(Resolve(nullptr, "auto").mode, ToolChoiceMode::kNone);
  EXPECT_EQ(Resolve(kTools, "required").mode, ToolChoiceMode::kRequired);
  const ToolChoice named =
      Resolve(kTools, json::parse(R"({"type": "function", "function": {"name": "get_time"}})"));
  EXPECT_EQ(named.mode, ToolChoiceMode::kNamed);
  EXPECT_EQ(named.function_name, "get_time");
  EXPECT_TRUE(named.parse_tool_calls());
}

TEST(ToolChoiceTest, RejectsBadInputNamingTheField) {
  EXPECT_EQ(ErrorOf(kTools, "sometimes").rfind("tool_choice:", 0), 0u);
  EXPECT_EQ(ErrorOf(kTools, 3).rfind("tool_choice:", 0), 0u);
  EXPECT_EQ(ErrorOf(nullptr, "required").rfind("tool_choice:", 0), 0u);
  EXPECT_EQ(ErrorOf(kTools, json::parse(R"({"type": "function", "function": {"name": "nope"}})"))
                .rfind("tool_choice.function.name:", 0),
            0u);
  EXPECT_EQ(ErrorOf(kTools, json::parse(R"({"type": "tool", "function": {"name": "get_time"}})"))
                .rfind("tool_choice.type:", 0),
            0u);
  EXPECT_EQ(ErrorOf(json::object(), nullptr).rfind("tools:", 0), 0u);
  EXPECT_EQ(ErrorOf(json::parse(R"([{"type": "function", "function": {"name": ""}}])"), nullptr)
                .rfind("tools[0].function.name:", 0),
            0u);
  EXPECT_EQ(ErrorOf(json::parse(R"([{"function": {"name": "a"}}, {"type": "code"}])"), nullptr)
                .rfind("tools[1].type:", 0),
            0u);
}

ParsedChatOutput WithCalls(std::vector<ParsedToolCall> calls, absl::Status status = absl::OkStatus()) {
  ParsedChatOutput out;
  out.tool_calls = std::move(calls);
  out.tool_call_status = std::move(status);
  return out;
}

TEST(ToolChoiceTest, ChecksRequiredAndNamedAfterTheOutput) {
  const ToolChoice required = Resolve(kTools, "required");
  const ToolChoice named = Resolve(kTools, json::parse(R"({"type": "function", "function": {"name": "get_time"}})"));
  const ParsedToolCall time{"call_0", "get_time", "{}", true};
  const ParsedToolCall weather{"call_1", "get_weather", "{}", true};
  const ParsedToolCall cut{"call_0", "get_time", "{\"tz", false};

  EXPECT_TRUE(CheckToolChoiceSatisfied(Resolve(kTools, "auto"), WithCalls({})).ok());
  EXPECT_TRUE(CheckToolChoiceSatisfied(required, WithCalls({weather})).ok());
  EXPECT_TRUE(CheckToolChoiceSatisfied(named, WithCalls({time})).ok());

  const absl::Status none = CheckToolChoiceSatisfied(required, WithCalls({}));
  EXPECT_EQ(none.code(), absl::StatusCode::kFailedPrecondition);
  const absl::Status incomplete =
      CheckToolChoiceSatisfied(required, WithCalls({cut}, absl::OutOfRangeError("tool call 0: cut off")));
  EXPECT_EQ(incomplete.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(incomplete.message().find("cut off"), std::string::npos) << incomplete;
  const absl::Status wrong = CheckToolChoiceSatisfied(named, WithCalls({time, weather}));
  EXPECT_EQ(wrong.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(wrong.message().find("get_weather"), std::string::npos) << wrong;
}

}  // namespace
}  // namespace tandem::output_parsing
