// The matcher against brute force: at random states along random walks, the bitmask
// equals trying every token's bytes one by one; rollback restores the earlier masks
// exactly; special tokens are allowed only where a grammar names them and the end token
// only where the grammar may end. Each grammar is compiled twice: with site specialization (most tokens
// decided at compile time) and without (most left to the run time check), so both
// paths of the mask are compared with brute force.
#include "engine/grammar/grammar_matcher.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "engine/grammar/ebnf_parser.h"
#include "engine/grammar/regex_to_grammar.h"
#include "tests/unit/engine/grammar/test_grammars.h"
#include "tests/unit/engine/grammar/test_vocabulary.h"

namespace tandem::grammar {
namespace {

std::vector<uint32_t> BruteForce(GrammarMatcher& m) {
  const GrammarVocabulary& v = m.grammar().vocabulary();
  std::vector<uint32_t> mask(v.mask_words(), 0);
  for (int32_t id = 0; id < v.size(); ++id) {
    if (m.AcceptToken(id)) {
      mask[id >> 5] |= uint32_t{1} << (id & 31);
      m.Rollback(1);
    }
  }
  return mask;
}

std::vector<uint32_t> Fill(GrammarMatcher& m) {
  std::vector<uint32_t> mask(m.grammar().vocabulary().mask_words() + 1, 0xFFFFFFFFu);
  m.FillNextTokenBitmask(mask);
  EXPECT_EQ(mask.back(), 0u);  // words beyond the vocabulary are cleared
  mask.pop_back();
  return mask;
}

bool Bit(const std::vector<uint32_t>& mask, int32_t id) { return (mask[id >> 5] >> (id & 31)) & 1; }

std::string Describe(const GrammarVocabulary& v, const std::vector<uint32_t>& want, const std::vector<uint32_t>& got) {
  std::string out;
  int shown = 0;
  for (int32_t id = 0; id < v.size() && shown < 10; ++id) {
    if (Bit(want, id) != Bit(got, id)) {
      out += "token " + std::to_string(id) + " '" + v.token_bytes(id) + "': brute force " +
             (Bit(want, id) ? "allows" : "refuses") + "\n";
      ++shown;
    }
  }
  return out;
}

struct GrammarCase {
  const char* name;
  std::string ebnf;   // or
  std::string regex;
};

std::vector<GrammarCase> Cases() {
  return {
      {"json", testing::kJsonEbnf, ""},
      {"nested", "root ::= \"(\" root \")\" | \"x\" | \"[\" root (\",\" root)* \"]\"", ""},
      {"utf8", "root ::= ([\\u00e0-\\u00ff] | [\\u20ac] | [\\U0001F600-\\U0001F64F] | \"\xC3\xA9t\xC3\xA9\")+ \"!\"?", ""},
      {"literals", "root ::= \"{\\\"name\\\": \\\"\" [a-z ]{1,12} \"\\\", \\\"n\\\": \" [0-9]{1,3} \"}\"", ""},
      {"regex", "", "[a-z]+(,[0-9]{1,3})*(\\.[A-Z_]?)?"},
      // Repetitions longer than the longest token: positions beyond the horizon share
      // their precomputation (rule_table.h, compiled_grammar.cc).
      {"long_repeat", "root ::= \"<\" [a-z ]{20,45} \">\" ([0-9] | \"\\\\u00\" [0-9a-f]{2}){0,30} \"!\"", ""},
      // Left recursion through a nullable prefix and through another rule: the stack
      // machine cannot close them and the precomputation falls back to Earley walks.
      {"nullable_left_recursion", "root ::= list \"!\"\nlist ::= opt list \"a\" | \"b\"\nopt ::= \"\" | \"c\"", ""},
      {"mutual_left_recursion", "root ::= a\na ::= b \"x\" | \"y\"\nb ::= a \"z\" | \"w\"", ""},
      {"regex_alt", "", "(true|false|null|\"[^\"]*\")( (true|false|null|\"[^\"]*\"))*"},
      // Special tokens named by the grammar, beside text that could spell them.
      {"tokens", "root ::= (<｜begin▁of▁sentence｜> [a-z|<>]{1,3} | <｜▁pad▁｜> \"\\\"\" [^\"]{0,4} \"\\\"\")+ \"!\"?", ""},
  };
}

Grammar Load(const GrammarCase& c) {
  absl::StatusOr<Grammar> g = c.ebnf.empty() ? RegexToGrammar(c.regex) : ParseEbnf(c.ebnf);
  EXPECT_TRUE(g.ok()) << c.name << ": " << g.status();
  return *std::move(g);
}

class GrammarMatcherTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { vocab_ = testing::MakeTestVocabulary(1500, 600, 11); }
  static std::shared_ptr<const GrammarVocabulary> vocab_;
};
std::shared_ptr<const GrammarVocabulary> GrammarMatcherTest::vocab_;

TEST_F(GrammarMatcherTest, MaskEqualsBruteForceAlongRandomWalks) {
  for (const GrammarCase& c : Cases()) {
    const Grammar g = Load(c);
    int steps = std::string(c.name) == "long_repeat" ? 80 : 30;
    for (size_t budget : {size_t{200000}, size_t{0}}) {
      SCOPED_TRACE(std::string(c.name) + (budget ? " specialized" : " shared"));
      CompileOptions o;
      o.table.specialization_budget = budget;
      absl::StatusOr<std::shared_ptr<const CompiledGrammar>> compiled = CompiledGrammar::Compile(g, vocab_, o);
      ASSERT_TRUE(compiled.ok()) << compiled.status();
      for (uint32_t seed = 1; seed <= 4; ++seed) {
        std::mt19937 rng(seed);
        GrammarMatcher m(*compiled);
        for (int step = 0; step < steps; ++step) {
          const std::vector<uint32_t> got = Fill(m);
          const std::vector<uint32_t> want = BruteForce(m);
          ASSERT_EQ(got, want) << "step " << step << "\n" << Describe(*vocab_, want, got);
          // Special tokens only where a grammar names them.
          for (int32_t id = 0; id < vocab_->size() && g.token_names().empty(); ++id) {
            if (vocab_->is_special(id) && !vocab_->is_end_token(id)) {
              ASSERT_FALSE(Bit(got, id));
            }
          }
          ASSERT_EQ(Bit(got, vocab_->end_tokens()[0]), m.CanEnd());
          std::vector<int32_t> allowed;
          for (int32_t id = 0; id < vocab_->size(); ++id) {
            if (Bit(got, id) && !vocab_->is_end_token(id)) allowed.push_back(id);
          }
          if (allowed.empty()) break;
          ASSERT_TRUE(m.AcceptToken(allowed[rng() % allowed.size()]));
        }
      }
    }
  }
}

std::vector<uint32_t> MaskOf(const TokenSet& t, size_t words) {
  std::vector<uint32_t> m(words, 0);
  t.OrInto(m);
  return m;
}

// The stack machine walker and the Earley walker precompute the same entries.
TEST_F(GrammarMatcherTest, StackMachineAndEarleyWalksAgree) {
  std::vector<GrammarCase> cases = Cases();
  cases.push_back({"json_schema_like", R"(
root ::= "{\"a\": " s ", \"b\": [" (n (", " n){0,3})? "]" (", \"c\": " s)? "}"
s ::= "\"" ( [^"\\\x00-\x1f] | "\\" ["\\/bfnrtu] ){1,6} "\""
n ::= "-"? [0-9]{1,3}
)", ""});
  for (const GrammarCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Grammar g = Load(c);
    CompileOptions earley;
    earley.stack_walker = false;
    auto a = CompiledGrammar::Compile(g, vocab_);
    auto b = CompiledGrammar::Compile(g, vocab_, earley);
    ASSERT_TRUE(a.ok() && b.ok());
    const bool fallback = std::string(c.name).find("left_recursion") != std::string::npos;
    EXPECT_EQ((*a)->stats().stack_walker, !fallback);
    ASSERT_EQ((*a)->num_entries(), (*b)->num_entries());
    const size_t words = vocab_->mask_words();
    for (size_t i = 0; i < (*a)->num_entries(); ++i) {
      const CompiledGrammar::Entry& x = (*a)->entry_at(static_cast<int32_t>(i));
      const CompiledGrammar::Entry& y = (*b)->entry_at(static_cast<int32_t>(i));
      ASSERT_EQ(MaskOf((*a)->token_set(x.base), words), MaskOf((*b)->token_set(y.base), words)) << "entry " << i;
      const TokenSet none;
      ASSERT_EQ(MaskOf(x.extra < 0 ? none : (*a)->token_set(x.extra), words),
                MaskOf(y.extra < 0 ? none : (*b)->token_set(y.extra), words))
          << "entry " << i;
      ASSERT_EQ(x.outer, y.outer);
      ASSERT_EQ(x.uncertain.size(), y.uncertain.size()) << "entry " << i;
      for (size_t k = 0; k < x.uncertain.size(); ++k) {
        ASSERT_EQ(x.uncertain[k].token, y.uncertain[k].token);
        ASSERT_EQ(x.uncertain[k].offset, y.uncertain[k].offset);
      }
    }
  }
}

TEST_F(GrammarMatcherTest, RollbackRestoresTheEarlierMasks) {
  for (const GrammarCase& c : Cases()) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<std::shared_ptr<const CompiledGrammar>> compiled = CompiledGrammar::Compile(Load(c), vocab_);
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    std::mt19937 rng(5);
    GrammarMatcher m(*compiled);
    std::vector<std::vector<uint32_t>> masks = {Fill(m)};
    std::vector<bool> can_end = {m.CanEnd()};
    for (int step = 0; step < 120; ++step) {
      const std::vector<uint32_t>& now = masks.back();
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < vocab_->size(); ++id) {
        if (Bit(now, id)) allowed.push_back(id);
      }
      if (allowed.empty() || rng() % 5 == 0) {
        const int k = static_cast<int>(rng() % masks.size());
        m.Rollback(k);
        masks.resize(masks.size() - k);
        can_end.resize(can_end.size() - k);
        ASSERT_EQ(Fill(m), masks.back()) << "after rolling back " << k;
        ASSERT_EQ(m.CanEnd(), can_end.back());
        continue;
      }
      const int32_t t = allowed[rng() % allowed.size()];
      ASSERT_TRUE(m.AcceptToken(t));
      ASSERT_EQ(m.IsTerminated(), vocab_->is_end_token(t));
      masks.push_back(Fill(m));
      can_end.push_back(m.CanEnd());
      if (m.IsTerminated()) {
        EXPECT_EQ(masks.back(), std::vector<uint32_t>(vocab_->mask_words(), 0));
      }
    }
  }
}

TEST_F(GrammarMatcherTest, RefusesWhatTheGrammarRefuses) {
  absl::StatusOr<Grammar> g = ParseEbnf("root ::= \"ab\" \"c\"?");
  ASSERT_TRUE(g.ok());
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> compiled = CompiledGrammar::Compile(*g, vocab_);
  ASSERT_TRUE(compiled.ok());
  GrammarMatcher m(*compiled);
  const int32_t eos = vocab_->end_tokens()[0];
  EXPECT_FALSE(m.AcceptToken(eos));
  EXPECT_FALSE(m.AcceptBytes("ac"));
  EXPECT_EQ(m.num_tokens(), 0);
  EXPECT_TRUE(m.AcceptBytes("a"));
  EXPECT_FALSE(m.CanEnd());
  EXPECT_TRUE(m.AcceptBytes("b"));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_TRUE(m.AcceptToken(eos));
  EXPECT_TRUE(m.IsTerminated());
  EXPECT_FALSE(m.AcceptBytes("c"));
  m.Rollback(1);
  EXPECT_FALSE(m.IsTerminated());
  EXPECT_TRUE(m.AcceptBytes("c"));
  EXPECT_FALSE(m.AcceptBytes("c"));
  EXPECT_EQ(m.num_tokens(), 3);
}

TEST_F(GrammarMatcherTest, ExpiredDeadlineFailsCompilation) {
  absl::StatusOr<Grammar> g = ParseEbnf(Cases()[0].ebnf);
  ASSERT_TRUE(g.ok());
  CompileOptions o;
  o.deadline = absl::InfinitePast();
  // The deadline is checked every few thousand bytes pushed: use a vocabulary large
  // enough for the first walk to reach a check.
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> compiled =
      CompiledGrammar::Compile(*g, testing::MakeTestVocabulary(6000, 3000, 3), o);
  ASSERT_FALSE(compiled.ok());
  EXPECT_EQ(compiled.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(compiled.status().message()).find("longer to compile than its limit"), std::string::npos)
      << compiled.status();
}

}  // namespace
}  // namespace tandem::grammar
