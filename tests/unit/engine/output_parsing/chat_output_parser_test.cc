// The chat output parser over a corpus of DeepSeek outputs. Every output is parsed in one
// piece, one character at a time, split in two at every character boundary, and in
// random chunks (fixed seeds); every way must merge to the same result, and that result
// must equal the values written here by hand. The markers are spelled out here rather
// than taken from the headers, so a wrong marker there fails.
#include "engine/output_parsing/chat_output_parser.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace tandem::output_parsing {

void PrintTo(const ParsedChatOutput& p, std::ostream* os) {
  *os << "{reasoning=" << testing::PrintToString(p.reasoning) << " content=" << testing::PrintToString(p.content)
      << " status=" << p.tool_call_status.ToString() << " calls=[";
  for (const ParsedToolCall& c : p.tool_calls) {
    *os << "{" << c.id << " " << c.name << " " << testing::PrintToString(c.arguments)
        << (c.complete ? " complete" : " incomplete") << "}";
  }
  *os << "]}";
}

namespace {

const std::string kBegin = "<｜tool▁calls▁begin｜>";
const std::string kEnd = "<｜tool▁calls▁end｜>";
const std::string kCallBegin = "<｜tool▁call▁begin｜>";
const std::string kCallEnd = "<｜tool▁call▁end｜>";
const std::string kSep = "<｜tool▁sep｜>";

// A V3/R1 call, as DeepSeek-V3's chat template renders one.
std::string V3Call(const std::string& name, const std::string& args) {
  return kCallBegin + "function" + kSep + name + "\n```json\n" + args + "\n```" + kCallEnd;
}
// A V3.1 call, as DeepSeek-V3.1's chat template renders one.
std::string V31Call(const std::string& name, const std::string& args) {
  return kCallBegin + name + kSep + args + kCallEnd;
}

ChatOutputOptions R1() { return {"deepseek_r1", {}, "deepseek_v3"}; }
ChatOutputOptions R1NoTools() { return {"deepseek_r1", {}, ""}; }
ChatOutputOptions R1PromptClosed() { return {"deepseek_r1", {false, false}, "deepseek_v3"}; }
ChatOutputOptions V3() { return {"", {}, "deepseek_v3"}; }
ChatOutputOptions V31Thinking() { return {"deepseek_v3", {true, std::nullopt}, "deepseek_v31"}; }
ChatOutputOptions V31ThinkingPromptClosed() { return {"deepseek_v3", {true, false}, "deepseek_v31"}; }
ChatOutputOptions V31() { return {"deepseek_v3", {false, std::nullopt}, "deepseek_v31"}; }

struct ExpectedCall {
  std::string name;
  std::string arguments;  // exact text
  bool complete = true;
  nlohmann::json json;  // what `arguments` parses to (complete calls)
};

struct Case {
  std::string label;
  ChatOutputOptions options;
  std::string text;
  std::string reasoning;
  std::string content;
  std::vector<ExpectedCall> calls;
  absl::StatusCode status = absl::StatusCode::kOk;
};

std::vector<Case> Corpus() {
  using nlohmann::json;
  std::vector<Case> cases;
  cases.push_back({"r1_reasoning_only", R1(), "Okay, 2+2. Maybe 4.\nDouble-check: 4",
                   "Okay, 2+2. Maybe 4.\nDouble-check: 4", "", {}});
  cases.push_back({"r1_reasoning_then_content", R1(), "<think>\nThe user greets.\n</think>\n\nHello! How can I help?",
                   "\nThe user greets.\n", "\n\nHello! How can I help?", {}});
  cases.push_back({"r1_prompt_opened_think", R1(), "The user greets.\n</think>\n\nHi.", "The user greets.\n",
                   "\n\nHi.", {}});
  cases.push_back({"r1_prompt_closed_no_tags", R1PromptClosed(), "Just an answer.", "", "Just an answer.", {}});
  cases.push_back({"r1_prompt_closed_model_opens", R1PromptClosed(), "<think>hmm</think>Answer.", "hmm", "Answer.", {}});
  cases.push_back({"r1_unfinished_close_tag", R1(), "thinking </thi", "thinking </thi", "", {}});
  cases.push_back({"r1_second_think_is_text", R1(), "a</think>b<think>c</think>d", "a", "b<think>c</think>d", {}});
  cases.push_back({"v31_thinking_off_all_content", V31(), "Sure <think>x</think> done", "",
                   "Sure <think>x</think> done", {}});
  cases.push_back({"v31_thinking_truncated", V31Thinking(), "Let me think", "Let me think", "", {}});
  cases.push_back({"v31_thinking_model_opens", V31ThinkingPromptClosed(), "<think>hmm</think>answer", "hmm",
                   "answer", {}});
  cases.push_back({"v31_thinking_prompt_closed_plain", V31ThinkingPromptClosed(), "plain </think> text", "",
                   "plain </think> text", {}});

  cases.push_back({"v3_one_call", V3(),
                   kBegin + V3Call("get_weather", R"({"city": "Paris", "unit": "celsius"})") + kEnd, "", "",
                   {{"get_weather", R"({"city": "Paris", "unit": "celsius"})", true,
                     json{{"city", "Paris"}, {"unit", "celsius"}}}}});
  cases.push_back({"v3_two_calls", V3(),
                   kBegin + V3Call("get_weather", R"({"city": "Paris"})") + "\n" +
                       V3Call("get_time", R"({"tz": "Europe/Paris"})") + kEnd,
                   "", "",
                   {{"get_weather", R"({"city": "Paris"})", true, json{{"city", "Paris"}}},
                    {"get_time", R"({"tz": "Europe/Paris"})", true, json{{"tz", "Europe/Paris"}}}}});
  cases.push_back({"r1_calls_after_content", R1(),
                   "<think>Need the weather.</think>Let me check.\n\n" + kBegin +
                       V3Call("get_weather", R"({"city": "Oslo"})") + kEnd,
                   "Need the weather.", "Let me check.\n\n",
                   {{"get_weather", R"({"city": "Oslo"})", true, json{{"city", "Oslo"}}}}});
  cases.push_back({"r1_calls_inside_reasoning", R1(),
                   "I might call " + kBegin + V3Call("x", "{}") + kEnd + " but no.</think>No tools needed.",
                   "I might call " + kBegin + V3Call("x", "{}") + kEnd + " but no.", "No tools needed.", {}});
  cases.push_back({"v3_nested_args_and_whitespace", V3(),
                   kBegin + kCallBegin + "function" + kSep + "plot\n```json\n  {\n  \"a\": [1, -2.5e3, {\"b\": null}],\n"
                       "  \"c\": true, \"d\": \"q\\\"uote\\\\\"\n}  \n```  " + kCallEnd + "\n" + kEnd,
                   "", "",
                   {{"plot", "{\n  \"a\": [1, -2.5e3, {\"b\": null}],\n  \"c\": true, \"d\": \"q\\\"uote\\\\\"\n}", true,
                     json{{"a", json::array({1, -2500.0, json{{"b", nullptr}}})}, {"c", true}, {"d", "q\"uote\\"}}}}});
  cases.push_back({"v3_fence_and_lt_inside_string", V3(),
                   kBegin + V3Call("run", R"({"code": "```py\nprint(1<2)\n```", "x": "<｜tool"})") + kEnd, "", "",
                   {{"run", R"({"code": "```py\nprint(1<2)\n```", "x": "<｜tool"})", true,
                     json{{"code", "```py\nprint(1<2)\n```"}, {"x", "<｜tool"}}}}});
  cases.push_back({"v3_empty_args", V3(), kBegin + V3Call("ping", "{}") + kEnd, "", "",
                   {{"ping", "{}", true, json::object()}}});
  cases.push_back({"v3_section_end_missing", V3(), kBegin + V3Call("ping", "{}"), "", "",
                   {{"ping", "{}", true, json::object()}}});

  cases.push_back({"v31_two_calls", V31(),
                   "On it." + kBegin + V31Call("get_weather", R"({"city":"Lima"})") +
                       V31Call("get_time", R"({"tz":"America/Lima"})") + kEnd,
                   "", "On it.",
                   {{"get_weather", R"({"city":"Lima"})", true, json{{"city", "Lima"}}},
                    {"get_time", R"({"tz":"America/Lima"})", true, json{{"tz", "America/Lima"}}}}});
  cases.push_back({"v31_bare_call", V31(), V31Call("get_time", R"({"tz": "UTC"})"), "", "",
                   {{"get_time", R"({"tz": "UTC"})", true, json{{"tz", "UTC"}}}}});
  cases.push_back({"v31_text_after_section", V31(),
                   kBegin + V31Call("get_time", R"({"tz": "UTC"})") + kEnd + "\nAnything else?", "",
                   "\nAnything else?", {{"get_time", R"({"tz": "UTC"})", true, json{{"tz", "UTC"}}}}});
  cases.push_back({"v31_unicode", V31Thinking(),
                   "用户想知道东京的天气。</think>好的，我来查一下 🌤\n" + kBegin +
                       V31Call("get_weather", R"({"city": "東京", "note": "晴れ ☀ \u00e9 ü"})") + kEnd,
                   "用户想知道东京的天气。", "好的，我来查一下 🌤\n",
                   {{"get_weather", R"({"city": "東京", "note": "晴れ ☀ \u00e9 ü"})", true,
                     json{{"city", "東京"}, {"note", "晴れ ☀ é ü"}}}}});
  cases.push_back({"v3_unicode_content_and_args", V3(),
                   "Météo à Zürich — ça arrive 😀\n\n" + kBegin + V3Call("météo", R"({"ville": "Zürich", "emoji": "🌧"})") + kEnd,
                   "", "Météo à Zürich — ça arrive 😀\n\n",
                   {{"météo", R"({"ville": "Zürich", "emoji": "🌧"})", true, json{{"ville", "Zürich"}, {"emoji", "🌧"}}}}});
  cases.push_back({"no_tool_parser", R1NoTools(), "<think>x</think>" + kBegin + V3Call("f", "{}") + kEnd, "x",
                   kBegin + V3Call("f", "{}") + kEnd, {}});
  cases.push_back({"partial_marker_never_completed", V31(), "All done <｜tool▁ca", "", "All done <｜tool▁ca", {}});

  // Malformed and cut-off calls: the raw text goes to content, the status says why.
  const std::string bad_json = kBegin + V31Call("get_weather", R"({"city": "Paris",,})") + kEnd;
  cases.push_back({"v31_malformed_json", V31(), "Checking." + bad_json, "", "Checking." + bad_json,
                   {{"get_weather", R"({"city": "Paris",)", false, nullptr}},
                   absl::StatusCode::kInvalidArgument});
  const std::string bad_second = V31Call("get_time", R"({"tz": Europe})") + kEnd;
  cases.push_back({"v31_valid_then_malformed", V31(),
                   kBegin + V31Call("get_weather", R"({"city": "Rome"})") + bad_second, "", bad_second,
                   {{"get_weather", R"({"city": "Rome"})", true, json{{"city", "Rome"}}},
                    {"get_time", R"({"tz": )", false, nullptr}},
                   absl::StatusCode::kInvalidArgument});
  const std::string not_object = kBegin + V31Call("f", "[1, 2]") + kEnd;
  cases.push_back({"v31_args_not_object", V31(), not_object, "", not_object, {{"f", "", false, nullptr}},
                   absl::StatusCode::kInvalidArgument});
  const std::string early_end = kBegin + V31Call("f", R"({"a": "x)") + kEnd;
  cases.push_back({"v31_call_end_inside_json", V31(), early_end, "", early_end, {{"f", R"({"a": "x)", false, nullptr}},
                   absl::StatusCode::kInvalidArgument});
  const std::string bad_header = kBegin + kCallBegin + "function" + kSep + "two words\n```json\n{}\n```" + kCallEnd + kEnd;
  cases.push_back({"v3_bad_name", V3(), bad_header, "", bad_header, {}, absl::StatusCode::kInvalidArgument});
  const std::string garbage = "ok " + kBegin + "oops" + V3Call("f", "{}") + kEnd;
  cases.push_back({"v3_garbage_in_section", V3(), garbage, "", garbage, {}, absl::StatusCode::kInvalidArgument});
  const std::string cut_args = kBegin + kCallBegin + "function" + kSep + "get_weather\n```json\n{\"city\": \"Par";
  cases.push_back({"v3_truncated_in_arguments", V3(), cut_args, "", cut_args,
                   {{"get_weather", R"({"city": "Par)", false, nullptr}}, absl::StatusCode::kOutOfRange});
  const std::string cut_name = kBegin + kCallBegin + "function" + kSep + "get_wea";
  cases.push_back({"v3_truncated_in_name", V3(), cut_name, "", cut_name, {}, absl::StatusCode::kOutOfRange});
  const std::string cut_after_args = kBegin + V31Call("f", R"({"a": 1})").substr(0, kCallBegin.size() + 1 + kSep.size() + 8) + "<｜tool▁call";
  cases.push_back({"v31_truncated_before_call_end", V31(), cut_after_args, "", cut_after_args,
                   {{"f", R"({"a": 1})", false, nullptr}}, absl::StatusCode::kOutOfRange});
  cases.push_back({"v3_only_section_marker", V3(), "Hi" + kBegin, "", "Hi" + kBegin, {},
                   absl::StatusCode::kOutOfRange});
  return cases;
}

std::vector<size_t> CharBoundaries(const std::string& s) {
  std::vector<size_t> out;
  for (size_t i = 1; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) out.push_back(i);
  }
  return out;
}

ToolCallIdSource CountingIds() {
  return [n = 0]() mutable { return "call_" + std::to_string(n++); };
}

ChatOutputParser MakeParser(const ChatOutputOptions& options) {
  static const OutputParserRegistry registry = OutputParserRegistry::WithBuiltins();
  absl::StatusOr<ChatOutputParser> parser = ChatOutputParser::Create(registry, options, CountingIds());
  EXPECT_TRUE(parser.ok()) << parser.status();
  return *std::move(parser);
}

// The order every delta must keep: calls in index order, one piece per call, a call's
// id and name on its first piece only.
void CheckDelta(const OutputDelta& delta, int* calls_seen, const std::string& where) {
  int last = -1;
  for (const ToolCallDelta& piece : delta.tool_calls) {
    EXPECT_GT(piece.index, last) << where;
    last = piece.index;
    if (piece.index == *calls_seen) {
      EXPECT_FALSE(piece.name.empty()) << where;
      EXPECT_EQ(piece.id, "call_" + std::to_string(piece.index)) << where;
      ++*calls_seen;
    } else {
      EXPECT_LT(piece.index, *calls_seen) << where;
      EXPECT_TRUE(piece.name.empty()) << where;
      EXPECT_TRUE(piece.id.empty()) << where;
    }
  }
}

// Feeds `text` cut at `cuts` (increasing byte offsets) and merges the deltas.
ParsedChatOutput FeedInPieces(const ChatOutputOptions& options, const std::string& text,
                              const std::vector<size_t>& cuts, const std::string& where) {
  ChatOutputParser parser = MakeParser(options);
  ParsedChatOutput out;
  int calls_seen = 0;
  size_t from = 0;
  std::vector<size_t> ends = cuts;
  ends.push_back(text.size());
  for (size_t end : ends) {
    const OutputDelta delta = parser.Feed(std::string_view(text).substr(from, end - from));
    CheckDelta(delta, &calls_seen, where);
    MergeDelta(delta, &out);
    from = end;
  }
  const ChatOutputFinish finish = parser.Finish();
  CheckDelta(finish.delta, &calls_seen, where);
  MergeFinish(finish.delta, finish.tool_calls, &out);
  return out;
}

void ExpectMatchesHandWritten(const Case& c, const ParsedChatOutput& got) {
  EXPECT_EQ(got.reasoning, c.reasoning);
  EXPECT_EQ(got.content, c.content);
  EXPECT_EQ(got.tool_call_status.code(), c.status) << got.tool_call_status;
  ASSERT_EQ(got.tool_calls.size(), c.calls.size());
  for (size_t i = 0; i < c.calls.size(); ++i) {
    const ParsedToolCall& call = got.tool_calls[i];
    EXPECT_EQ(call.id, "call_" + std::to_string(i));
    EXPECT_EQ(call.name, c.calls[i].name);
    EXPECT_EQ(call.arguments, c.calls[i].arguments);
    EXPECT_EQ(call.complete, c.calls[i].complete);
    if (c.calls[i].complete) {
      const nlohmann::json parsed = nlohmann::json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
      ASSERT_FALSE(parsed.is_discarded()) << call.arguments;
      EXPECT_EQ(parsed, c.calls[i].json) << call.arguments;
    }
  }
  EXPECT_EQ(got.HasCompleteToolCall(),
            std::any_of(c.calls.begin(), c.calls.end(), [](const ExpectedCall& e) { return e.complete; }));
}

class CorpusTest : public testing::TestWithParam<Case> {};

TEST_P(CorpusTest, OnePieceMatchesHandWrittenValues) {
  const Case& c = GetParam();
  ChatOutputParser parser = MakeParser(c.options);
  ExpectMatchesHandWritten(c, ParseWholeOutput(parser, c.text));
}

TEST_P(CorpusTest, OneCharacterAtATimeMergesToTheSame) {
  const Case& c = GetParam();
  ChatOutputParser parser = MakeParser(c.options);
  const ParsedChatOutput whole = ParseWholeOutput(parser, c.text);
  const ParsedChatOutput pieces = FeedInPieces(c.options, c.text, CharBoundaries(c.text), "per character");
  EXPECT_EQ(pieces, whole);
  ExpectMatchesHandWritten(c, pieces);
}

TEST_P(CorpusTest, EveryTwoWaySplitMergesToTheSame) {
  const Case& c = GetParam();
  ChatOutputParser parser = MakeParser(c.options);
  const ParsedChatOutput whole = ParseWholeOutput(parser, c.text);
  for (size_t cut : CharBoundaries(c.text)) {
    const ParsedChatOutput pieces = FeedInPieces(c.options, c.text, {cut}, "cut at " + std::to_string(cut));
    ASSERT_EQ(pieces, whole) << "cut at byte " << cut;
  }
}

TEST_P(CorpusTest, RandomChunksMergeToTheSame) {
  const Case& c = GetParam();
  ChatOutputParser parser = MakeParser(c.options);
  const ParsedChatOutput whole = ParseWholeOutput(parser, c.text);
  const std::vector<size_t> boundaries = CharBoundaries(c.text);
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> step(1, 12);  // characters per chunk
    std::vector<size_t> cuts;
    for (size_t i = static_cast<size_t>(step(rng)) - 1; i < boundaries.size(); i += step(rng)) {
      cuts.push_back(boundaries[i]);
    }
    const ParsedChatOutput pieces = FeedInPieces(c.options, c.text, cuts, "seed " + std::to_string(seed));
    ASSERT_EQ(pieces, whole) << "seed " << seed;
  }
}

INSTANTIATE_TEST_SUITE_P(DeepSeek, CorpusTest, testing::ValuesIn(Corpus()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.label; });

// A delta that completes several calls yields all of them from that Feed, not one per
// later Feed; Finish has nothing left to add.
TEST(ChatOutputParserTest, OneDeltaWithSeveralCallsYieldsThemAll) {
  for (const ChatOutputOptions& options : {V3(), V31()}) {
    const bool v3 = options.tool_call_parser == "deepseek_v3";
    auto call = v3 ? V3Call : V31Call;
    const std::string text = "x" + kBegin + call("a", R"({"i": 1})") + call("b", R"({"i": 2})") +
                             call("c", R"({"i": 3})") + kEnd;
    ChatOutputParser parser = MakeParser(options);
    const OutputDelta delta = parser.Feed(text);
    EXPECT_EQ(delta.content, "x");
    ASSERT_EQ(delta.tool_calls.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(delta.tool_calls[i].index, i);
      EXPECT_EQ(delta.tool_calls[i].name, std::string(1, static_cast<char>('a' + i)));
      EXPECT_EQ(delta.tool_calls[i].arguments, "{\"i\": " + std::to_string(i + 1) + "}");
    }
    const ChatOutputFinish finish = parser.Finish();
    EXPECT_TRUE(finish.delta.empty());
    EXPECT_EQ(finish.tool_calls.complete, std::vector<bool>({true, true, true}));
    EXPECT_TRUE(finish.tool_calls.status.ok());
  }
}

// The name comes out as soon as it is complete, and argument bytes as soon as they are
// known to be arguments, before the call ends.
TEST(ChatOutputParserTest, StreamsNameThenArgumentFragments) {
  ChatOutputParser parser = MakeParser(V31());
  OutputDelta d = parser.Feed(kBegin + kCallBegin + "get_weather");
  EXPECT_TRUE(d.empty());
  d = parser.Feed(kSep + R"({"city": "Par)");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(d.tool_calls[0].id, "call_0");
  EXPECT_EQ(d.tool_calls[0].arguments, R"({"city": "Par)");
  d = parser.Feed(R"(is"})");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "");
  EXPECT_EQ(d.tool_calls[0].arguments, R"(is"})");
  d = parser.Feed(kCallEnd + kEnd);
  EXPECT_TRUE(d.empty());
  const ChatOutputFinish finish = parser.Finish();
  EXPECT_EQ(finish.tool_calls.complete, std::vector<bool>({true}));
}

// Text that may begin a marker is held back only while it may; ordinary text flows.
TEST(ChatOutputParserTest, HoldsBackOnlyPossibleMarkers) {
  ChatOutputParser parser = MakeParser(V31());
  EXPECT_EQ(parser.Feed("a < b <｜tool").content, "a < b ");
  EXPECT_EQ(parser.Feed("box").content, "<｜toolbox");
}

TEST(ChatOutputParserTest, UnknownParserNamesAreClearErrors) {
  const OutputParserRegistry registry = OutputParserRegistry::WithBuiltins();
  absl::StatusOr<ChatOutputParser> p = ChatOutputParser::Create(registry, {"deepseek_r2", {}, ""});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(p.status().message().find("deepseek_r1, deepseek_v3"), std::string::npos) << p.status();
  p = ChatOutputParser::Create(registry, {"", {}, "hermes"});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("deepseek_v3, deepseek_v31"), std::string::npos) << p.status();
}

TEST(ChatOutputParserTest, ParseChatOutputIsTheOnePieceParse) {
  const OutputParserRegistry registry = OutputParserRegistry::WithBuiltins();
  const std::string text = "<think>r</think>c" + kBegin + V3Call("f", R"({"k": [1]})") + kEnd;
  absl::StatusOr<ParsedChatOutput> parsed = ParseChatOutput(registry, R1(), text, CountingIds());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->reasoning, "r");
  EXPECT_EQ(parsed->content, "c");
  ASSERT_EQ(parsed->CompleteToolCalls().size(), 1u);
  EXPECT_EQ(parsed->CompleteToolCalls()[0].arguments, R"({"k": [1]})");
}

}  // namespace
}  // namespace tandem::output_parsing
