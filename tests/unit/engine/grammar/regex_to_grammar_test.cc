// The regex front end: hand-written cases and refusals. (regex_reference_test.cc checks
// it against Python's re.fullmatch on generated cases.)
#include "engine/grammar/regex_to_grammar.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/unit/engine/grammar/recognize.h"

namespace tandem::grammar {
namespace {

using testing::Recognizes;

bool Full(std::string_view pattern, std::string_view s, RegexOptions o = {}) {
  absl::StatusOr<Grammar> g = RegexToGrammar(pattern, o);
  EXPECT_TRUE(g.ok()) << pattern << ": " << g.status();
  return g.ok() && Recognizes(*g, s);
}

TEST(RegexToGrammarTest, Basics) {
  EXPECT_TRUE(Full("abc", "abc"));
  EXPECT_FALSE(Full("abc", "abcd"));
  EXPECT_TRUE(Full("^a(b|cd)*e$", "acdbbe"));
  EXPECT_TRUE(Full("(?:ab)+?", "abab"));
  EXPECT_TRUE(Full("(?P<year>\\d{4})-(?<m>\\d{2})", "2024-01"));
  EXPECT_TRUE(Full("\\w+\\s\\W", "a_1 !"));
  EXPECT_FALSE(Full("\\w+", "\xC3\xA9"));  // re.ASCII
  EXPECT_TRUE(Full("[^a-c]", "\xC3\xA9"));
  EXPECT_TRUE(Full(".", "\xF0\x9F\x98\x80"));
  EXPECT_FALSE(Full(".", "\n"));
  EXPECT_TRUE(Full("a{2,3}", "aaa"));
  EXPECT_FALSE(Full("a{2,3}", "aaaa"));
  EXPECT_TRUE(Full("a{,2}", ""));
  EXPECT_TRUE(Full("a{x}", "a{x}"));
  EXPECT_TRUE(Full("[]a]", "]"));
  EXPECT_TRUE(Full("[\\]\\-]", "-"));
  EXPECT_TRUE(Full("\\x41\\u00e9\\U0001F600\\.\\*", "A\xC3\xA9\xF0\x9F\x98\x80.*"));
  EXPECT_TRUE(Full("[\\d\\s]+", "1 2\t3"));
  EXPECT_TRUE(Full("[\\D]", "x"));
  EXPECT_TRUE(Full("a|", ""));
  EXPECT_TRUE(Full("", ""));
}

TEST(RegexToGrammarTest, EcmaScriptSearchSemantics) {
  RegexOptions o;
  o.dialect = RegexDialect::kEcmaScript;
  o.search = true;
  EXPECT_TRUE(Full("b+", "abbbc", o));
  EXPECT_FALSE(Full("^b+", "abbb", o));
  EXPECT_TRUE(Full("^b+", "bbbc", o));
  EXPECT_FALSE(Full("^b+$", "bbbc", o));
  EXPECT_TRUE(Full("^\\s$", "\xC2\xA0", o));  // U+00A0 is ECMA white space
  EXPECT_FALSE(Full("^.$", "\r", o));
  // Matches nothing, even searched: a grammar error.
  absl::StatusOr<Grammar> nothing = RegexToGrammar("[]", o);
  ASSERT_FALSE(nothing.ok());
  EXPECT_NE(std::string(nothing.status().message()).find("matches nothing"), std::string::npos);
}

void ExpectRefused(std::string_view pattern, std::string_view want) {
  absl::StatusOr<Grammar> g = RegexToGrammar(pattern);
  ASSERT_FALSE(g.ok()) << pattern;
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(g.status().message()).find(want), std::string::npos) << g.status();
}

TEST(RegexToGrammarTest, RefusesWhatItDoesNotSupport) {
  ExpectRefused("(a)\\1", "a backreference");
  ExpectRefused("a(?=b)", "lookahead");
  ExpectRefused("a(?!b)", "lookahead");
  ExpectRefused("(?<=a)b", "lookbehind");
  ExpectRefused("(?<!a)b", "lookbehind");
  ExpectRefused("(?i)a", "inline flag");
  ExpectRefused("\\bword", "word boundary");
  ExpectRefused("a^b", "'^' anywhere but at the start");
  ExpectRefused("a$b", "'$' anywhere but at the end");
  ExpectRefused("\\p{L}", "Unicode property");
  ExpectRefused("a*+", "possessive");
  ExpectRefused("(?P<n>a)(?P=n)", "backreference");
  ExpectRefused("a**", "multiple repeat");
  ExpectRefused("*a", "nothing to repeat");
  ExpectRefused("(a", "missing ')'");
  ExpectRefused("a)", "unbalanced ')'");
  ExpectRefused("[a", "unterminated character set");
  ExpectRefused("[z-a]", "bad character range");
}

}  // namespace
}  // namespace tandem::grammar
