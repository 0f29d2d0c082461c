// The EBNF front end: the format's features and its errors.
#include "engine/grammar/ebnf_parser.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/unit/engine/grammar/recognize.h"

namespace tandem::grammar {
namespace {

using testing::Recognizes;

Grammar Parse(std::string_view text) {
  absl::StatusOr<Grammar> g = ParseEbnf(text);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : Grammar();
}

TEST(EbnfParserTest, JsonLikeGrammar) {
  const Grammar g = Parse(R"(
# A small JSON.
root   ::= value
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( pair ( "," ws pair )* )? "}" ws
pair   ::= string ws ":" ws value
array  ::= "[" ws ( value ( "," ws value )* )? "]" ws
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ["\\/bfnrt] )* "\"" ws
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )? ws
ws     ::= [ \t\n]*
)");
  EXPECT_TRUE(Recognizes(g, R"({"a": [1, 2.5e-3, "x\"y"], "b": {"c": null}} )"));
  EXPECT_TRUE(Recognizes(g, "\"caf\xC3\xA9\""));
  EXPECT_FALSE(Recognizes(g, R"({"a": [1, 2.5e-3, "x\"y"], "b": {"c": nul}})"));
  EXPECT_FALSE(Recognizes(g, R"({"a" 1})"));
  EXPECT_FALSE(Recognizes(g, "01"));
}

TEST(EbnfParserTest, LiteralsEscapesClassesAndRepetition) {
  const Grammar g = Parse(R"(root ::= "a\n\t\\\"\x41\u00e9\U0001F600" [a-c\u00e0-\u00e2]{2,3} [^0-9]? . x{,2}
x ::= "x")");
  EXPECT_TRUE(Recognizes(g, "a\n\t\\\"A\xC3\xA9\xF0\x9F\x98\x80" "ab" "z" "\xE2\x82\xAC" "xx"));
  EXPECT_TRUE(Recognizes(g, "a\n\t\\\"A\xC3\xA9\xF0\x9F\x98\x80" "\xC3\xA0\xC3\xA2" "c" "9"));
  EXPECT_FALSE(Recognizes(g, "a\n\t\\\"A\xC3\xA9\xF0\x9F\x98\x80" "a" "z" "."));
  EXPECT_FALSE(Recognizes(g, "a\n\t\\\"A\xC3\xA9\xF0\x9F\x98\x80" "abc" "z" "." "xxx"));
}

TEST(EbnfParserTest, RulesSpanLinesAndEndAtTheNextDefinition) {
  const Grammar g = Parse("root ::= a\n  | b\n  b\na ::= \"a\" # comment\n b ::= \"b\"");
  EXPECT_TRUE(Recognizes(g, "a"));
  EXPECT_TRUE(Recognizes(g, "bb"));
  EXPECT_FALSE(Recognizes(g, "b"));
}

void ExpectError(std::string_view text, std::string_view want) {
  absl::StatusOr<Grammar> g = ParseEbnf(text);
  ASSERT_FALSE(g.ok()) << text;
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(g.status().message()).find(want), std::string::npos) << g.status() << "\nwanted: " << want;
}

TEST(EbnfParserTest, ErrorsNameLineAndColumn) {
  ExpectError("root ::= \"a\"\nb ::= \"unterminated\n", "line 2, column 7: unterminated literal");
  ExpectError("root ::= (\"a\"", "line 1, column 14: expected ')'");
  ExpectError("root ::= \"a\" @", "line 1, column 14: unexpected character '@'");
  ExpectError("root = \"a\"", "line 1, column 6: expected '::='");
  ExpectError("root ::= [b-a]", "line 1, column 14: class range out of order");
  ExpectError("root ::= \"\\q\"", "unknown escape '\\q'");
  ExpectError("root ::= \"a\"{3,2}", "out of order");
  ExpectError("root ::= x\n", "rule 'root' at line 1, column 10: undefined rule 'x'");
  ExpectError("root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is defined twice");
  ExpectError("start ::= \"a\"", "no root rule 'root'");
  ExpectError("root ::= \"\\uD800\"", "not a Unicode scalar value");
}

TEST(EbnfParserTest, ChosenRoot) {
  absl::StatusOr<Grammar> g = ParseEbnf("start ::= \"s\" other\nother ::= \"o\"", "start");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Recognizes(*g, "so"));
}

}  // namespace
}  // namespace tandem::grammar
