// Structured-output fields of OpenAI, vLLM and SGLang request bodies into one
// GenerateRequest.constraint, and the 400s for what does not fit.
#include "services/openai/response_format.h"

#include "gtest/gtest.h"

namespace tandem::openai {
namespace {

v1::Constraint Parse(const char* body) {
  v1::Constraint c;
  const std::optional<ApiError> e = ParseResponseFormat(Json::parse(body), &c);
  EXPECT_FALSE(e.has_value()) << body << ": " << (e ? e->message : "");
  return c;
}

ApiError Refuse(const char* body) {
  v1::Constraint c;
  std::optional<ApiError> e = ParseResponseFormat(Json::parse(body), &c);
  EXPECT_TRUE(e.has_value()) << body;
  return e.value_or(ApiError{});
}

TEST(ResponseFormatTest, OpenAiForms) {
  EXPECT_EQ(Parse(R"({})").kind_case(), v1::Constraint::KIND_NOT_SET);
  EXPECT_EQ(Parse(R"({"response_format": null})").kind_case(), v1::Constraint::KIND_NOT_SET);
  EXPECT_EQ(Parse(R"({"response_format": {"type": "text"}})").kind_case(), v1::Constraint::KIND_NOT_SET);
  EXPECT_TRUE(Parse(R"({"response_format": {"type": "json_object"}})").has_json_object());
  const v1::Constraint s = Parse(
      R"({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true,
          "schema": {"type": "object", "properties": {"b": {"type": "integer"}, "a": {}}}}}})");
  // Key order kept: the grammar writes properties in the schema's order.
  EXPECT_EQ(s.json_schema(), R"({"type":"object","properties":{"b":{"type":"integer"},"a":{}}})");
  EXPECT_TRUE(s.strict());
  EXPECT_FALSE(Parse(R"({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}})").strict());
}

TEST(ResponseFormatTest, VllmAndSglangForms) {
  EXPECT_EQ(Parse(R"({"structured_outputs": {"regex": "[a-z]+"}})").regex(), "[a-z]+");
  EXPECT_EQ(Parse(R"({"structured_outputs": {"json": "{\"type\": \"string\"}"}})").json_schema(),
            R"({"type": "string"})");
  EXPECT_EQ(Parse(R"({"structured_outputs": {"json": {"type": "string"}}})").json_schema(), R"({"type":"string"})");
  EXPECT_EQ(Parse(R"({"structured_outputs": {"grammar": "root ::= \"a\""}})").ebnf().grammar(), "root ::= \"a\"");
  EXPECT_TRUE(Parse(R"({"structured_outputs": {"json_object": true}})").has_json_object());
  EXPECT_EQ(Parse(R"j({"structured_outputs": {"choice": ["yes", "no (maybe)"]}})j").regex(),
            "(?:yes)|(?:no \\(maybe\\))");
  EXPECT_EQ(Parse(R"({"guided_regex": "\\d+"})").regex(), "\\d+");
  EXPECT_EQ(Parse(R"({"guided_choice": ["a.b"]})").regex(), "(?:a\\.b)");
  EXPECT_EQ(Parse(R"({"regex": "x"})").regex(), "x");
  EXPECT_EQ(Parse(R"({"ebnf": "root ::= \"b\""})").ebnf().grammar(), "root ::= \"b\"");
  EXPECT_EQ(Parse(R"({"json_schema": "{}"})").json_schema(), "{}");
}

TEST(ResponseFormatTest, RefusalsNameTheField) {
  EXPECT_EQ(Refuse(R"({"response_format": "json"})").param, "response_format");
  EXPECT_EQ(Refuse(R"({"response_format": {"type": "xml"}})").param, "response_format.type");
  EXPECT_EQ(Refuse(R"({"response_format": {"type": "json_schema"}})").param, "response_format.json_schema");
  EXPECT_EQ(Refuse(R"({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})").param,
            "response_format.json_schema.schema");
  EXPECT_EQ(Refuse(R"({"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}})").param,
            "response_format.json_schema.schema");
  EXPECT_EQ(Refuse(R"({"structured_outputs": {"choice": []}})").param, "structured_outputs.choice");
  EXPECT_EQ(Refuse(R"({"structured_outputs": {"regexp": "a"}})").param, "structured_outputs.regexp");
  EXPECT_EQ(Refuse(R"({"structured_outputs": {"disable_any_whitespace": true}})").param,
            "structured_outputs.disable_any_whitespace");
  EXPECT_EQ(Refuse(R"({"json_schema": {"type": "string"}})").param, "json_schema");
  const ApiError two = Refuse(R"({"response_format": {"type": "json_object"}, "regex": "a"})");
  EXPECT_EQ(two.http_status, 400);
  EXPECT_NE(two.message.find("at most one"), std::string::npos) << two.message;
  EXPECT_NE(Refuse(R"({"structured_outputs": {"regex": "a", "json_object": true}})").message.find("at most one"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::openai
