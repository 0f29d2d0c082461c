// The grammar IR: lowering (UTF-8 classes, repetition) and validation.
#include "engine/grammar/grammar.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "engine/grammar/rule_table.h"
#include "engine/grammar/utf8_ranges.h"
#include "tests/unit/engine/grammar/recognize.h"

namespace tandem::grammar {
namespace {

using testing::Recognizes;

Grammar BuildOne(Expr body) {
  GrammarBuilder b;
  b.AddRule("root", std::move(body));
  absl::StatusOr<Grammar> g = std::move(b).Build("root");
  EXPECT_TRUE(g.ok()) << g.status();
  return *std::move(g);
}

std::string Utf8(uint32_t cp) {
  std::string s;
  AppendCodepointUtf8(cp, &s);
  return s;
}

bool InRanges(const std::vector<CodepointRange>& ranges, uint32_t cp) {
  for (const auto& r : ranges) {
    if (cp >= r.lo && cp <= r.hi) return true;
  }
  return false;
}

// Every code point near the edges of the ranges and of the UTF-8 length classes, plus
// random ones: matched exactly when in the class; invalid UTF-8 never matched.
TEST(GrammarTest, ClassesMatchTheUtf8OfTheirCodePoints) {
  const std::vector<std::vector<CodepointRange>> classes = {
      {{'a', 'z'}},
      {{0x7F, 0x80}},
      {{0x00, 0x10FFFF}},
      {{0x7FF, 0x800}, {0xFFFF, 0x10000}},
      {{0xE9, 0xE9}, {0x4E00, 0x9FA5}},
      {{0xD000, 0xE100}},  // spans the surrogates, which are never matched
      {{0x10000, 0x10FFFF}},
      {{0x41, 0x41}, {0x3B1, 0x3C9}, {0x1F600, 0x1F64F}},
  };
  std::mt19937 rng(7);
  for (const auto& ranges : classes) {
    for (bool negated : {false, true}) {
      if (NormalizeClass(ranges, negated).empty()) continue;  // matches nothing: an error
      const RuleTable table = RuleTable::Build(BuildOne(Expr::Class(ranges, negated)));
      std::vector<uint32_t> probes = {0, 0x7F, 0x80, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x10FFFF};
      for (const auto& r : ranges) {
        for (int64_t d = -2; d <= 2; ++d) {
          for (int64_t v : {int64_t{r.lo} + d, int64_t{r.hi} + d}) {
            if (v >= 0 && v <= 0x10FFFF) probes.push_back(static_cast<uint32_t>(v));
          }
        }
      }
      for (int i = 0; i < 300; ++i) probes.push_back(rng() % 0x110000);
      for (uint32_t cp : probes) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        const bool want = InRanges(ranges, cp) != negated;
        EXPECT_EQ(Recognizes(table, Utf8(cp)), want) << std::hex << cp << " negated " << negated;
      }
      // Surrogates encoded as 3 bytes, overlong forms, stray continuation bytes.
      for (std::string bad : {std::string("\xED\xA0\x80"), std::string("\xC0\x80"), std::string("\xE0\x80\x80"),
                              std::string("\x80"), std::string("\xF4\x90\x80\x80"), std::string("\xFF")}) {
        EXPECT_FALSE(Recognizes(table, bad));
      }
    }
  }
}

TEST(GrammarTest, RepetitionBounds) {
  const Expr a = Expr::Literal("ab");
  struct Case {
    int min, max;
  };
  for (Case c : {Case{0, -1}, Case{1, -1}, Case{0, 1}, Case{3, 3}, Case{2, 5}, Case{0, 4}, Case{4, -1}, Case{0, 0}}) {
    const RuleTable table = RuleTable::Build(BuildOne(Expr::Sequence({Expr::Literal("<"), Expr::Repeat(a, c.min, c.max),
                                                                        Expr::Literal(">")})));
    for (int n = 0; n <= 8; ++n) {
      std::string s = "<";
      for (int k = 0; k < n; ++k) s += "ab";
      s += ">";
      const bool want = n >= c.min && (c.max < 0 || n <= c.max);
      EXPECT_EQ(Recognizes(table, s), want) << c.min << "," << c.max << " n=" << n;
    }
    EXPECT_FALSE(Recognizes(table, "<a>"));
    EXPECT_FALSE(Recognizes(table, "<aba>"));
  }
}

TEST(GrammarTest, ChoicesSequencesAndReferences) {
  GrammarBuilder b;
  b.AddRule("root", Expr::Sequence({Expr::Ref("item"), Expr::Star(Expr::Sequence({Expr::Literal(","), Expr::Ref("item")}))}));
  b.AddRule("item", Expr::Choice({Expr::Literal("x"), Expr::Sequence({Expr::Literal("("), Expr::Ref("root"),
                                                                     Expr::Literal(")")})}));
  absl::StatusOr<Grammar> g = std::move(b).Build("root");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Recognizes(*g, "x"));
  EXPECT_TRUE(Recognizes(*g, "x,x,(x,(x))"));
  EXPECT_FALSE(Recognizes(*g, "x,"));
  EXPECT_FALSE(Recognizes(*g, "(x"));
  EXPECT_FALSE(Recognizes(*g, ""));
}

TEST(GrammarTest, NullableAndLeftRecursiveRules) {
  GrammarBuilder b;
  // list ::= "" | list "a" | list "b" ; opt ::= "" ; root ::= opt list opt "!"
  b.AddRule("list", Expr::Choice({Expr::Empty(), Expr::Sequence({Expr::Ref("list"), Expr::Literal("a")}),
                                  Expr::Sequence({Expr::Ref("list"), Expr::Literal("b")})}));
  b.AddRule("opt", Expr::Empty());
  b.AddRule("root", Expr::Sequence({Expr::Ref("opt"), Expr::Ref("list"), Expr::Ref("opt"), Expr::Literal("!")}));
  absl::StatusOr<Grammar> g = std::move(b).Build("root");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Recognizes(*g, "!"));
  EXPECT_TRUE(Recognizes(*g, "abba!"));
  EXPECT_FALSE(Recognizes(*g, "abc!"));
}

TEST(GrammarTest, Errors) {
  {
    GrammarBuilder b;
    b.AddRule("root", Expr::Ref("missing", SourcePos{3, 9, ""}), SourcePos{3, 1, ""});
    absl::StatusOr<Grammar> g = std::move(b).Build("root");
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find("undefined rule 'missing'"), std::string::npos) << g.status();
    EXPECT_NE(g.status().message().find("line 3, column 9"), std::string::npos) << g.status();
  }
  {
    GrammarBuilder b;
    b.AddRule("root", Expr::Literal("a"));
    b.AddRule("root", Expr::Literal("b"), SourcePos{2, 1, ""});
    absl::StatusOr<Grammar> g = std::move(b).Build("root");
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.status().message().find("defined twice"), std::string::npos) << g.status();
  }
  {
    GrammarBuilder b;
    b.AddRule("root", Expr::Literal("a"));
    absl::StatusOr<Grammar> g = std::move(b).Build("start");
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.status().message().find("no root rule 'start'"), std::string::npos) << g.status();
  }
  {  // derives no finite string
    GrammarBuilder b;
    b.AddRule("root", Expr::Choice({Expr::Literal("y"), Expr::Ref("a")}));
    b.AddRule("a", Expr::Sequence({Expr::Literal("x"), Expr::Ref("a")}), SourcePos{2, 1, ""});
    absl::StatusOr<Grammar> g = std::move(b).Build("root");
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.status().message().find("rule 'a'"), std::string::npos) << g.status();
    EXPECT_NE(g.status().message().find("derives no finite string"), std::string::npos) << g.status();
  }
  {  // empty language
    GrammarBuilder b;
    b.AddRule("root", Expr::Class({}, false));
    absl::StatusOr<Grammar> g = std::move(b).Build("root");
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.status().message().find("matches nothing"), std::string::npos) << g.status();
  }
  {  // an alternative that can never match is dropped; the rule keeps the others
    absl::StatusOr<Grammar> g = [] {
      GrammarBuilder b;
      b.AddRule("root", Expr::Choice({Expr::Literal("a"), Expr::Class({}, false)}));
      return std::move(b).Build("root");
    }();
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE(Recognizes(*g, "a"));
  }
  {  // bounds
    GrammarBuilder b;
    b.AddRule("root", Expr::Repeat(Expr::Literal("a"), 3, 2));
    EXPECT_FALSE(std::move(b).Build("root").ok());
  }
  {
    GrammarBuilder b;
    b.AddRule("root", Expr::Repeat(Expr::Literal("a"), 0, kMaxRepetition + 1));
    EXPECT_FALSE(std::move(b).Build("root").ok());
  }
}

TEST(GrammarTest, UnreachableRulesAreDroppedWithAWarning) {
  GrammarBuilder b;
  b.AddRule("root", Expr::Literal("a"));
  b.AddRule("unused", Expr::Literal("b"));
  absl::StatusOr<Grammar> g = std::move(b).Build("root");
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->warnings().size(), 1u);
  EXPECT_NE(g->warnings()[0].find("'unused' is unreachable"), std::string::npos);
  EXPECT_EQ(g->rules().size(), 1u);
}

TEST(GrammarTest, SpecializationKeepsTheLanguage) {
  // "s" is referenced from three sites: the table copies it, and the language is the same.
  GrammarBuilder b;
  b.AddRule("s", Expr::Sequence({Expr::Literal("\""), Expr::Star(Expr::Class({{'a', 'z'}}, false)), Expr::Literal("\"")}));
  b.AddRule("root", Expr::Sequence({Expr::Ref("s"), Expr::Literal(":"), Expr::Ref("s"), Expr::Literal(","), Expr::Ref("s")}));
  absl::StatusOr<Grammar> g = std::move(b).Build("root");
  ASSERT_TRUE(g.ok()) << g.status();
  const RuleTable table = RuleTable::Build(*g);
  EXPECT_EQ(table.num_copies(), 4u);  // "s" twice, then its repetition helper twice
  for (size_t r = 0; r < table.num_rules(); ++r) {
    if (r != static_cast<size_t>(table.start_rule())) {
      EXPECT_EQ(table.sites(r).size(), 1u) << table.rule_name(r);
    }
  }
  EXPECT_TRUE(Recognizes(table, "\"ab\":\"\",\"z\""));
  EXPECT_FALSE(Recognizes(table, "\"ab\":\"\",\"z"));
  RuleTableOptions none;
  none.specialization_budget = 0;
  const RuleTable shared = RuleTable::Build(*g, none);
  EXPECT_EQ(shared.num_copies(), 0u);
  EXPECT_TRUE(Recognizes(shared, "\"ab\":\"\",\"z\""));
}

}  // namespace
}  // namespace tandem::grammar
