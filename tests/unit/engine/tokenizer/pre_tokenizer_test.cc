#include "engine/tokenizer/pre_tokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/tokenizer/byte_level.h"

namespace tandem::tokenizer_internal {
namespace {

using Strings = std::vector<std::string>;

std::unique_ptr<Regex> Compile(std::string_view pattern) {
  auto regex = Regex::Compile(pattern);
  EXPECT_TRUE(regex.ok()) << regex.status();
  return *std::move(regex);
}

Strings Split(std::string_view pattern, SplitBehavior behavior, std::string text,
              bool invert = false) {
  SplitPreTokenizer split(Compile(pattern), behavior, invert);
  Strings pieces = {std::move(text)};
  EXPECT_TRUE(split.PreTokenize(&pieces).ok());
  return pieces;
}

TEST(PreTokenizerTest, SplitBehaviors) {
  const std::string text = "the-final--countdown";
  EXPECT_EQ(Split("-", SplitBehavior::kRemoved, text), (Strings{"the", "final", "countdown"}));
  EXPECT_EQ(Split("-", SplitBehavior::kIsolated, text),
            (Strings{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(Split("-", SplitBehavior::kMergedWithPrevious, text),
            (Strings{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(Split("-", SplitBehavior::kMergedWithNext, text),
            (Strings{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(Split("-", SplitBehavior::kContiguous, text),
            (Strings{"the", "-", "final", "--", "countdown"}));
  EXPECT_EQ(Split("-", SplitBehavior::kMergedWithPrevious, "-a"), (Strings{"-", "a"}));
  EXPECT_EQ(Split("-", SplitBehavior::kMergedWithNext, "a-"), (Strings{"a", "-"}));
}

TEST(PreTokenizerTest, InvertedSplitMatchesThePieces) {
  EXPECT_EQ(Split(R"(\w+)", SplitBehavior::kRemoved, "Hey, friend!", /*invert=*/true),
            (Strings{"Hey", "friend"}));
  EXPECT_EQ(Split(R"(\s+)", SplitBehavior::kMergedWithPrevious, "a b  c"),
            (Strings{"a ", "b  ", "c"}));
}

TEST(PreTokenizerTest, EmptyMatchesFollowTheOnigIterator) {
  auto regex = Compile("a*");
  // Empty matches, but not right after a match.
  EXPECT_EQ(*regex->FindAll("baab"),
            (std::vector<std::pair<size_t, size_t>>{{0, 0}, {1, 3}, {4, 4}}));
  EXPECT_EQ(*regex->FindAll(""), (std::vector<std::pair<size_t, size_t>>{{0, 0}}));
  auto chars = Compile("");
  EXPECT_EQ(chars->FindAll("\xC3\xA9x")->size(), 3u);  // at 0, 2 and 3: character steps
}

TEST(PreTokenizerTest, OnigurumaSpaceClassIsUnicodeWhiteSpace) {
  EXPECT_EQ(Regex::TranslateOniguruma(R"(\s+(?!\S))"),
            R"([\t-\r\x{85}\p{Z}]+(?![^\t-\r\x{85}\p{Z}]))");
  EXPECT_EQ(Regex::TranslateOniguruma(R"([^\s\p{Zs}])"), R"([^\t-\r\x{85}\p{Z}\p{Zs}])");
  EXPECT_EQ(Regex::TranslateOniguruma(R"([\[\\\]]\h)"), R"([\[\\\]][0-9a-fA-F])");
  auto space = Compile(R"(\s)");
  EXPECT_TRUE(space->MatchesPrefix("\u3000"));
  EXPECT_TRUE(space->MatchesPrefix("\u0085"));
  EXPECT_TRUE(space->MatchesPrefix("\u00a0"));
  EXPECT_FALSE(space->MatchesPrefix("\u180e"));  // PCRE2's own \s takes it; Oniguruma's not
  EXPECT_FALSE(space->MatchesPrefix("\u200b"));
}

TEST(PreTokenizerTest, CategoriesKnowUnicode16) {
  EXPECT_EQ(Regex::TranslateOniguruma(R"(\p{Lo})").rfind(R"([\p{Lo}\x{)", 0), 0u);
  EXPECT_EQ(Regex::TranslateOniguruma(R"([^\p{Sm}])"), R"([^\p{Sm}\x{10d8e}-\x{10d8f}])");
  EXPECT_EQ(Regex::TranslateOniguruma(R"(\P{Sm})"), R"([^\p{Sm}\x{10d8e}-\x{10d8f}])");
  EXPECT_EQ(Regex::TranslateOniguruma(R"(\p{Han})"), R"(\p{Han})");
  auto symbol = Compile(R"(\p{S})");
  EXPECT_TRUE(symbol->MatchesPrefix("\U0001FA77"));  // pink heart, Unicode 15.0
  EXPECT_TRUE(symbol->MatchesPrefix("\U0001FAE9"));  // face with bags under eyes, 16.0
  auto letter = Compile(R"(\p{L})");
  EXPECT_TRUE(letter->MatchesPrefix("\U0002EBF0"));  // CJK extension I, 15.1
  EXPECT_TRUE(letter->MatchesPrefix("\U00013460"));  // Egyptian hieroglyphs ext. A, 16.0
  EXPECT_FALSE(Compile(R"(\P{L})")->MatchesPrefix("\U0002EBF0"));
  EXPECT_FALSE(Compile(R"([^\p{L}\p{N}])")->MatchesPrefix("\U0002EBF0"));
}

TEST(PreTokenizerTest, ByteLevelWithGpt2Regex) {
  ByteLevelPreTokenizer byte_level(/*add_prefix_space=*/false, /*use_regex=*/true);
  Strings pieces = {"Hello world, it's  123\n\n"};
  ASSERT_TRUE(byte_level.PreTokenize(&pieces).ok());
  EXPECT_EQ(pieces, (Strings{"Hello", "\xC4\xA0world", ",", "\xC4\xA0it", "'s", "\xC4\xA0",
                             "\xC4\xA0"
                             "123",
                             "\xC4\x8A\xC4\x8A"}));
  ByteLevelPreTokenizer prefixed(/*add_prefix_space=*/true, /*use_regex=*/false);
  Strings one = {"hi", " there"};
  ASSERT_TRUE(prefixed.PreTokenize(&one).ok());
  EXPECT_EQ(one, (Strings{"\xC4\xA0hi", "\xC4\xA0there"}));
}

TEST(PreTokenizerTest, ByteLevelAlphabet) {
  EXPECT_EQ(ByteLevelChar(' '), "\xC4\xA0");   // Ġ
  EXPECT_EQ(ByteLevelChar('\n'), "\xC4\x8A");  // Ċ
  EXPECT_EQ(ByteLevelChar('a'), "a");
  EXPECT_EQ(ByteLevelChar(0xAD), "\xC5\x83");  // soft hyphen is not printable: Ń
  for (int b = 0; b < 256; ++b) {
    const std::string_view c = ByteLevelChar(static_cast<uint8_t>(b));
    EXPECT_EQ(ByteLevelTokenToBytes(c), std::string(1, static_cast<char>(b)));
  }
  // A token with a character outside the alphabet decodes to its own bytes.
  EXPECT_EQ(ByteLevelTokenToBytes("\xC4\xA0<\xEF\xBD\x9C>"), "\xC4\xA0<\xEF\xBD\x9C>");
  EXPECT_EQ(ByteLevelTokenToBytes("\xC4\xA0hi"), " hi");
}

TEST(PreTokenizerTest, DigitsAndSequence) {
  std::vector<std::unique_ptr<PreTokenizer>> steps;
  steps.push_back(std::make_unique<DigitsPreTokenizer>(/*individual_digits=*/false));
  steps.push_back(
      std::make_unique<SplitPreTokenizer>(Compile(" "), SplitBehavior::kRemoved, false));
  SequencePreTokenizer sequence(std::move(steps));
  Strings pieces = {
      "ab12 c\xD9\xA3"
      "4x"};
  ASSERT_TRUE(sequence.PreTokenize(&pieces).ok());
  EXPECT_EQ(pieces, (Strings{"ab", "12", "c",
                             "\xD9\xA3"
                             "4",
                             "x"}));
  DigitsPreTokenizer individual(/*individual_digits=*/true);
  Strings digits = {"a123"};
  ASSERT_TRUE(individual.PreTokenize(&digits).ok());
  EXPECT_EQ(digits, (Strings{"a", "1", "2", "3"}));
}

// A pattern that backtracks exponentially ((a+)+ anchored at an end that a final '!'
// denies: 2^n ways to split n a's) on a subject built for it: the search stops at its budget with
// an error naming the pattern, where unlimited PCRE2 would run for longer than the age of
// the universe (2^200 steps), and pre-tokenization reports it instead of splitting wrong.
TEST(PreTokenizerTest, CatastrophicBacktrackingStopsWithAnErrorAtItsBudget) {
  auto regex = Compile("(a+)+$");
  const std::string subject = std::string(200, 'a') + "!";
  absl::StatusOr<std::vector<std::pair<size_t, size_t>>> matches = regex->FindAll(subject);
  ASSERT_FALSE(matches.ok()) << matches->size() << " matches";
  EXPECT_EQ(matches.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(matches.status().message().find("'(a+)+$'"), std::string::npos) << matches.status();
  EXPECT_NE(matches.status().message().find("201-byte piece"), std::string::npos) << matches.status();

  SplitPreTokenizer split(Compile("(a+)+$"), SplitBehavior::kIsolated, false);
  Strings pieces = {"xyz " + subject};
  const absl::Status st = split.PreTokenize(&pieces);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  std::vector<std::unique_ptr<PreTokenizer>> steps;
  steps.push_back(std::make_unique<SplitPreTokenizer>(Compile(" "), SplitBehavior::kRemoved, false));
  steps.push_back(std::make_unique<SplitPreTokenizer>(Compile("(a+)+$"), SplitBehavior::kIsolated, false));
  SequencePreTokenizer sequence(std::move(steps));
  pieces = {"xyz " + subject};
  EXPECT_EQ(sequence.PreTokenize(&pieces).code(), absl::StatusCode::kInvalidArgument);

  // The same pattern where it matches, and on short runs, stays within its budget.
  EXPECT_EQ(*regex->FindAll("xaaa"), (std::vector<std::pair<size_t, size_t>>{{1, 4}}));
  EXPECT_TRUE(regex->FindAll(std::string(10, 'a') + "!").ok());
}

// The patterns of real tokenizers do a bounded amount of work per character: long runs of
// every character class stay far within the budget (which grows with the subject).
TEST(PreTokenizerTest, LongRunsOfEveryClassStayWithinTheBudget) {
  ByteLevelPreTokenizer byte_level(/*add_prefix_space=*/false, /*use_regex=*/true);
  const std::string cjk = "\xE4\xB8\xAD";  // 中
  for (const std::string& run : {std::string(1 << 20, ' '), std::string(1 << 20, 'a'), std::string(1 << 20, '7'),
                                 std::string(1 << 20, '!'), std::string(1 << 20, '\n')}) {
    Strings pieces = {run + "x" + run};
    EXPECT_TRUE(byte_level.PreTokenize(&pieces).ok()) << "a run of '" << run[0] << "'";
  }
  std::string han;
  for (int i = 0; i < (1 << 18); ++i) han += cjk;
  Strings pieces = {han + " " + han};
  EXPECT_TRUE(byte_level.PreTokenize(&pieces).ok());
}

}  // namespace
}  // namespace tandem::tokenizer_internal
