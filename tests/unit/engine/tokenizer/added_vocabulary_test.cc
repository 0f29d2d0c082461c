#include "engine/tokenizer/added_vocabulary.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace tandem::tokenizer_internal {
namespace {

using Pieces = std::vector<std::pair<std::string, int32_t>>;

AddedToken Token(std::string content, bool special = false) {
  AddedToken token;
  token.content = std::move(content);
  token.special = special;
  token.normalized = !special;
  return token;
}

class AddedVocabularyTest : public ::testing::Test {
 protected:
  void Add(const AddedToken& token) {
    vocab_.Add(
        token, [](std::string_view) -> std::optional<int32_t> { return std::nullopt; },
        /*model_vocab_size=*/100);
  }
  Pieces Extract(std::string_view text) {
    vocab_.Build();
    std::vector<TextPiece> pieces;
    vocab_.Extract(text, &pieces);
    Pieces out;
    for (const TextPiece& piece : pieces) out.emplace_back(std::string(piece.text), piece.id);
    return out;
  }
  AddedVocabulary vocab_;
};

TEST_F(AddedVocabularyTest, IdsFollowTheModelVocabulary) {
  Add(Token("<a>", true));
  Add(Token("<b>"));
  Add(Token("<a>", true));  // again: same id
  EXPECT_EQ(vocab_.TokenToId("<a>"), 100);
  EXPECT_EQ(vocab_.TokenToId("<b>"), 101);
  EXPECT_TRUE(vocab_.IsSpecialContent("<a>"));
  EXPECT_FALSE(vocab_.IsSpecialContent("<b>"));
  AddedVocabulary other;
  other.Add(
      Token("known"),
      [](std::string_view s) -> std::optional<int32_t> {
        return s == "known" ? std::optional<int32_t>(7) : std::nullopt;
      },
      100);
  EXPECT_EQ(other.TokenToId("known"), 7);
}

TEST_F(AddedVocabularyTest, LeftmostLongest) {
  Add(Token("<|tool|>", true));
  Add(Token("<|tool|>s", true));
  Add(Token("ab"));
  Add(Token("abc"));
  Add(Token("bcd"));
  EXPECT_EQ(Extract("x<|tool|>sy<|tool|>"),
            (Pieces{{"x", -1}, {"<|tool|>s", 101}, {"y", -1}, {"<|tool|>", 100}}));
  // "abc" starts first and is longest there; "bcd" overlaps it and is not seen.
  EXPECT_EQ(Extract("abcd"), (Pieces{{"abc", 103}, {"d", -1}}));
  EXPECT_EQ(Extract("zabd"), (Pieces{{"z", -1}, {"ab", 102}, {"d", -1}}));
  EXPECT_EQ(Extract(""), (Pieces{}));
}

TEST_F(AddedVocabularyTest, LstripAndRstripTakeWhitespace) {
  AddedToken mask = Token("<mask>", true);
  mask.lstrip = true;
  mask.rstrip = true;
  Add(mask);
  EXPECT_EQ(Extract("Hi <mask> there\t<mask>\t<mask>\u2000!"), (Pieces{{"Hi", -1},
                                                                       {" <mask> ", 100},
                                                                       {"there", -1},
                                                                       {"\t<mask>\t", 100},
                                                                       {"<mask>\u2000", 100},
                                                                       {"!", -1}}));
  AddedToken left = Token("[L]", true);
  left.lstrip = true;
  AddedVocabulary only_left;
  only_left.Add(
      left, [](std::string_view) { return std::optional<int32_t>(); }, 0);
  only_left.Build();
  std::vector<TextPiece> pieces;
  only_left.Extract("a \u3000 [L] b", &pieces);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[1].text, " \u3000 [L]");
  EXPECT_EQ(pieces[2].text, " b");
}

TEST_F(AddedVocabularyTest, SingleWordRejectsMatchesInsideWords) {
  AddedToken mask = Token("<mask>");
  mask.single_word = true;
  Add(mask);
  EXPECT_EQ(Extract("<mask> My name <mask> A<mask> <mask>ony <mask>"),
            (Pieces{{"<mask>", 100},
                    {" My name ", -1},
                    {"<mask>", 100},
                    {" A<mask> <mask>ony ", -1},
                    {"<mask>", 100}}));
  // Punctuation is not a word character; a combining mark is.
  EXPECT_EQ(Extract("<mask>, <mask>- \u25cc\u0330<mask>"),
            (Pieces{{"<mask>", 100}, {", ", -1}, {"<mask>", 100}, {"- \u25cc\u0330<mask>", -1}}));
}

TEST_F(AddedVocabularyTest, RawTokensFirstThenNormalizedOnTheRest) {
  // "<x>" (normalized) inside "[<x>]" (raw): the raw one is matched first on the text,
  // the normalized one only in what is left.
  AddedToken raw = Token("[<x>]", true);
  Add(raw);
  Add(Token("<x>"));
  EXPECT_EQ(Extract("a[<x>]b<x>c"),
            (Pieces{{"a", -1}, {"[<x>]", 100}, {"b", -1}, {"<x>", 101}, {"c", -1}}));
}

}  // namespace
}  // namespace tandem::tokenizer_internal
