// tool_choice "required" and a named function as constraints: request bodies through
// ParseRequest and ToolCallConstraint, compiled as the workers compile them, over a
// tokenizer whose DeepSeek tool-call markers are added (not special) tokens, as in
// DeepSeek-V3's tokenizer.json. The grammar takes well-formed calls and refuses wrong
// names, invalid arguments and text; what random walks through it write, the real
// DeepSeek tool-call parsers turn into complete calls with valid arguments.
#include "services/openai/tool_choice_constraint.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/grammar/grammar_compiler.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/grammar/vocabulary.h"
#include "engine/output_parsing/chat_output_parser.h"
#include "engine/output_parsing/deepseek_tool_call_parser.h"
#include "engine/tokenizer/byte_level_tokenizer_builder.h"
#include "engine/tokenizer/tokenizer.h"
#include "services/api/proto_convert.h"
#include "services/openai/openai_request.h"

namespace tandem::openai {
namespace {

namespace op = output_parsing;

constexpr int kBase = 600;

const char* kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "strict": true, "parameters": {"type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city"]}}},
  {"type": "function", "function": {"name": "ping"}},
  {"type": "function", "function": {"name": "add", "parameters": {"properties": {"a": {"type": "integer", "minimum": -100, "maximum": 100}},
    "required": ["a"], "additionalProperties": false}}}])";

std::unique_ptr<Tokenizer> MarkerTokenizer() {
  GeneratedTokenizerFiles files = BuildByteLevelTokenizer(kBase);
  nlohmann::json j = nlohmann::json::parse(files.tokenizer_json);
  int id = kBase;
  for (std::string_view m : {op::kDeepSeekToolCallsBegin, op::kDeepSeekToolCallsEnd, op::kDeepSeekToolCallBegin,
                             op::kDeepSeekToolCallEnd, op::kDeepSeekToolSep, std::string_view("</think>")}) {
    j["added_tokens"].push_back({{"id", id++}, {"content", std::string(m)}, {"single_word", false},
                                 {"lstrip", false}, {"rstrip", false}, {"normalized", true}, {"special", false}});
  }
  return *Tokenizer::FromJson(j.dump(), files.tokenizer_config_json);
}

class ToolChoiceConstraintTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tokenizer_ = MarkerTokenizer().release();
    compiler_ = new grammar::GrammarCompiler(grammar::GrammarVocabulary::FromTokenizer(*tokenizer_));
  }

  // The request's constraint for `parser`, or the 400.
  static std::variant<std::shared_ptr<const grammar::CompiledGrammar>, ApiError> Build(
      const std::string& extra_fields, std::string_view parser = "deepseek_v3", bool reasoning_first = false) {
    const Json body = Json::parse(std::string(R"({"messages": [{"role": "user", "content": "hi"}], "tools": )") +
                                  kTools + ", " + extra_fields + "}");
    std::variant<ParsedRequest, ApiError> r = ParseRequest(Endpoint::kChat, body, {});
    if (auto* e = std::get_if<ApiError>(&r)) return *e;
    const ParsedRequest& req = std::get<ParsedRequest>(r);
    EXPECT_TRUE(req.chat.parse_tool_calls);
    EXPECT_TRUE(req.chat.required_calls.has_value());
    if (!req.chat.required_calls) return ApiError{};
    v1::Constraint c;
    const ReasoningFirst reasoning{.on = reasoning_first, .end_is_a_token = true};
    if (auto e = ToolCallConstraint(*req.chat.required_calls, parser, &c, reasoning)) return *e;
    absl::StatusOr<OutputConstraint> o = FromProto(c);
    EXPECT_TRUE(o.ok()) << o.status();
    auto g = compiler_->CompileEbnf(o->text, o->root, o->json_rules, o->json, absl::InfiniteFuture());
    EXPECT_TRUE(g.ok()) << g.status() << "\n" << o->text;
    if (!g.ok()) return ApiError{};
    return *g;
  }
  static std::shared_ptr<const grammar::CompiledGrammar> Grammar(const std::string& extra,
                                                                 std::string_view parser = "deepseek_v3",
                                                                 bool reasoning_first = false) {
    auto g = Build(extra, parser, reasoning_first);
    if (auto* e = std::get_if<ApiError>(&g)) ADD_FAILURE() << e->message;
    return std::holds_alternative<ApiError>(g) ? nullptr : std::get<0>(g);
  }

  // Whether `text`, tokenized as the model's output would be, is a whole sentence.
  static bool Accepts(const std::shared_ptr<const grammar::CompiledGrammar>& g, std::string_view text) {
    grammar::GrammarMatcher m(g);
    for (int32_t id : tokenizer_->Encode(text, false)) {
      if (!m.AcceptToken(id)) return false;
    }
    return m.CanEnd();
  }

  // Whether `reasoning` spelled byte by byte (as a model may write any text, even a
  // tag's, with ordinary tokens), then `rest` tokenized, is a whole sentence.
  static bool AcceptsSpelled(const std::shared_ptr<const grammar::CompiledGrammar>& g, std::string_view reasoning,
                             std::string_view rest) {
    grammar::GrammarMatcher m(g);
    for (char c : reasoning) {
      for (int32_t id : tokenizer_->Encode(std::string_view(&c, 1), false)) {
        if (!m.AcceptToken(id)) return false;
      }
    }
    for (int32_t id : tokenizer_->Encode(rest, false)) {
      if (!m.AcceptToken(id)) return false;
    }
    return m.CanEnd();
  }

  // A random sentence of `g`: allowed tokens at random, EOS as soon as allowed.
  static std::string Walk(const std::shared_ptr<const grammar::CompiledGrammar>& g, std::mt19937& rng) {
    grammar::GrammarMatcher m(g);
    std::vector<int32_t> ids;
    std::vector<uint32_t> mask(g->vocabulary().mask_words());
    const int32_t eos = *tokenizer_->eos_id();
    for (int step = 0; step < 2000; ++step) {
      m.FillNextTokenBitmask(mask);
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < g->vocabulary().size(); ++id) {
        if ((mask[id >> 5] >> (id & 31)) & 1) allowed.push_back(id);
      }
      EXPECT_FALSE(allowed.empty());
      if (allowed.empty()) break;
      const bool can_end = std::find(allowed.begin(), allowed.end(), eos) != allowed.end();
      if (can_end && rng() % 2 == 0) return tokenizer_->Decode(ids, false);
      int32_t t = allowed[rng() % allowed.size()];
      if (t == eos) return tokenizer_->Decode(ids, false);
      EXPECT_TRUE(m.AcceptToken(t));
      ids.push_back(t);
    }
    ADD_FAILURE() << "no end after 2000 tokens: " << tokenizer_->Decode(ids, false);
    return "";
  }

  static Tokenizer* tokenizer_;
  static grammar::GrammarCompiler* compiler_;
};
Tokenizer* ToolChoiceConstraintTest::tokenizer_ = nullptr;
grammar::GrammarCompiler* ToolChoiceConstraintTest::compiler_ = nullptr;

std::string S(std::string_view s) { return std::string(s); }

std::string V3Call(std::string_view name, std::string_view args) {
  return S(op::kDeepSeekToolCallBegin) + "function" + S(op::kDeepSeekToolSep) + S(name) + "\n```json\n" + S(args) +
         "\n```" + S(op::kDeepSeekToolCallEnd);
}
std::string V3(const std::vector<std::string>& calls) {
  std::string out(op::kDeepSeekToolCallsBegin);
  for (size_t i = 0; i < calls.size(); ++i) out += (i > 0 ? "\n" : "") + calls[i];
  return out + std::string(op::kDeepSeekToolCallsEnd);
}

TEST_F(ToolChoiceConstraintTest, RequiredTakesWellFormedCallsAndRefusesTheRest) {
  const auto g = Grammar(R"("tool_choice": "required")");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Accepts(g, V3({V3Call("get_weather", R"({"city": "Paris", "days": 3})")})));
  EXPECT_TRUE(Accepts(g, V3({V3Call("get_weather", R"({"city": "Oslo"})"), V3Call("ping", "{}"),
                             V3Call("add", R"({"a": -12})"), V3Call("ping", R"({"x": [1, "y", null]})")})));
  // Wrong names, invalid arguments, text.
  EXPECT_FALSE(Accepts(g, V3({V3Call("get_wether", R"({"city": "Paris"})")})));
  EXPECT_FALSE(Accepts(g, V3({V3Call("get_weather", R"({"city": "Rome"})")})));
  EXPECT_FALSE(Accepts(g, V3({V3Call("get_weather", R"({"city": "Paris", "days": 9})")})));
  EXPECT_FALSE(Accepts(g, V3({V3Call("get_weather", R"({"days": 2})")}))) << "city is required";
  EXPECT_FALSE(Accepts(g, V3({V3Call("get_weather", R"({"city": "Paris", "x": 1})")}))) << "strict";
  EXPECT_FALSE(Accepts(g, V3({V3Call("add", R"({"a": 1.5})")})));
  EXPECT_FALSE(Accepts(g, V3({V3Call("add", R"({"a": 1, "b": 2})")})));
  EXPECT_FALSE(Accepts(g, V3({V3Call("ping", "[]")}))) << "no parameters: any object";
  EXPECT_FALSE(Accepts(g, V3({V3Call("ping", "")})));
  EXPECT_FALSE(Accepts(g, V3({})));
  EXPECT_FALSE(Accepts(g, "Sure. " + V3({V3Call("ping", "{}")})));
  EXPECT_FALSE(Accepts(g, V3({V3Call("ping", "{}")}) + " done"));
  // The markers' text, spelled out, is not the markers.
  grammar::GrammarMatcher m(g);
  EXPECT_FALSE(m.AcceptBytes(op::kDeepSeekToolCallsBegin));
}

TEST_F(ToolChoiceConstraintTest, NamedAndSingleAllowOneCall) {
  const auto named = Grammar(R"("tool_choice": {"type": "function", "function": {"name": "add"}})");
  ASSERT_NE(named, nullptr);
  EXPECT_TRUE(Accepts(named, V3({V3Call("add", R"({"a": 7})")})));
  EXPECT_FALSE(Accepts(named, V3({V3Call("ping", "{}")})));
  EXPECT_FALSE(Accepts(named, V3({V3Call("add", R"({"a": 7})"), V3Call("add", R"({"a": 8})")})));
  const auto single = Grammar(R"("tool_choice": "required", "parallel_tool_calls": false)");
  ASSERT_NE(single, nullptr);
  EXPECT_TRUE(Accepts(single, V3({V3Call("ping", "{}")})));
  EXPECT_FALSE(Accepts(single, V3({V3Call("ping", "{}"), V3Call("ping", "{}")})));
}

TEST_F(ToolChoiceConstraintTest, V31Format) {
  const auto g = Grammar(R"("tool_choice": "required")", "deepseek_v31");
  ASSERT_NE(g, nullptr);
  const auto call = [](std::string_view name, std::string_view args) {
    return S(op::kDeepSeekToolCallBegin) + S(name) + S(op::kDeepSeekToolSep) + S(args) + S(op::kDeepSeekToolCallEnd);
  };
  const std::string begin(op::kDeepSeekToolCallsBegin), end(op::kDeepSeekToolCallsEnd);
  EXPECT_TRUE(Accepts(g, begin + call("add", R"({"a": 1})") + call("ping", "{}") + end));
  EXPECT_FALSE(Accepts(g, begin + call("nope", "{}") + end));
  EXPECT_FALSE(Accepts(g, V3({V3Call("ping", "{}")})));
}

// What a model under the constraint writes, whatever it picks, the parser reads as
// complete calls to declared tools with valid arguments.
TEST_F(ToolChoiceConstraintTest, RandomSentencesParseIntoValidCalls) {
  const op::OutputParserRegistry registry = op::OutputParserRegistry::WithBuiltins();
  // The bounded tools, so that every walk ends; "ping"'s any-object is checked above.
  const std::string bounded =
      R"("tool_choice": {"type": "function", "function": {"name": "get_weather"}})";
  for (const char* parser : {"deepseek_v3", "deepseek_v31"}) {
    for (const std::string& extra : {bounded, std::string(R"("tool_choice": {"type": "function",
                                                           "function": {"name": "add"}})")}) {
      const auto g = Grammar(extra, parser);
      ASSERT_NE(g, nullptr);
      std::mt19937 rng(7);
      for (int walk = 0; walk < 25; ++walk) {
        const std::string text = Walk(g, rng);
        SCOPED_TRACE(text);
        absl::StatusOr<op::ParsedChatOutput> out = op::ParseChatOutput(registry, {.tool_call_parser = parser}, text);
        ASSERT_TRUE(out.ok()) << out.status();
        ASSERT_TRUE(out->tool_call_status.ok()) << out->tool_call_status;
        EXPECT_EQ(out->content, "");
        const std::vector<op::ParsedToolCall> calls = out->CompleteToolCalls();
        ASSERT_EQ(calls.size(), 1u);
        const Json args = Json::parse(calls[0].arguments, nullptr, false);
        ASSERT_TRUE(args.is_object()) << calls[0].arguments;
        if (calls[0].name == "get_weather") {
          ASSERT_TRUE(args.contains("city"));
          EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Oslo");
          for (const auto& [key, value] : args.items()) {
            EXPECT_TRUE(key == "city" || key == "days") << key;
            if (key == "days") EXPECT_TRUE(value.is_number_integer() && value >= 1 && value <= 7) << value;
          }
        } else {
          ASSERT_EQ(calls[0].name, "add");
          ASSERT_EQ(args.size(), 1u);
          EXPECT_TRUE(args["a"].is_number_integer());
        }
      }
    }
  }
}

// A model that reasons first: any reasoning that does not contain "</think>", then the
// tag (its token), up to two newlines and the calls. Checked exactly over 4,000 random reasoning
// texts drawn from the tag's own characters, written as tokenized (a tag inside becomes
// its token) and spelled byte by byte (accepted iff the text does not contain the tag:
// the tag overlaps itself nowhere, so its first occurrence is the closing one), and
// the reasoning parser splits every accepted output there, the calls parsed whole.
TEST_F(ToolChoiceConstraintTest, ReasoningFirstTakesAnyReasoningWithoutTheTagThenTheCalls) {
  const auto g = Grammar(R"("tool_choice": {"type": "function", "function": {"name": "get_weather"}})",
                         "deepseek_v3", /*reasoning_first=*/true);
  ASSERT_NE(g, nullptr);
  const std::string call = V3({V3Call("get_weather", R"({"city": "Oslo"})")});
  EXPECT_TRUE(Accepts(g, "The user wants Oslo. </thin <</think>\n\n" + call));
  EXPECT_TRUE(Accepts(g, "</think>" + call));  // no reasoning at all
  EXPECT_TRUE(Accepts(g, "ünïcode < / > </thinK> </think>\n" + call));
  EXPECT_FALSE(Accepts(g, "a</think>\n\n\n" + call));  // at most the two newlines R1 writes
  EXPECT_FALSE(Accepts(g, "a</think> " + call));
  EXPECT_FALSE(Accepts(g, "first</think>second</think>" + call));  // the tag ended reasoning
  EXPECT_FALSE(Accepts(g, "reasoning without an end " + call));
  EXPECT_FALSE(Accepts(g, "done</think>\nSome content " + call));  // only whitespace between
  const op::OutputParserRegistry registry = op::OutputParserRegistry::WithBuiltins();
  std::mt19937 rng(11);
  const std::string alphabet = "</think>x";
  int accepted = 0;
  for (int i = 0; i < 4000; ++i) {
    std::string text;
    const int n = static_cast<int>(rng() % 24);
    for (int k = 0; k < n; ++k) {
      text += rng() % 5 == 0 ? std::string("</think") : std::string(1, alphabet[rng() % alphabet.size()]);
    }
    const bool has_tag = text.find("</think>") != std::string::npos;
    const std::string output = text + "</think>\n" + call;
    ASSERT_EQ(Accepts(g, output), !has_tag) << text;  // a tag inside is its token
    ASSERT_EQ(AcceptsSpelled(g, text, "</think>\n" + call), !has_tag) << text;  // or its text
    if (has_tag) continue;
    ++accepted;
    absl::StatusOr<op::ParsedChatOutput> out = op::ParseChatOutput(
        registry, {.reasoning_parser = "deepseek_r1", .tool_call_parser = "deepseek_v3"}, output);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->reasoning, text);
    ASSERT_EQ(out->CompleteToolCalls().size(), 1u) << text;
    EXPECT_EQ(out->CompleteToolCalls()[0].name, "get_weather");
  }
  EXPECT_GT(accepted, 1000);
}

TEST_F(ToolChoiceConstraintTest, RefusalsAre400sNamingTheProblem) {
  struct Case {
    std::string extra, parser, param, says;
  };
  const std::vector<Case> cases = {
      {R"("tool_choice": "required")", "", "tool_choice", "--tool-call-parser"},
      {R"("tool_choice": "required")", "other", "tool_choice", "has no format"},
      {R"("tool_choice": {"type": "function", "function": {"name": "nope"}})", "deepseek_v3",
       "tool_choice.function.name", "no tool is named 'nope'"},
      {R"("tool_choice": {"type": "tool", "function": {"name": "add"}})", "deepseek_v3", "tool_choice.type", ""},
      {R"("tool_choice": {"type": "function"})", "deepseek_v3", "tool_choice.function", ""},
      {R"("tool_choice": "required", "parallel_tool_calls": 1)", "deepseek_v3", "parallel_tool_calls", ""},
      {R"("tool_choice": "required", "response_format": {"type": "json_object"})", "deepseek_v3", "tool_choice",
       "response_format"},
      {R"("tool_choice": "required", "structured_outputs": {"regex": "a"})", "deepseek_v3", "tool_choice", ""},
  };
  for (const Case& c : cases) {
    auto r = Build(c.extra, c.parser);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << c.extra;
    const ApiError& e = std::get<ApiError>(r);
    EXPECT_EQ(e.http_status, 400) << c.extra;
    EXPECT_EQ(e.param, c.param) << c.extra << ": " << e.message;
    EXPECT_NE(e.message.find(c.says), std::string::npos) << e.message;
  }
  // Tools the format cannot call.
  RequiredToolCalls calls;
  const Json bad_name = Json::parse(R"([{"type": "function", "function": {"name": "a b"}}])");
  std::optional<ApiError> e = ReadCallableTools(bad_name, "", &calls);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "tools[0].function.name");
  const Json not_object =
      Json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}])");
  e = ReadCallableTools(not_object, "", &calls);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "tools[0].function.parameters");
  // response_format "text" constrains nothing: no conflict.
  EXPECT_TRUE(std::holds_alternative<std::shared_ptr<const grammar::CompiledGrammar>>(
      Build(R"("tool_choice": "required", "response_format": {"type": "text"})")));
}

TEST_F(ToolChoiceConstraintTest, TheGrammarIsTheFormatsOwn) {
  RequiredToolCalls calls;
  ASSERT_FALSE(ReadCallableTools(Json::parse(kTools), "ping", &calls).has_value());
  calls.single = true;
  v1::Constraint c;
  ASSERT_FALSE(ToolCallConstraint(calls, "deepseek_v3", &c).has_value());
  EXPECT_EQ(c.ebnf().grammar(),
            "root ::= <｜tool▁calls▁begin｜> call <｜tool▁calls▁end｜>\n"
            "call ::= <｜tool▁call▁begin｜> \"function\" <｜tool▁sep｜> (\"ping\\x0A```json\\x0A\" tools-1-parameters) "
            "\"\\x0A```\" <｜tool▁call▁end｜>\n");
  ASSERT_EQ(c.ebnf().json_rules_size(), 1);
  EXPECT_EQ(c.ebnf().json_rules(0).name(), "tools-1-parameters");
  EXPECT_EQ(c.ebnf().json_rules(0).json_schema(), R"({"type":"object"})");
  EXPECT_FALSE(c.ebnf().json_rules(0).strict());
}

}  // namespace
}  // namespace tandem::openai
