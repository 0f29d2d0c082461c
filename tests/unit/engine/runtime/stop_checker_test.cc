#include "engine/runtime/stop_checker.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/tokenizer/byte_level_tokenizer_builder.h"
#include "engine/tokenizer/tokenizer.h"

namespace tandem {
namespace {

constexpr int32_t kEos = 1;  // the generated tokenizer's "<｜end▁of▁sentence｜>"
constexpr int32_t kPad = 2;  // a special token that is not EOS

const Tokenizer& TestTokenizer() {
  static const Tokenizer* tokenizer = [] {
    const GeneratedTokenizerFiles files = BuildByteLevelTokenizer(2000);
    auto t = Tokenizer::FromJson(files.tokenizer_json, files.tokenizer_config_json);
    EXPECT_TRUE(t.ok()) << t.status();
    return t->release();
  }();
  return *tokenizer;
}

// One token per byte (ids 3..258 are the bytes in order).
std::vector<int32_t> Bytes(const std::string& s) {
  std::vector<int32_t> ids;
  for (const char c : s) ids.push_back(3 + static_cast<uint8_t>(c));
  return ids;
}

int32_t Byte(char c) { return 3 + static_cast<uint8_t>(c); }

// Tokens whose texts are `pieces`, each piece encoded on its own, so that token
// boundaries fall at least at the piece boundaries.
std::vector<int32_t> Pieces(const std::vector<std::string>& pieces) {
  std::vector<int32_t> ids;
  for (const std::string& piece : pieces) {
    const std::vector<int32_t> encoded = TestTokenizer().Encode(piece, false);
    ids.insert(ids.end(), encoded.begin(), encoded.end());
  }
  return ids;
}

struct Streamed {
  std::vector<std::string> deltas;  // one per token fed
  StopResult last;
  std::string flushed;
  int fed = 0;
  std::string Text() const {
    std::string text;
    for (const std::string& d : deltas) text += d;
    return text + flushed;
  }
};

// Feeds tokens until the checker finishes (or they run out), then flushes.
Streamed Feed(const StopParams& params, const std::vector<int32_t>& tokens,
         std::vector<int32_t> eos = {kEos}) {
  StopChecker checker(TestTokenizer(), params, std::move(eos));
  Streamed run;
  for (const int32_t token : tokens) {
    run.last = checker.OnToken(token);
    run.deltas.push_back(run.last.text_delta);
    ++run.fed;
    if (run.last.finished) break;
  }
  run.flushed = checker.Flush();
  EXPECT_EQ(checker.Flush(), "");
  return run;
}

StopParams WithStops(std::vector<std::string> stop, int32_t max_tokens = 1000) {
  StopParams p;
  p.stop = std::move(stop);
  p.max_tokens = max_tokens;
  return p;
}

TEST(StopCheckerTest, PlainTextEqualsDecode) {
  const std::string text = "The quick brown fox, and then\n    return self.value; 123456";
  const std::vector<int32_t> ids = TestTokenizer().Encode(text, false);
  ASSERT_LT(ids.size(), text.size());
  const Streamed run = Feed(WithStops({}), ids);
  EXPECT_FALSE(run.last.finished);
  EXPECT_EQ(run.fed, static_cast<int>(ids.size()));
  EXPECT_EQ(run.Text(), text);
  EXPECT_EQ(run.flushed, "");
}

TEST(StopCheckerTest, StopStringAcrossTwoAndThreeTokens) {
  // "STOP" as "ST" + "OP" and as "S" + "TO" + "P", after some text; nothing after it shows.
  for (const auto& pieces : std::vector<std::vector<std::string>>{
           {"Hello wor", "ld ST", "OP and more"}, {"Hello world S", "TO", "P", " and more"}}) {
    const Streamed run = Feed(WithStops({"STOP"}), Pieces(pieces));
    EXPECT_TRUE(run.last.finished);
    EXPECT_EQ(run.last.reason, FinishReason::kStop);
    EXPECT_EQ(run.last.matched_stop, "STOP");
    EXPECT_EQ(run.Text(), "Hello world ");
    for (const std::string& d : run.deltas) EXPECT_EQ(d.find('S'), std::string::npos) << d;
  }
  // Byte by byte.
  const Streamed run = Feed(WithStops({"xyz"}), Bytes("abxyzc"));
  EXPECT_EQ(run.fed, 5);
  EXPECT_EQ(run.deltas, (std::vector<std::string>{"a", "b", "", "", ""}));
  EXPECT_EQ(run.Text(), "ab");
}

TEST(StopCheckerTest, HeldBackPrefixIsEmittedIntactWhenItIsNoStop) {
  const Streamed run = Feed(WithStops({"STOP"}), Pieces({"x", "ST", "O", "RY", " end"}));
  EXPECT_FALSE(run.last.finished);
  EXPECT_EQ(run.deltas.front(), "x");
  std::string held_then_released;
  for (size_t i = 1; i < run.deltas.size(); ++i) held_then_released += run.deltas[i];
  EXPECT_EQ(held_then_released, "STORY end");
  EXPECT_EQ(run.Text(), "xSTORY end");

  // Byte by byte: each delta is released as soon as it can no longer start "aab".
  const Streamed bytes = Feed(WithStops({"aab"}), Bytes("aaac"));
  EXPECT_EQ(bytes.deltas, (std::vector<std::string>{"", "", "a", "aac"}));
  EXPECT_EQ(bytes.Text(), "aaac");

  // What is still held at the end comes out of Flush.
  const Streamed flushed = Feed(WithStops({"STOP"}), Pieces({"hi ", "ST"}));
  EXPECT_EQ(flushed.flushed, "ST");
  EXPECT_EQ(flushed.Text(), "hi ST");
}

TEST(StopCheckerTest, StopStringInsideOneToken) {
  const Streamed run = Feed(WithStops({"zz"}), Bytes("a"));
  EXPECT_EQ(run.Text(), "a");
  // A multi-byte token containing the stop string with text on both sides.
  ASSERT_EQ(Pieces({"the"}).size(), 1u) << "'the' should be one token";
  const Streamed inside = Feed(WithStops({"h"}), Pieces({"a ", "the", " b"}));
  EXPECT_EQ(inside.Text(), "a t");
  EXPECT_EQ(inside.last.matched_stop, "h");
}

TEST(StopCheckerTest, FirstEndingStopWins) {
  // "bc" ends before "abcd" would, so it wins although "abcd" starts earlier; the result
  // is the same however the text is split.
  for (const auto& ids : {Bytes("xabcde"), Pieces({"xabcde"}), Pieces({"xa", "bcde"})}) {
    const Streamed run = Feed(WithStops({"abcd", "bc"}), ids);
    EXPECT_EQ(run.last.matched_stop, "bc");
    EXPECT_EQ(run.Text(), "xa");
  }
  // Ending together: the longer (earlier start).
  const Streamed run = Feed(WithStops({"c", "abc"}), Pieces({"xabc"}));
  EXPECT_EQ(run.last.matched_stop, "abc");
  EXPECT_EQ(run.Text(), "x");
}

TEST(StopCheckerTest, IncludeStopStringInOutput) {
  StopParams p = WithStops({"ab"});
  p.include_stop_str_in_output = true;
  const Streamed run = Feed(p, Bytes("xabc"));
  // Nothing is held back: the stop string would be emitted anyway.
  EXPECT_EQ(run.deltas, (std::vector<std::string>{"x", "a", "b"}));
  EXPECT_TRUE(run.last.finished);
  EXPECT_EQ(run.last.matched_stop, "ab");
  EXPECT_EQ(run.Text(), "xab");
  // Text after the stop string in the same token is dropped.
  const Streamed same_token = Feed(p, Pieces({"x", "zabc"}));
  EXPECT_EQ(same_token.Text(), "xzab");
}

TEST(StopCheckerTest, MaxTokens) {
  StopParams p;
  p.max_tokens = 1;
  const std::vector<int32_t> ids = Pieces({"the", " end"});
  ASSERT_EQ(TestTokenizer().TokenBytes(ids[0]), "the");
  Streamed run = Feed(p, ids);
  EXPECT_EQ(run.fed, 1);
  EXPECT_TRUE(run.last.finished);
  EXPECT_EQ(run.last.reason, FinishReason::kLength);
  EXPECT_EQ(run.Text(), "the");
  EXPECT_EQ(run.last.text_delta, "the");

  // Held-back text comes out with the last token.
  p = WithStops({"ab"}, /*max_tokens=*/2);
  run = Feed(p, Bytes("xab"));
  EXPECT_EQ(run.deltas, (std::vector<std::string>{"x", "a"}));
  EXPECT_EQ(run.last.reason, FinishReason::kLength);

  // A stop at the last token is a stop.
  p = WithStops({"ab"}, /*max_tokens=*/3);
  run = Feed(p, Bytes("xab"));
  EXPECT_EQ(run.last.reason, FinishReason::kStop);
  EXPECT_EQ(run.Text(), "x");
}

TEST(StopCheckerTest, Eos) {
  std::vector<int32_t> ids = Pieces({"a ", "S"});
  ids.push_back(kEos);
  ids.push_back(Byte('z'));
  Streamed run = Feed(WithStops({"STOP"}), ids);
  EXPECT_TRUE(run.last.finished);
  EXPECT_EQ(run.last.reason, FinishReason::kStop);
  EXPECT_FALSE(run.last.matched_stop.has_value());
  EXPECT_FALSE(run.last.matched_stop_token.has_value());
  EXPECT_EQ(run.fed, static_cast<int>(ids.size()) - 1);
  EXPECT_EQ(run.last.text_delta, "S");  // released, not the EOS text
  EXPECT_EQ(run.Text(), "a S");

  // Several EOS ids (config and tokenizer may differ); a non-special one.
  run = Feed(StopParams{}, Bytes("ab.c"), {kEos, Byte('.')});
  EXPECT_EQ(run.last.reason, FinishReason::kStop);
  EXPECT_EQ(run.Text(), "ab");

  // ignore_eos: EOS is an ordinary (special, so silent) token.
  StopParams ignore;
  ignore.ignore_eos = true;
  ignore.max_tokens = 4;
  run = Feed(ignore, {Byte('a'), kEos, Byte('b'), kEos, Byte('c')});
  EXPECT_EQ(run.fed, 4);
  EXPECT_EQ(run.last.reason, FinishReason::kLength);
  EXPECT_EQ(run.Text(), "ab");
  // ... but stop_token_ids still apply, even to an EOS id.
  ignore.stop_token_ids = {kEos};
  run = Feed(ignore, {Byte('a'), kEos, Byte('b')});
  EXPECT_EQ(run.fed, 2);
  EXPECT_EQ(run.last.reason, FinishReason::kStop);
  EXPECT_EQ(run.last.matched_stop_token, kEos);
}

TEST(StopCheckerTest, StopTokenIds) {
  StopParams p = WithStops({"xy"});
  p.stop_token_ids = {Byte('!'), kPad};
  Streamed run = Feed(p, Bytes("hi x!more"));
  EXPECT_TRUE(run.last.finished);
  EXPECT_EQ(run.last.reason, FinishReason::kStop);
  EXPECT_EQ(run.last.matched_stop_token, Byte('!'));
  EXPECT_EQ(run.Text(), "hi x");  // the held-back "x" is released, "!" is not emitted
  run = Feed(p, {Byte('a'), kPad, Byte('b')});
  EXPECT_EQ(run.last.matched_stop_token, kPad);
  EXPECT_EQ(run.Text(), "a");
}

TEST(StopCheckerTest, MinTokens) {
  // EOS and stop tokens count only after min_tokens tokens.
  StopParams p;
  p.min_tokens = 3;
  p.stop_token_ids = {Byte('!')};
  Streamed run = Feed(p, {Byte('a'), kEos, Byte('!'), kEos, Byte('b')});
  EXPECT_EQ(run.fed, 4);
  EXPECT_EQ(run.last.reason, FinishReason::kStop);
  EXPECT_EQ(run.Text(), "a!");  // the early stop token was ordinary text
  run = Feed(p, {Byte('a'), Byte('b'), Byte('c'), Byte('!')});
  EXPECT_EQ(run.fed, 4);
  EXPECT_EQ(run.Text(), "abc");

  // A stop string counts from the min_tokens-th token on (vLLM's rule).
  p = WithStops({"ab"});
  p.min_tokens = 3;
  run = Feed(p, Bytes("abxaby"));  // "ab" ends at token 2: text; at token 5: a stop
  EXPECT_EQ(run.fed, 5);
  EXPECT_EQ(run.last.matched_stop, "ab");
  EXPECT_EQ(run.Text(), "abx");
  run = Feed(p, Bytes("xab"));  // ends at token 3
  EXPECT_EQ(run.fed, 3);
  EXPECT_EQ(run.Text(), "x");
}

TEST(StopCheckerTest, EmojiSplitAcrossTokens) {
  const std::string emoji = "\xF0\x9F\x98\x80";  // U+1F600
  Streamed run = Feed(WithStops({}), Bytes("a" + emoji + "b"));
  EXPECT_EQ(run.deltas, (std::vector<std::string>{"a", "", "", "", emoji, "b"}));
  // A stop string made of the emoji, and one that ends inside a character's bytes.
  run = Feed(WithStops({emoji}), Bytes("x" + emoji + "y"));
  EXPECT_EQ(run.fed, 5);
  EXPECT_EQ(run.last.matched_stop, emoji);
  EXPECT_EQ(run.Text(), "x");
  // Cut off mid-character by max_tokens: U+FFFD, as Decode gives.
  StopParams p;
  p.max_tokens = 3;
  const std::vector<int32_t> ids = Bytes("a" + emoji);
  run = Feed(p, ids);
  EXPECT_EQ(run.Text(), TestTokenizer().Decode(std::vector<int32_t>(ids.begin(), ids.begin() + 3),
                                               true));
  EXPECT_EQ(run.Text(), "a\xEF\xBF\xBD");
}

TEST(StopCheckerTest, SpecialTokensAreSkipped) {
  const Streamed run = Feed(StopParams{}, {Byte('a'), kPad, 0, Byte('b')});
  EXPECT_EQ(run.Text(), "ab");
}

TEST(StopCheckerDeathTest, TokenAfterFinish) {
  StopParams p;
  p.max_tokens = 1;
  StopChecker checker(TestTokenizer(), p, {kEos});
  EXPECT_TRUE(checker.OnToken(Byte('a')).finished);
  EXPECT_TRUE(checker.done());
  EXPECT_DEATH(checker.OnToken(Byte('b')), "finished");
}

// Streams random texts over a small alphabet, split at random, with random stop strings,
// and checks the result against the definition on the whole text.
TEST(StopCheckerTest, RandomTextsAgainstTheDefinition) {
  std::mt19937 rng(5);
  const std::string alphabet = "ab c";
  auto random_string = [&](int min_len, int max_len) {
    std::string s(std::uniform_int_distribution<int>(min_len, max_len)(rng), ' ');
    for (char& c : s) c = alphabet[std::uniform_int_distribution<size_t>(0, 3)(rng)];
    return s;
  };
  for (int trial = 0; trial < 2000; ++trial) {
    const std::string text = random_string(0, 30);
    StopParams p;
    for (int i = std::uniform_int_distribution<int>(0, 3)(rng); i > 0; --i) {
      p.stop.push_back(random_string(1, 4));
    }
    p.include_stop_str_in_output = trial % 3 == 0;
    // Expected: cut at the occurrence that ends first (then starts first).
    std::string expected = text;
    std::string expected_stop;
    size_t best_end = std::string::npos;
    size_t best_start = 0;
    for (const std::string& s : p.stop) {
      const size_t start = text.find(s);
      if (start == std::string::npos) continue;
      const size_t end = start + s.size();
      if (end < best_end || (end == best_end && start < best_start)) {
        best_end = end;
        best_start = start;
        expected_stop = s;
      }
    }
    if (best_end != std::string::npos) {
      expected = text.substr(0, p.include_stop_str_in_output ? best_end : best_start);
    }
    // Random split into pieces, each encoded on its own.
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t len = std::uniform_int_distribution<size_t>(1, 5)(rng);
      pieces.push_back(text.substr(i, len));
      i += len;
    }
    const Streamed run = Feed(p, Pieces(pieces));
    SCOPED_TRACE("text '" + text + "' trial " + std::to_string(trial));
    ASSERT_EQ(run.Text(), expected);
    ASSERT_EQ(run.last.finished, best_end != std::string::npos);
    if (run.last.finished) {
      ASSERT_EQ(run.last.matched_stop, expected_stop);
    }
  }
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Special tokens' text is dropped unless skip_special_tokens is off; then it is text like
// any other, which stop strings can match (vLLM's skip_special_tokens: false).
TEST(StopCheckerTest, SpecialTokensAreDroppedUnlessSkipSpecialTokensIsOff) {
  const std::string eos_text = TestTokenizer().Decode(std::vector<int32_t>{kEos}, /*skip_special_tokens=*/false);
  ASSERT_FALSE(eos_text.empty());
  std::vector<int32_t> tokens = Bytes("ab");
  tokens.push_back(kEos);
  tokens.push_back(Byte('c'));
  StopParams p;
  p.ignore_eos = true;
  p.max_tokens = 4;
  EXPECT_EQ(Feed(p, tokens).Text(), "abc");
  p.skip_special_tokens = false;
  EXPECT_EQ(Feed(p, tokens).Text(), "ab" + eos_text + "c");
  p.stop = {eos_text};
  const Streamed stopped = Feed(p, tokens);
  EXPECT_EQ(stopped.Text(), "ab");
  EXPECT_EQ(stopped.last.matched_stop, eos_text);
  EXPECT_EQ(stopped.fed, 3);
}

}  // namespace
}  // namespace tandem
