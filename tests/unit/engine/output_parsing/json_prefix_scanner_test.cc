// JsonPrefixScanner against nlohmann::json (the reference): a document the scanner reads
// to completion is exactly one nlohmann::json accepts, every prefix of a valid document
// is still viable, and an invalid one fails.
#include "engine/output_parsing/json_prefix_scanner.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace tandem::output_parsing {
namespace {

// Feeds all of `text`; returns how many bytes were accepted.
size_t Scan(JsonPrefixScanner& scanner, const std::string& text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (!scanner.Feed(text[i])) return i;
  }
  return text.size();
}

// What the scanner says of a whole document: accepted with a complete value. Bare
// numbers are never complete by design (their end is the byte after them), so the
// reference is asked about them with a trailing space, as the scanner sees them.
bool ScannerAccepts(const std::string& text) {
  JsonPrefixScanner scanner;
  return Scan(scanner, text) == text.size() && (scanner.complete() || [&] {
           JsonPrefixScanner padded;
           return Scan(padded, text + " ") == text.size() + 1 && padded.complete();
         }());
}

const std::vector<std::string>& Documents() {
  static const std::vector<std::string> docs = {
      "{}", "[]", "{\"a\": 1}", " { \"a\" : [ 1 , 2.5 , -3e+2 , 0 , 0.0e0 ] } ", "\"x\"", "true", "false", "null",
      "{\"k\": {\"n\": [true, false, null, {}, []]}}", "\"\\u00e9\\n\\t\\\"\\\\\\/\\b\\f\\r\"",
      "{\"東京\": \"晴れ 🌤\"}", "[\"<｜tool▁call▁end｜>\", \"```\"]", "-0", "12", "1.5E-7", "[1e5]",
      // invalid
      "{", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "[1,]", "[,1]", "{,}", "{'a': 1}", "{a: 1}", "01", "-", "1.", ".5",
      "1e", "1e+", "+1", "tru", "nul", "truex", "[1 2]", "{\"a\":1 \"b\":2}", "\"\\x\"", "\"\\u12g4\"",
      "\"a\nb\"", "\"tab\there\"", "{}}", "[]]", "{} {}", "[1] x", "\"unterminated", "NaN", "[--1]", "{\"a\":1]",
      "[1}", "",
  };
  return docs;
}

TEST(JsonPrefixScannerTest, AcceptsExactlyWhatNlohmannAccepts) {
  for (const std::string& doc : Documents()) {
    EXPECT_EQ(ScannerAccepts(doc), nlohmann::json::accept(doc)) << doc;
  }
}

TEST(JsonPrefixScannerTest, EveryPrefixOfAValidDocumentIsViable) {
  for (const std::string& doc : Documents()) {
    if (!nlohmann::json::accept(doc)) continue;
    for (size_t n = 0; n <= doc.size(); ++n) {
      JsonPrefixScanner scanner;
      EXPECT_EQ(Scan(scanner, doc.substr(0, n)), n) << doc << " prefix " << n;
      EXPECT_FALSE(scanner.failed()) << doc << " prefix " << n << ": " << scanner.error();
    }
  }
}

TEST(JsonPrefixScannerTest, FailsAtTheFirstBadByteWithAReason) {
  struct Case {
    std::string text;
    size_t accepted;  // bytes accepted before the failure
  };
  const Case cases[] = {
      {"{\"a\": 1,,}", 8}, {"{\"tz\": Europe}", 7}, {"[1, 2]x", 6}, {"{} ", 3}, {"{\"a\":tx", 6}, {"01", 1},
  };
  for (const Case& c : cases) {
    JsonPrefixScanner scanner;
    EXPECT_EQ(Scan(scanner, c.text), c.accepted) << c.text;
    if (c.accepted < c.text.size()) {
      EXPECT_TRUE(scanner.failed()) << c.text;
      EXPECT_FALSE(scanner.error().empty()) << c.text;
      EXPECT_FALSE(scanner.Feed(' ')) << "stays failed";
    }
  }
}

TEST(JsonPrefixScannerTest, ReportsStartCompletionAndFirstByte) {
  JsonPrefixScanner scanner;
  EXPECT_FALSE(scanner.started());
  Scan(scanner, " \n");
  EXPECT_FALSE(scanner.started());
  Scan(scanner, "{\"a\": [1]");
  EXPECT_TRUE(scanner.started());
  EXPECT_EQ(scanner.first_byte(), '{');
  EXPECT_FALSE(scanner.complete());
  Scan(scanner, "}");
  EXPECT_TRUE(scanner.complete());
  EXPECT_TRUE(scanner.Feed('\n'));  // whitespace after the value is fine
  EXPECT_FALSE(scanner.Feed('x'));
}

}  // namespace
}  // namespace tandem::output_parsing
