// The <think> reasoning parsers on their own: which options select which behaviour, and
// PromptEndsInsideThink on prompts as DeepSeek's chat templates end them.
#include "engine/output_parsing/think_reasoning_parser.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace tandem::output_parsing {
namespace {

ReasoningSplit ParseAll(ReasoningParser& parser, const std::string& text) {
  ReasoningSplit split;
  parser.Feed(text, &split);
  parser.Finish(&split);
  return split;
}

TEST(ThinkReasoningParserTest, DeepSeekR1StartsInReasoningUnlessThePromptClosedIt) {
  const std::string text = "step 1</think>answer";
  std::unique_ptr<ReasoningParser> by_default = MakeDeepSeekR1ReasoningParser({});
  ReasoningSplit s = ParseAll(*by_default, text);
  EXPECT_EQ(s.reasoning, "step 1");
  EXPECT_EQ(s.content, "answer");

  std::unique_ptr<ReasoningParser> closed = MakeDeepSeekR1ReasoningParser({false, false});
  s = ParseAll(*closed, text);
  EXPECT_EQ(s.reasoning, "");
  EXPECT_EQ(s.content, "step 1</think>answer");
}

TEST(ThinkReasoningParserTest, DeepSeekV3IsIdentityWithThinkingOff) {
  std::unique_ptr<ReasoningParser> off = MakeDeepSeekV3ReasoningParser({false, std::nullopt});
  ReasoningSplit s = ParseAll(*off, "<think>a</think>b");
  EXPECT_EQ(s.reasoning, "");
  EXPECT_EQ(s.content, "<think>a</think>b");

  std::unique_ptr<ReasoningParser> on = MakeDeepSeekV3ReasoningParser({true, std::nullopt});
  s = ParseAll(*on, "a</think>b");
  EXPECT_EQ(s.reasoning, "a");
  EXPECT_EQ(s.content, "b");

  // A prompt known to leave <think> open turns reasoning on even without the flag.
  std::unique_ptr<ReasoningParser> open = MakeDeepSeekV3ReasoningParser({false, true});
  s = ParseAll(*open, "a</think>b");
  EXPECT_EQ(s.reasoning, "a");
  EXPECT_EQ(s.content, "b");
}

TEST(ThinkReasoningParserTest, HoldsBackAPossibleTagOnly) {
  ThinkReasoningParser parser(/*starts_in_reasoning=*/true);
  ReasoningSplit s;
  parser.Feed("<thi", &s);  // may be "<think>"
  EXPECT_EQ(s.reasoning, "");
  parser.Feed("nk>x </", &s);
  EXPECT_EQ(s.reasoning, "x ");
  parser.Feed("b>", &s);  // "</b>" is not "</think>"
  EXPECT_EQ(s.reasoning, "x </b>");
  parser.Finish(&s);
  EXPECT_EQ(s.content, "");
}

TEST(ThinkReasoningParserTest, PromptEndsInsideThink) {
  // R1's template ends the generation prompt with "<think>\n"; V3.1's with "<think>"
  // (thinking) or "</think>" (not); V3's with the assistant tag alone.
  EXPECT_TRUE(PromptEndsInsideThink("<｜User｜>hi<｜Assistant｜><think>\n"));
  EXPECT_TRUE(PromptEndsInsideThink("<｜User｜>hi<｜Assistant｜><think>"));
  EXPECT_FALSE(PromptEndsInsideThink("<｜User｜>hi<｜Assistant｜></think>"));
  EXPECT_FALSE(PromptEndsInsideThink("<｜User｜>hi<｜Assistant｜>"));
  EXPECT_FALSE(PromptEndsInsideThink("<｜Assistant｜><think>a</think>b<｜end▁of▁sentence｜><｜User｜>x<｜Assistant｜>"));
  EXPECT_TRUE(PromptEndsInsideThink("<think>a</think>b<｜User｜>x<｜Assistant｜><think>\n"));
}

}  // namespace
}  // namespace tandem::output_parsing
