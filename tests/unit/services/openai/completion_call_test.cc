// A chat or text completion's answer as the OpenAI API gives it, over the real request
// core with a fake aggregated worker whose output the test scripts: SSE events (role
// first, content, reasoning under both field names, tool calls as a name then argument
// fragments, one finish reason, usage, [DONE]) and whole bodies; the parsers are the real
// ones (engine/output_parsing). Checked against values written here by hand.
#include "services/openai/completion_call.h"

#include <gtest/gtest.h>

#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "engine/tokenizer/byte_level_tokenizer_builder.h"
#include "tests/unit/services/api/request_core_fakes.h"

namespace tandem::openai {
namespace {

using tandem::testing::FakeClock;
using tandem::testing::FakeCluster;
using tandem::testing::FakeReplica;

const Tokenizer& TestTokenizer() {
  static const Tokenizer* tokenizer = [] {
    const GeneratedTokenizerFiles files = BuildByteLevelTokenizer(2000);
    auto t = Tokenizer::FromJson(files.tokenizer_json, files.tokenizer_config_json);
    EXPECT_TRUE(t.ok()) << t.status();
    return t->release();
  }();
  return *tokenizer;
}

// Records what the call sends.
class FakeExchange final : public http::Exchange {
 public:
  void Respond(int s, std::string content_type, std::string b, http::Headers) override {
    std::lock_guard<std::mutex> lock(mu);
    status = s;
    type = std::move(content_type);
    body = std::move(b);
    ended = true;
  }
  void StartStream(int s, std::string content_type, http::Headers) override {
    std::lock_guard<std::mutex> lock(mu);
    status = s;
    type = std::move(content_type);
  }
  bool Send(std::string data) override {
    std::lock_guard<std::mutex> lock(mu);
    body += data;
    return true;
  }
  void EndStream() override {
    std::lock_guard<std::mutex> lock(mu);
    ended = true;
  }
  void SetHandlers(std::function<void()>, std::function<void()>) override {}

  // The stream's events, [DONE] excluded (checked to be last).
  std::vector<Json> Events() {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<Json> out;
    EXPECT_TRUE(absl::EndsWith(body, "data: [DONE]\n\n")) << body;
    for (absl::string_view part : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
      EXPECT_TRUE(absl::StartsWith(part, "data: ")) << part;
      if (part == "data: [DONE]") continue;
      out.push_back(Json::parse(std::string(part.substr(6))));
    }
    return out;
  }

  std::mutex mu;
  int status = 0;
  std::string type;
  std::string body;
  bool ended = false;
};

class CompletionCallTest : public ::testing::Test {
 protected:
  CompletionCallTest() {
    config_.vocab_size = 2000;
    config_.max_position_embeddings = 4096;
    core_ = RequestCoreContext{.cluster = &cluster_, .clock = &clock_, .tokenizer = &TestTokenizer(),
                               .config = &config_, .model_name = "m", .layout_fingerprint = 7};
    worker_ = cluster_.Add(v1::ROLE_BOTH, "w0");
    ctx_ = CompletionContext{.core = &core_, .tokenizer = &TestTokenizer(), .served_model = "m",
                             .context_tokens = 4096, .vocab_size = 2000, .max_prompt_bytes = 1 << 20,
                             .unix_seconds = [] { return int64_t{1700000000}; }, .parsers = &parsers_};
  }

  ParsedRequest Chat(bool stream) {
    ParsedRequest r;
    r.endpoint = Endpoint::kChat;
    r.stream = stream;
    r.include_usage = stream;
    v1::ChatMessage* m = r.prompts.emplace_back().mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content("weather?");
    r.max_tokens = 64;
    return r;
  }

  // The worker's stream sends `pieces` of text, one token each, the last one ending it.
  void Script(const std::vector<std::string>& pieces, v1::FinishReason reason = v1::FINISH_REASON_STOP) {
    ASSERT_EQ(worker_->streams.size(), 1u);
    FakeReplica::Stream& s = *worker_->streams[0];
    for (size_t i = 0; i < pieces.size(); ++i) {
      ASSERT_GT(s.reads.load(), 0);
      --s.reads;
      v1::GenerateResponse m;
      m.add_token_ids(100 + static_cast<int>(i));
      m.set_text(pieces[i]);
      if (i + 1 == pieces.size()) {
        m.set_finish_reason(reason);
        m.mutable_usage()->set_prompt_tokens(9);
        m.mutable_usage()->set_completion_tokens(static_cast<int>(pieces.size()));
      }
      s.handlers.on_message(std::move(m));
    }
    s.ended = true;
    s.handlers.on_done(absl::OkStatus());
  }

  const output_parsing::OutputParserRegistry parsers_ = output_parsing::OutputParserRegistry::WithBuiltins();
  ModelInfo config_;
  FakeCluster cluster_;
  FakeClock clock_;
  RequestCoreContext core_;
  std::shared_ptr<FakeReplica> worker_;
  CompletionContext ctx_;
};

const std::vector<std::string> kToolCallOutput = {
    "Let me check.", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "function", "<｜tool▁sep｜>",
    "get_weather\n```json\n{\"city\": ", "\"Paris\", \"days\": 3}", "\n```", "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>"};

TEST_F(CompletionCallTest, StreamedToolCallIsANameThenArgumentFragments) {
  ctx_.tool_call_parser = "deepseek_v3";
  ParsedRequest r = Chat(/*stream=*/true);
  r.chat.parse_tool_calls = true;
  auto exchange = std::make_shared<FakeExchange>();
  StartCompletion(ctx_, std::move(r), "abc", exchange);
  Script(kToolCallOutput);
  ASSERT_TRUE(exchange->ended);
  EXPECT_EQ(exchange->status, 200);
  EXPECT_EQ(exchange->type, "text/event-stream");
  const std::vector<Json> events = exchange->Events();
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  std::string content, arguments, name, id;
  int name_pieces = 0, finishes = 0;
  std::string finish_reason;
  for (const Json& e : events) {
    EXPECT_EQ(e["id"], "chatcmpl-abc");
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    if (e["choices"].empty()) {  // the usage event
      EXPECT_EQ(e["usage"]["completion_tokens"], static_cast<int>(kToolCallOutput.size()));
      continue;
    }
    const Json& c = e["choices"][0];
    if (!c["finish_reason"].is_null()) {
      ++finishes;
      finish_reason = c["finish_reason"];
    }
    const Json& d = c["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) {
      for (const Json& t : d["tool_calls"]) {
        EXPECT_EQ(t["index"], 0);
        if (t.contains("id")) {
          id = t["id"];
          EXPECT_EQ(t["type"], "function");
        }
        if (t["function"].contains("name")) {
          ++name_pieces;
          name = t["function"]["name"];
        }
        arguments += t["function"]["arguments"].get<std::string>();
      }
    }
  }
  EXPECT_EQ(content, "Let me check.");
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(name_pieces, 1);
  EXPECT_TRUE(absl::StartsWith(id, "call_")) << id;
  EXPECT_EQ(Json::parse(arguments), Json::parse(R"({"city": "Paris", "days": 3})")) << arguments;
  EXPECT_EQ(finishes, 1);
  EXPECT_EQ(finish_reason, "tool_calls");
}

TEST_F(CompletionCallTest, WholeBodyCarriesTheSameToolCallAndNullContentWhenThereIsNone) {
  ctx_.tool_call_parser = "deepseek_v3";
  ParsedRequest r = Chat(/*stream=*/false);
  r.chat.parse_tool_calls = true;
  auto exchange = std::make_shared<FakeExchange>();
  StartCompletion(ctx_, std::move(r), "xyz", exchange);
  std::vector<std::string> only_call(kToolCallOutput.begin() + 1, kToolCallOutput.end());
  Script(only_call);
  ASSERT_TRUE(exchange->ended);
  ASSERT_EQ(exchange->status, 200) << exchange->body;
  const Json body = Json::parse(exchange->body);
  const Json& message = body["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null()) << message;
  ASSERT_EQ(message["tool_calls"].size(), 1u) << message;
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(Json::parse(message["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            Json::parse(R"({"city": "Paris", "days": 3})"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(body["usage"]["completion_tokens"], static_cast<int>(only_call.size()));
}

TEST_F(CompletionCallTest, WithoutToolsTheMarkersAreContent) {
  ctx_.tool_call_parser = "deepseek_v3";  // configured, but the request offers no tools
  auto exchange = std::make_shared<FakeExchange>();
  StartCompletion(ctx_, Chat(/*stream=*/false), "t", exchange);
  Script(kToolCallOutput);
  const Json body = Json::parse(exchange->body);
  std::string all;
  for (const auto& p : kToolCallOutput) all += p;
  EXPECT_EQ(body["choices"][0]["message"]["content"], all);
  EXPECT_FALSE(body["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
}

TEST_F(CompletionCallTest, ReasoningGoesToBothFieldsOrNowhere) {
  ctx_.reasoning_parser = "deepseek_r1";
  for (const bool include : {true, false}) {
    worker_->streams.clear();
    ParsedRequest r = Chat(/*stream=*/true);
    r.include_reasoning = include;
    auto exchange = std::make_shared<FakeExchange>();
    StartCompletion(ctx_, std::move(r), "r", exchange);
    // R1's template opens <think> in the prompt: the output starts inside reasoning.
    Script({"Paris is ", "sunny.</th", "ink>It is sunny", " in Paris."});
    std::string reasoning, reasoning_alias, content;
    for (const Json& e : exchange->Events()) {
      if (e["choices"].empty()) continue;
      const Json& d = e["choices"][0]["delta"];
      if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("reasoning")) reasoning_alias += d["reasoning"].get<std::string>();
      if (d.contains("content")) content += d["content"].get<std::string>();
    }
    EXPECT_EQ(reasoning, include ? "Paris is sunny." : "") << include;
    EXPECT_EQ(reasoning_alias, reasoning);
    EXPECT_EQ(content, "It is sunny in Paris.");
  }
}

TEST_F(CompletionCallTest, RequiredToolCallsTravelAsTheFormatsGrammar) {
  ParsedRequest r = Chat(/*stream=*/false);
  r.chat.parse_tool_calls = true;
  r.chat.required_calls = RequiredToolCalls{.tools = {{.index = 0, .name = "get_weather",
                                                       .parameters = R"({"type":"object"})"}},
                                            .single = true};
  // Without a tool-call parser there is no format to hold the output to.
  auto refused = std::make_shared<FakeExchange>();
  StartCompletion(ctx_, r, "a", refused);
  EXPECT_EQ(refused->status, 400);
  EXPECT_TRUE(absl::StrContains(refused->body, "--tool-call-parser")) << refused->body;
  EXPECT_TRUE(worker_->streams.empty());
  // A model that reasons first: the calls come after the reasoning's end.
  ctx_.tool_call_parser = "deepseek_v3";
  ctx_.reasoning_parser = "deepseek_r1";
  auto reasoning = std::make_shared<FakeExchange>();
  StartCompletion(ctx_, r, "b", reasoning);
  ASSERT_EQ(worker_->streams.size(), 1u);
  const v1::Constraint& after_reasoning = worker_->streams[0]->generate_req.constraint();
  ASSERT_TRUE(after_reasoning.has_ebnf());
  // (This tokenizer has no "</think>" token: the tag is text.)
  EXPECT_TRUE(absl::StrContains(after_reasoning.ebnf().grammar(),
                                "root ::= reasoning \"</think>\" \"\\n\"? \"\\n\"? <｜tool▁calls▁begin｜> call"))
      << after_reasoning.ebnf().grammar();
  worker_->streams.clear();

  ctx_.reasoning_parser = "deepseek_v3";  // reasons only when asked to
  auto exchange = std::make_shared<FakeExchange>();
  StartCompletion(ctx_, r, "c", exchange);
  ASSERT_EQ(worker_->streams.size(), 1u);
  const v1::Constraint& c = worker_->streams[0]->generate_req.constraint();
  ASSERT_TRUE(c.has_ebnf());
  EXPECT_TRUE(absl::StrContains(c.ebnf().grammar(), "<｜tool▁calls▁begin｜> call <｜tool▁calls▁end｜>"))
      << c.ebnf().grammar();
  ASSERT_EQ(c.ebnf().json_rules_size(), 1);
  EXPECT_EQ(c.ebnf().json_rules(0).json_schema(), R"({"type":"object"})");
  std::vector<std::string> only_call(kToolCallOutput.begin() + 1, kToolCallOutput.end());
  Script(only_call);
  const Json body = Json::parse(exchange->body);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
  ASSERT_EQ(body["choices"][0]["message"]["tool_calls"].size(), 1u) << body;
}

}  // namespace
}  // namespace tandem::openai
