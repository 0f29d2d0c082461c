// The JSON schema front end: the corpus' hand-written valid examples are accepted, the
// exact parts (integer and number ranges, dates) agree with arithmetic over exhaustive
// ranges, and unsupported keywords are refused by name. (json_schema_reference_test.cc
// checks generated documents with Ajv.)
#include "engine/grammar/json_schema_to_grammar.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "tests/unit/engine/grammar/recognize.h"

namespace tandem::grammar {
namespace {

using testing::Recognizes;
using Json = nlohmann::ordered_json;

Json LoadCorpus() {
  const char* src = std::getenv("TANDEM_SOURCE_DIR");
  std::ifstream f(std::string(src ? src : ".") + "/tests/goldens/json_schemas/corpus.json");
  std::stringstream ss;
  ss << f.rdbuf();
  return Json::parse(ss.str());
}

JsonSchemaOptions OptionsOf(const Json& entry) {
  JsonSchemaOptions o;
  if (entry.value("whitespace", "python") == "compact") o.whitespace = JsonSchemaOptions::Whitespace::kCompact;
  o.strict = entry.value("strict", false);
  return o;
}

TEST(JsonSchemaToGrammarTest, CorpusExamplesAreAccepted) {
  const Json corpus = LoadCorpus();
  ASSERT_GE(corpus["schemas"].size(), 50u);
  for (const Json& entry : corpus["schemas"]) {
    SCOPED_TRACE(entry["name"].get<std::string>());
    absl::StatusOr<Grammar> g = JsonSchemaToGrammar(entry["schema"], OptionsOf(entry));
    ASSERT_TRUE(g.ok()) << g.status();
    const RuleTable table = RuleTable::Build(*g);
    if (!entry.contains("valid")) continue;
    for (const Json& v : entry["valid"]) EXPECT_TRUE(Recognizes(table, v.get<std::string>())) << v.get<std::string>();
  }
}

bool AcceptsInteger(const RuleTable& t, const std::string& s) { return Recognizes(t, s); }

TEST(JsonSchemaToGrammarTest, IntegerRangesAreExact) {
  struct Case {
    Json schema;
    int64_t lo, hi;  // inclusive; INT64 limits for none
  };
  const int64_t kNone = INT64_MAX;
  const std::vector<Case> cases = {
      {{{"type", "integer"}, {"minimum", -5}, {"maximum", 17}}, -5, 17},
      {{{"type", "integer"}, {"minimum", 0}, {"maximum", 0}}, 0, 0},
      {{{"type", "integer"}, {"exclusiveMinimum", 9}, {"exclusiveMaximum", 101}}, 10, 100},
      {{{"type", "integer"}, {"minimum", -1234}, {"maximum", -987}}, -1234, -987},
      {{{"type", "integer"}, {"minimum", 95}}, 95, kNone},
      {{{"type", "integer"}, {"maximum", -95}}, -kNone, -95},
      {{{"type", "integer"}, {"minimum", 1.5}, {"maximum", 20.5}}, 2, 20},
      {{{"type", "integer"}, {"minimum", 199}, {"maximum", 2001}}, 199, 2001},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.schema.dump());
    absl::StatusOr<Grammar> g = JsonSchemaToGrammar(c.schema);
    ASSERT_TRUE(g.ok()) << g.status();
    const RuleTable table = RuleTable::Build(*g);
    const int64_t from = c.lo == -kNone ? c.hi - 3000 : c.lo - 1500;
    const int64_t to = c.hi == kNone ? c.lo + 3000 : c.hi + 1500;
    for (int64_t v = from; v <= to; ++v) {
      const bool want = v >= c.lo && v <= c.hi;
      ASSERT_EQ(AcceptsInteger(table, std::to_string(v)), want) << v;
    }
    EXPECT_FALSE(Recognizes(table, "-0"));
    EXPECT_FALSE(Recognizes(table, "01"));
    EXPECT_FALSE(Recognizes(table, "1.0"));
  }
}

TEST(JsonSchemaToGrammarTest, NumberRangesAreExactForIntegerBounds) {
  struct Case {
    Json schema;
    double lo, hi;
    bool lo_excl, hi_excl;
  };
  const double inf = INFINITY;
  const std::vector<Case> cases = {
      {{{"type", "number"}, {"minimum", 0}, {"maximum", 100}}, 0, 100, false, false},
      {{{"type", "number"}, {"exclusiveMinimum", -1}, {"exclusiveMaximum", 1}}, -1, 1, true, true},
      {{{"type", "number"}, {"minimum", -10}, {"exclusiveMaximum", -2}}, -10, -2, false, true},
      {{{"type", "number"}, {"exclusiveMinimum", 0}}, 0, inf, true, false},
      {{{"type", "number"}, {"maximum", 3}}, -inf, 3, false, false},
      {{{"type", "number"}, {"exclusiveMinimum", 5}, {"maximum", 5}}, 5, 5, true, false},  // empty
      {{{"type", "number"}, {"minimum", 7}, {"maximum", 7}}, 7, 7, false, false},
  };
  std::mt19937 rng(3);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.schema.dump());
    absl::StatusOr<Grammar> g = JsonSchemaToGrammar(c.schema);
    if (c.lo == c.hi && c.lo_excl) {
      EXPECT_FALSE(g.ok());  // accepts nothing
      continue;
    }
    ASSERT_TRUE(g.ok()) << g.status();
    const RuleTable table = RuleTable::Build(*g);
    for (int i = 0; i < 4000; ++i) {
      const int ip = static_cast<int>(rng() % 130);
      const int frac_digits = static_cast<int>(rng() % 4);
      std::string text = (rng() % 2 ? "-" : "") + std::to_string(ip);
      if (frac_digits > 0) {
        text += ".";
        for (int k = 0; k < frac_digits; ++k) text += static_cast<char>('0' + (rng() % 3 == 0 ? 0 : rng() % 10));
      }
      const double v = std::strtod(text.c_str(), nullptr);
      const bool negative_zero = text[0] == '-' && v == 0;
      bool want = (c.lo_excl ? v > c.lo : v >= c.lo) && (c.hi_excl ? v < c.hi : v <= c.hi);
      if (negative_zero) want = false;  // "-0" and "-0.0" are never written
      ASSERT_EQ(Recognizes(table, text), want) << text;
    }
    EXPECT_FALSE(Recognizes(table, "1e2"));  // no exponent when bounded
  }
}

bool IsLeap(int y) { return y % 4 == 0 && (y % 100 != 0 || y % 400 == 0); }

TEST(JsonSchemaToGrammarTest, DatesAreExact) {
  absl::StatusOr<Grammar> g = JsonSchemaToGrammar(Json{{"type", "string"}, {"format", "date"}});
  ASSERT_TRUE(g.ok()) << g.status();
  const RuleTable table = RuleTable::Build(*g);
  const int days[] = {0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  for (int y : {0, 1, 4, 100, 400, 1900, 1996, 1999, 2000, 2023, 2024, 2100, 2400, 9996, 9999}) {
    for (int m = 0; m <= 13; ++m) {
      for (int d = 0; d <= 32; ++d) {
        const bool want = m >= 1 && m <= 12 && d >= 1 && d <= (m == 2 && IsLeap(y) ? 29 : days[m]);
        const std::string s = absl::StrFormat("\"%04d-%02d-%02d\"", y, m, d);
        ASSERT_EQ(Recognizes(table, s), want) << s;
      }
    }
  }
}

void ExpectRefused(const Json& schema, std::string_view want) {
  absl::StatusOr<Grammar> g = JsonSchemaToGrammar(schema);
  ASSERT_FALSE(g.ok()) << schema.dump();
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(g.status().message()).find(want), std::string::npos) << g.status() << "\nwanted: " << want;
}

TEST(JsonSchemaToGrammarTest, UnsupportedKeywordsAreRefusedByName) {
  for (const char* k : {"multipleOf", "patternProperties", "allOf", "not", "if", "uniqueItems", "contains",
                        "minProperties", "maxProperties", "dependentRequired", "propertyNames", "$anchor",
                        "unevaluatedProperties", "additionalItems", "dependencies"}) {
    ExpectRefused(Json{{"type", "object"}, {k, Json::object()}}, std::string("unsupported keyword '") + k + "'");
  }
  ExpectRefused(Json::parse(R"({"type":"object","properties":{"a":{"type":"integer","multipleOf":2}}})"),
                "at #/properties/a: unsupported keyword 'multipleOf'");
  ExpectRefused(Json{{"$ref", "https://example.com/s.json"}}, "only references within the document");
  ExpectRefused(Json{{"$ref", "#/$defs/missing"}}, "does not resolve");
  ExpectRefused(Json{{"type", "array"}, {"items", Json::array({Json::object()})}}, "'items' as an array");
  ExpectRefused(Json{{"type", "number"}, {"minimum", 0}, {"exclusiveMinimum", true}}, "boolean 'exclusiveMinimum'");
  ExpectRefused(Json{{"type", "string"}, {"pattern", "a"}, {"maxLength", 3}}, "'pattern' together with");
  ExpectRefused(Json{{"type", "string"}, {"format", "hostname"}}, "unsupported format 'hostname'");
  ExpectRefused(Json{{"type", "string"}, {"pattern", "(a)\\1"}}, "backreference");
  ExpectRefused(Json{{"type", "strin"}}, "is not a JSON Schema type");
  ExpectRefused(Json{{"enum", Json::array({1})}, {"minimum", 0}}, "'enum'/'const' together with 'minimum'");
  ExpectRefused(Json{{"$ref", "#/$defs/a"}, {"type", "string"}, {"$defs", {{"a", Json::object()}}}},
                "'$ref' together with 'type'");
  ExpectRefused(Json{{"type", "object"}, {"required", {"x"}}, {"additionalProperties", false}},
                "required property 'x' is not in 'properties'");
  ExpectRefused(Json{{"type", "array"}, {"minItems", 3}, {"maxItems", 2}}, "accepts no value");
  ExpectRefused(Json(false), "accepts no value");
  absl::StatusOr<Grammar> bad = JsonSchemaToGrammar(std::string_view("{\"type\": "));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("not valid JSON"), std::string::npos);
}

TEST(JsonSchemaToGrammarTest, OverlappingOneOfIsAnyOfOrRefused) {
  const Json schema = Json::parse(R"({"oneOf":[{"type":"integer"},{"type":"number","minimum":0}]})");
  absl::StatusOr<Grammar> g = JsonSchemaToGrammar(schema);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Recognizes(*g, "5"));  // matches both branches: accepted (documented over-approximation)
  JsonSchemaOptions o;
  o.refuse_overlapping_one_of = true;
  EXPECT_FALSE(JsonSchemaToGrammar(schema, o).ok());
  // Disjoint by type or by a discriminating const: accepted in either mode.
  EXPECT_TRUE(JsonSchemaToGrammar(Json::parse(R"({"oneOf":[{"type":"integer"},{"type":"string"}]})"), o).ok());
  EXPECT_TRUE(JsonSchemaToGrammar(Json::parse(R"({"oneOf":[
      {"type":"object","properties":{"t":{"const":1}},"required":["t"]},
      {"type":"object","properties":{"t":{"enum":[2,3]}},"required":["t"]}]})"), o).ok());
}

TEST(JsonSchemaToGrammarTest, WhitespaceStyles) {
  const Json schema = Json::parse(R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}}},
                                      "required":["a"],"additionalProperties":false})");
  absl::StatusOr<Grammar> python = JsonSchemaToGrammar(schema);
  JsonSchemaOptions o;
  o.whitespace = JsonSchemaOptions::Whitespace::kCompact;
  absl::StatusOr<Grammar> compact = JsonSchemaToGrammar(schema, o);
  ASSERT_TRUE(python.ok() && compact.ok());
  EXPECT_TRUE(Recognizes(*python, "{\"a\": [1, 2]}"));
  EXPECT_FALSE(Recognizes(*python, "{\"a\":[1,2]}"));
  EXPECT_TRUE(Recognizes(*compact, "{\"a\":[1,2]}"));
  EXPECT_FALSE(Recognizes(*compact, "{\"a\": [1, 2]}"));
}

TEST(JsonSchemaToGrammarTest, AdditionalPropertyNamesExcludeListedOnes) {
  const Json schema = Json::parse(R"({"type":"object","properties":{"ab":{"type":"integer"},"a":{"type":"integer"}},
                                      "additionalProperties":{"type":"string"}})");
  absl::StatusOr<Grammar> g = JsonSchemaToGrammar(schema);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Recognizes(*g, R"({"ab": 1, "a": 2, "abc": "x", "b": "y", "": "z"})"));
  EXPECT_FALSE(Recognizes(*g, R"({"ab": 1, "a": "x"})"));
  EXPECT_FALSE(Recognizes(*g, R"({"a": 2, "ab": "x"})"));
  EXPECT_FALSE(Recognizes(*g, R"({"ab": "x"})"));
}

TEST(JsonObjectGrammarTest, AnyObject) {
  const Grammar g = JsonObjectGrammar();
  EXPECT_TRUE(Recognizes(g, R"({"a": [1, {"b": null}, "\u00e9"], "c": -1.5e3})"));
  EXPECT_TRUE(Recognizes(g, "{}"));
  EXPECT_FALSE(Recognizes(g, "[]"));
  EXPECT_FALSE(Recognizes(g, "{\"a\": 1,}"));
}

}  // namespace
}  // namespace tandem::grammar
