// Token terminals: a grammar names a special or added token (DeepSeek's tool-call
// markers are added tokens that are not special); the matcher allows that token exactly
// there, and text, whether the grammar's or spelled out by ordinary tokens, never
// produces it.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "engine/grammar/compiled_grammar.h"
#include "engine/grammar/ebnf_parser.h"
#include "engine/grammar/grammar_compiler.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/grammar/vocabulary.h"
#include "engine/tokenizer/byte_level_tokenizer_builder.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/grammar/recognize.h"

namespace tandem::grammar {
namespace {

using testing::Recognizes;

constexpr char kSep[] = "<｜tool▁sep｜>";
constexpr char kBegin[] = "<｜tool▁calls▁begin｜>";

// Ids: 0 EOS (end token), 1 kSep and 2 kBegin (special), 3 "[INST]" (special), then text
// pieces that spell both markers and more, and single bytes 0xFE and 0xFF.
struct Vocab {
  std::shared_ptr<const GrammarVocabulary> v;
  int32_t eos = 0, sep = 1, begin = 2, inst = 3;
};

Vocab MakeVocab() {
  std::vector<std::string> bytes = {"</s>", kSep, kBegin, "[INST]"};
  std::vector<char> special = {1, 1, 1, 1};
  for (const char* t : {"<", "｜", "tool", "▁", "sep", ">", "<｜", "｜>", "calls", "begin", "x", "y", "{", "}", "\"",
                        "a", "[", "]", "INST", "\xFF", "\xFE", " ", "<｜tool▁sep｜>x"}) {
    bytes.push_back(t);
    special.push_back(0);
  }
  return {GrammarVocabulary::FromTokens(std::move(bytes), std::move(special), {0})};
}

int32_t IdOf(const GrammarVocabulary& v, std::string_view text) {
  for (int32_t id = 0; id < v.size(); ++id) {
    if (!v.is_special(id) && v.token_bytes(id) == text) return id;
  }
  ADD_FAILURE() << "no token " << text;
  return -1;
}

std::vector<int32_t> Allowed(GrammarMatcher& m) {
  std::vector<uint32_t> mask(m.grammar().vocabulary().mask_words(), 0);
  m.FillNextTokenBitmask(mask);
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < m.grammar().vocabulary().size(); ++id) {
    if ((mask[id >> 5] >> (id & 31)) & 1) ids.push_back(id);
  }
  // The mask is what accepting each token one by one says.
  std::vector<int32_t> brute;
  for (int32_t id = 0; id < m.grammar().vocabulary().size(); ++id) {
    if (m.AcceptToken(id)) {
      brute.push_back(id);
      m.Rollback(1);
    }
  }
  EXPECT_EQ(ids, brute);
  return ids;
}

std::shared_ptr<const CompiledGrammar> Compile(std::string_view ebnf, const Vocab& vocab) {
  absl::StatusOr<Grammar> g = ParseEbnf(ebnf);
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return nullptr;
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> c = CompiledGrammar::Compile(*g, vocab.v);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : nullptr;
}

TEST(SpecialTokenTest, EbnfNamesTokensByContent) {
  absl::StatusOr<Grammar> g = ParseEbnf(R"(root ::= "a" <｜tool▁sep｜> @"[INST]" <｜tool▁sep｜>?)");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->token_names(), (std::vector<std::string>{"<｜tool▁sep｜>", "[INST]"}));
  EXPECT_TRUE(Recognizes(*g, "a" + TokenMarker(kSep) + TokenMarker("[INST]")));
  EXPECT_TRUE(Recognizes(*g, "a" + TokenMarker(kSep) + TokenMarker("[INST]") + TokenMarker(kSep)));
  // The tokens' text is not the tokens.
  EXPECT_FALSE(Recognizes(*g, std::string("a") + kSep + "[INST]"));
  EXPECT_FALSE(Recognizes(*g, "a" + TokenMarker("[INST]") + TokenMarker(kSep)));

  // Unused rules' tokens are not required of the vocabulary.
  absl::StatusOr<Grammar> unused = ParseEbnf("root ::= \"a\"\nother ::= <｜x｜>");
  ASSERT_TRUE(unused.ok()) << unused.status();
  EXPECT_TRUE(unused->token_names().empty());

  for (const char* bad : {"root ::= <>", "root ::= <a b>", "root ::= <a", "root ::= @\"\"", "root ::= <\"a\">"}) {
    absl::StatusOr<Grammar> e = ParseEbnf(bad);
    EXPECT_FALSE(e.ok()) << bad;
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// <[N]>: the token of id N, resolved through the vocabulary (GrammarCompiler's resolver)
// to the content a grammar names it by: the same grammar as naming it by content. Text
// tokens, ids outside the vocabulary, end tokens and malformed ids are refused, each
// saying why; without a vocabulary ids are refused.
TEST(SpecialTokenTest, EbnfNamesTokensById) {
  const Vocab vocab = MakeVocab();
  const GrammarVocabulary& v = *vocab.v;
  EXPECT_EQ(v.SpecialTokenName(vocab.sep), std::string(kSep));
  EXPECT_EQ(v.SpecialTokenName(vocab.inst), std::string("[INST]"));
  EXPECT_EQ(v.SpecialTokenName(vocab.eos), std::string("</s>")) << "end tokens are named (to be refused by name)";
  EXPECT_EQ(v.SpecialTokenName(IdOf(v, "tool")), std::nullopt);
  EXPECT_EQ(v.SpecialTokenName(v.size()), std::nullopt);

  GrammarCompiler compiler(vocab.v);
  const absl::Time later = absl::Now() + absl::Seconds(30);
  const std::string by_id = "root ::= \"x\" <[" + std::to_string(vocab.sep) + "]> <[" + std::to_string(vocab.inst) +
                            "]>? \"y\"";
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> g = compiler.CompileEbnf(by_id, "root", later);
  ASSERT_TRUE(g.ok()) << g.status();
  GrammarMatcher m(*g);
  ASSERT_TRUE(m.AcceptToken(IdOf(v, "x")));
  EXPECT_EQ(Allowed(m), std::vector<int32_t>{vocab.sep});
  ASSERT_TRUE(m.AcceptToken(vocab.sep));
  EXPECT_EQ(Allowed(m), (std::vector<int32_t>{vocab.inst, IdOf(v, "y")}));
  // The same as by content.
  absl::StatusOr<Grammar> parsed = ParseEbnf(by_id, "root", {.token_by_id = [&](int64_t id) {
                                               return absl::StatusOr<std::string>(*v.SpecialTokenName(id));
                                             }});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->token_names(), (std::vector<std::string>{"<｜tool▁sep｜>", "[INST]"}));

  const std::vector<std::pair<std::string, std::string>> refused = {
      {"root ::= <[" + std::to_string(IdOf(v, "tool")) + "]>", "is a text token"},
      {"root ::= <[" + std::to_string(v.size()) + "]>", "outside the vocabulary"},
      {"root ::= <[99999999999]>", "more than 10 digits"},
      {"root ::= <[0]>", "ends generation"},
      {"root ::= <[]>", "expected a token id"},
      {"root ::= <[1x]>", "expected a token id"},
      {"root ::= <[1]", "expected a token id"},
  };
  for (const auto& [text, why] : refused) {
    absl::StatusOr<std::shared_ptr<const CompiledGrammar>> e = compiler.CompileEbnf(text, "root", later);
    ASSERT_FALSE(e.ok()) << text;
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(std::string(e.status().message()).find(why), std::string::npos) << text << ": " << e.status();
  }
  absl::StatusOr<Grammar> no_vocab = ParseEbnf("root ::= <[1]>");
  ASSERT_FALSE(no_vocab.ok());
  EXPECT_NE(std::string(no_vocab.status().message()).find("need the model's vocabulary"), std::string::npos);
}

TEST(SpecialTokenTest, MarkerBytesAreOnlyForTokens) {
  GrammarBuilder b;
  b.AddRule("root", Expr::Literal("a\xFF"));
  absl::StatusOr<Grammar> g = std::move(b).Build("root");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(std::string(g.status().message()).find("0xFE or 0xFF"), std::string::npos) << g.status();
  GrammarBuilder empty;
  empty.AddRule("root", Expr::Token(""));
  EXPECT_FALSE(std::move(empty).Build("root").ok());
}

TEST(SpecialTokenTest, TheVocabularyGivesMarkersOnlyToSpecialTokens) {
  const Vocab vocab = MakeVocab();
  const GrammarVocabulary& v = *vocab.v;
  EXPECT_EQ(v.SpecialTokenId(kSep), vocab.sep);
  EXPECT_EQ(v.SpecialTokenId("[INST]"), vocab.inst);
  EXPECT_EQ(v.SpecialTokenId("tool"), std::nullopt) << "text tokens are not named";
  EXPECT_EQ(v.token_bytes(vocab.sep), TokenMarker(kSep));
  EXPECT_TRUE(v.matchable(vocab.sep));
  EXPECT_FALSE(v.matchable(vocab.eos));
  EXPECT_FALSE(v.matchable(IdOf(v, "\xFF"))) << "text could spell a marker";
  EXPECT_FALSE(v.matchable(IdOf(v, "\xFE")));
  EXPECT_TRUE(v.matchable(IdOf(v, "tool")));
}

TEST(SpecialTokenTest, TheMatcherAllowsATokenExactlyWhereItIsNamed) {
  const Vocab vocab = MakeVocab();
  const GrammarVocabulary& v = *vocab.v;
  std::shared_ptr<const CompiledGrammar> g = Compile("root ::= \"x\" <｜tool▁sep｜> \"y\"", vocab);
  ASSERT_NE(g, nullptr);
  GrammarMatcher m(g);
  EXPECT_EQ(Allowed(m), std::vector<int32_t>{IdOf(v, "x")});
  ASSERT_TRUE(m.AcceptToken(IdOf(v, "x")));
  // Only the token: not its text, whole or in pieces, nor a token holding its text.
  EXPECT_EQ(Allowed(m), std::vector<int32_t>{vocab.sep});
  EXPECT_FALSE(m.AcceptToken(IdOf(v, "<｜")));
  EXPECT_FALSE(m.AcceptToken(IdOf(v, "\xFF")));
  EXPECT_FALSE(m.AcceptBytes(kSep));
  ASSERT_TRUE(m.AcceptToken(vocab.sep));
  EXPECT_EQ(Allowed(m), std::vector<int32_t>{IdOf(v, "y")});
  ASSERT_TRUE(m.AcceptToken(IdOf(v, "y")));
  EXPECT_EQ(Allowed(m), std::vector<int32_t>{vocab.eos});
  // Rolled back over the token, the same masks again.
  m.Rollback(2);
  EXPECT_EQ(Allowed(m), std::vector<int32_t>{vocab.sep});

  // The same text as a literal is text: spelled by ordinary tokens, never the token.
  std::shared_ptr<const CompiledGrammar> text = Compile("root ::= \"x\" \"<｜tool▁sep｜>\" \"y\"", vocab);
  ASSERT_NE(text, nullptr);
  GrammarMatcher t(text);
  ASSERT_TRUE(t.AcceptToken(IdOf(v, "x")));
  const std::vector<int32_t> allowed = Allowed(t);
  EXPECT_EQ(std::count(allowed.begin(), allowed.end(), vocab.sep), 0);
  EXPECT_EQ(std::count(allowed.begin(), allowed.end(), IdOf(v, "<")), 1);
  EXPECT_EQ(std::count(allowed.begin(), allowed.end(), IdOf(v, "<｜tool▁sep｜>x")), 0) << "ends past the grammar";
  for (const char* piece : {"<｜", "tool", "▁", "sep", "｜>"}) ASSERT_TRUE(t.AcceptToken(IdOf(v, piece))) << piece;
  EXPECT_EQ(Allowed(t), std::vector<int32_t>{IdOf(v, "y")});
}

TEST(SpecialTokenTest, TextNeverProducesATokenAlongRandomWalks) {
  const Vocab vocab = MakeVocab();
  // Strings of any text, then the named tokens: the marker's first byte is allowed only
  // where a token is named.
  std::shared_ptr<const CompiledGrammar> g = Compile(R"(
root ::= <｜tool▁calls▁begin｜> call ("\n"? call)* @"[INST]"?
call ::= "{\"" [^"]* "\"}" (<｜tool▁sep｜> | "<｜tool▁sep｜>")
)", vocab);
  ASSERT_NE(g, nullptr);
  const int32_t quote = IdOf(*vocab.v, "\"");
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    GrammarMatcher m(g);
    int quotes = 0;  // odd: inside a string, where only text goes
    for (int step = 0; step < 40 && !m.IsTerminated(); ++step) {
      const std::vector<int32_t> allowed = Allowed(m);
      ASSERT_FALSE(allowed.empty());
      if (quotes % 2 == 1) {
        for (int32_t id : allowed) ASSERT_FALSE(vocab.v->is_special(id)) << "step " << step << ": token " << id;
      }
      const int32_t t = allowed[rng() % allowed.size()];
      ASSERT_TRUE(m.AcceptToken(t));
      quotes += t == quote;
    }
  }
  GrammarMatcher m(g);
  EXPECT_EQ(Allowed(m), std::vector<int32_t>{vocab.begin});
  ASSERT_TRUE(m.AcceptToken(vocab.begin));
  for (const char* piece : {"{", "\"", "<｜", "tool", "▁", "sep", "｜>", "\"", "}"}) {
    ASSERT_TRUE(m.AcceptToken(IdOf(*vocab.v, piece))) << piece << ": a marker's text inside a string is text";
  }
  const std::vector<int32_t> after = Allowed(m);
  EXPECT_EQ(std::count(after.begin(), after.end(), vocab.sep), 1);
  EXPECT_EQ(std::count(after.begin(), after.end(), IdOf(*vocab.v, "<｜")), 1);
  EXPECT_EQ(std::count(after.begin(), after.end(), vocab.inst), 0);
}

TEST(SpecialTokenTest, CompilingChecksTheNamedTokens) {
  const Vocab vocab = MakeVocab();
  for (const auto& [ebnf, why] : std::vector<std::pair<std::string, std::string>>{
           {"root ::= <｜nope｜>", "is not a special or added token"},
           {"root ::= @\"tool\"", "is not a special or added token"},
           {"root ::= \"a\" </s>", "ends generation"}}) {
    absl::StatusOr<Grammar> g = ParseEbnf(ebnf);
    ASSERT_TRUE(g.ok()) << g.status();
    absl::StatusOr<std::shared_ptr<const CompiledGrammar>> c = CompiledGrammar::Compile(*g, vocab.v);
    ASSERT_FALSE(c.ok()) << ebnf;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(c.status().message()).find(why), std::string::npos) << c.status();
  }
}

// A tokenizer.json's added tokens, special or not, are the vocabulary's special tokens.
TEST(SpecialTokenTest, AddedTokensOfATokenizerAreSpecial) {
  GeneratedTokenizerFiles files = BuildByteLevelTokenizer(400);
  nlohmann::json j = nlohmann::json::parse(files.tokenizer_json);
  j["added_tokens"].push_back({{"id", 400}, {"content", kSep}, {"single_word", false}, {"lstrip", false},
                               {"rstrip", false}, {"normalized", true}, {"special", false}});
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromJson(j.dump(), files.tokenizer_config_json);
  ASSERT_TRUE(tok.ok()) << tok.status();
  ASSERT_FALSE((*tok)->IsSpecial(400));
  ASSERT_TRUE((*tok)->IsAdded(400));
  EXPECT_TRUE((*tok)->IsAdded(0)) << "BOS";
  EXPECT_FALSE((*tok)->IsAdded(100));
  const auto v = GrammarVocabulary::FromTokenizer(**tok);
  EXPECT_EQ(v->SpecialTokenId(kSep), 400);
  EXPECT_EQ(v->SpecialTokenId("<｜begin▁of▁sentence｜>"), 0);

  absl::StatusOr<Grammar> g = ParseEbnf("root ::= \"a\" <｜tool▁sep｜>");
  ASSERT_TRUE(g.ok());
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> c = CompiledGrammar::Compile(*g, v);
  ASSERT_TRUE(c.ok()) << c.status();
  GrammarMatcher m(*c);
  ASSERT_TRUE(m.AcceptBytes("a"));
  EXPECT_TRUE(m.AcceptToken(400));
  EXPECT_TRUE(m.CanEnd());
  // Its text, encoded, is the token, and a text grammar never allows that token.
  EXPECT_EQ((*tok)->Encode(kSep, false), std::vector<int32_t>{400});
  absl::StatusOr<Grammar> text = ParseEbnf("root ::= \"a\" \"<｜tool▁sep｜>\"");
  ASSERT_TRUE(text.ok());
  c = CompiledGrammar::Compile(*text, v);
  ASSERT_TRUE(c.ok());
  GrammarMatcher t(*c);
  ASSERT_TRUE(t.AcceptBytes("a"));
  EXPECT_FALSE(t.AcceptToken(400));
}

TEST(SpecialTokenTest, JsonSchemaRulesJoinAnEbnfGrammar) {
  const Vocab vocab = MakeVocab();
  GrammarCompiler compiler(vocab.v, {.cache_capacity = 4});
  const std::vector<JsonSchemaRule> rules = {
      {.name = "args", .schema = R"({"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"]})",
       .strict = true}};
  const std::string ebnf = "root ::= <｜tool▁calls▁begin｜> args <｜tool▁sep｜>";
  auto g = compiler.CompileEbnf(ebnf, "root", rules, {}, absl::InfiniteFuture());
  ASSERT_TRUE(g.ok()) << g.status();
  auto accepts = [&](std::string_view args) {
    GrammarMatcher m(*g);
    return m.AcceptToken(vocab.begin) && m.AcceptBytes(args) && m.AcceptToken(vocab.sep) && m.CanEnd();
  };
  EXPECT_TRUE(accepts(R"({"a": "x"})"));
  EXPECT_FALSE(accepts(R"({"a": "z"})"));
  EXPECT_FALSE(accepts(R"({"a": "x", "b": 1})")) << "strict: no other members";
  EXPECT_FALSE(accepts(R"({})"));
  auto again = compiler.CompileEbnf(ebnf, "root", rules, {}, absl::InfiniteFuture());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(g->get(), again->get()) << "cached by content, rules included";
  std::vector<JsonSchemaRule> loose = rules;
  loose[0].strict = false;
  auto other = compiler.CompileEbnf(ebnf, "root", loose, {}, absl::InfiniteFuture());
  ASSERT_TRUE(other.ok());
  EXPECT_NE(g->get(), other->get());

  const std::vector<JsonSchemaRule> unsupported = {{.name = "args", .schema = R"({"type": "object", "if": {}})"}};
  auto bad = compiler.CompileEbnf(ebnf, "root", unsupported, {}, absl::InfiniteFuture());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("json rule 'args'"), std::string::npos) << bad.status();
  auto twice = compiler.CompileEbnf(ebnf + "\nargs ::= \"{}\"", "root", rules, {}, absl::InfiniteFuture());
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(std::string(twice.status().message()).find("defined twice"), std::string::npos) << twice.status();
}

}  // namespace
}  // namespace tandem::grammar
