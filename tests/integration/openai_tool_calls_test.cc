// Tool calls as the official OpenAI Node SDK reads them (tests/integration/openai/
// sdk_tool_calls.mjs), served by the real HTTP API (services/http, services/openai) over
// the real request core, with the built-in tiny model's tokenizer and chat template (the
// V3 template) and the real DeepSeek-V3 tool-call parser. The replica is scripted: a
// random-weight model does not write tool calls, so this replica answers with the text a
// model that calls get_weather writes, as a worker's Generate stream carries it, and
// records the prompts it was sent. What the SDK checks: the call whole and streamed (its
// own accumulator), finish_reason tool_calls, the call sent back with its result; what
// this side checks: that round trip's prompt shows the model the call and the result as
// the template renders them.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/model/model_config.h"
#include "engine/output_parsing/parser_registry.h"
#include "services/api/proto_convert.h"
#include "services/openai/openai_server.h"
#include "services/router/grpc_downstream.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/subprocess.h"

namespace tandem {
namespace {

// Runs the replica's answers on one thread, as a worker's stream answers on gRPC's.
class Worker {
 public:
  Worker() : thread_([this] { Run(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Post(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(f));
    }
    cv_.notify_all();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      std::function<void()> f = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      f();
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// One Generate stream: a piece of text per message, each when the core asks for it.
class ScriptedStream final : public DownstreamStream, public std::enable_shared_from_this<ScriptedStream> {
 public:
  ScriptedStream(std::vector<std::string> pieces, int prompt_tokens, StreamHandlers h, Worker* worker)
      : pieces_(std::move(pieces)), prompt_tokens_(prompt_tokens), handlers_(std::move(h)), worker_(worker) {}
  void Read() override {
    worker_->Post([self = shared_from_this()] { self->SendNext(); });
  }
  void Cancel() override {
    worker_->Post([self = shared_from_this()] { self->End(absl::CancelledError("cancelled")); });
  }

 private:
  void SendNext() {
    if (ended_) return;
    const size_t i = next_++;
    v1::GenerateResponse m;
    m.add_token_ids(100 + static_cast<int32_t>(i));
    m.set_text(pieces_[i]);
    const bool last = i + 1 == pieces_.size();
    if (last) {
      m.set_finish_reason(v1::FINISH_REASON_STOP);
      m.mutable_usage()->set_prompt_tokens(prompt_tokens_);
      m.mutable_usage()->set_completion_tokens(static_cast<int32_t>(pieces_.size()));
    }
    handlers_.on_message(std::move(m));
    if (last) End(absl::OkStatus());
  }
  void End(absl::Status s) {
    if (ended_) return;
    ended_ = true;
    handlers_.on_done(std::move(s));
  }
  const std::vector<std::string> pieces_;
  const int prompt_tokens_;
  StreamHandlers handlers_;
  Worker* const worker_;
  size_t next_ = 0;
  bool ended_ = false;  // on the worker's thread only
};

class StreamHandle final : public DownstreamStream {
 public:
  explicit StreamHandle(std::shared_ptr<ScriptedStream> s) : s_(std::move(s)) {}
  void Read() override { s_->Read(); }
  void Cancel() override { s_->Cancel(); }

 private:
  std::shared_ptr<ScriptedStream> s_;
};

// An aggregated replica: text then a get_weather call, or, once the prompt carries a
// tool's output, a plain answer.
class ScriptedReplica final : public ReplicaHandle {
 public:
  explicit ScriptedReplica(const Tokenizer* tokenizer) : tokenizer_(tokenizer) {}
  const std::string& id() const override { return id_; }
  bool IsLost() const override { return false; }
  int WaitingHere() const override { return 0; }
  void AddWaiting(int) override {}
  std::unique_ptr<PendingCall> Reserve(const CallOptions&, const v1::ReserveRequest&,
                                       std::function<void(absl::StatusOr<v1::ReserveResponse>)>) override {
    ADD_FAILURE() << "an aggregated replica is not reserved";
    return nullptr;
  }
  void Release(const CallOptions&, const std::string&, uint64_t) override {}
  std::unique_ptr<PendingCall> Prefill(const CallOptions&, const v1::PrefillRequest&,
                                       std::function<void(absl::StatusOr<v1::PrefillResponse>)>) override {
    ADD_FAILURE() << "an aggregated replica does not prefill for others";
    return nullptr;
  }
  std::unique_ptr<DownstreamStream> Decode(const CallOptions&, const v1::DecodeRequest&, StreamHandlers) override {
    ADD_FAILURE() << "an aggregated replica does not decode for others";
    return nullptr;
  }
  std::unique_ptr<DownstreamStream> Generate(const CallOptions&, const v1::GenerateRequest& r,
                                             StreamHandlers h) override {
    const std::vector<int32_t> ids(r.token_ids().ids().begin(), r.token_ids().ids().end());
    const std::string prompt = tokenizer_->Decode(ids, /*skip_special_tokens=*/false);
    {
      std::lock_guard<std::mutex> lock(mu);
      prompts.push_back(prompt);
    }
    std::vector<std::string> pieces =
        absl::StrContains(prompt, "<｜tool▁output▁begin｜>")
            ? std::vector<std::string>{"Sunny all ", "three days."}
            : std::vector<std::string>{"Let me check.", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "function",
                                       "<｜tool▁sep｜>", "get_weather\n```json\n{\"city\": ", "\"Paris\", \"days\": 3}",
                                       "\n```", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"};
    return std::make_unique<StreamHandle>(
        std::make_shared<ScriptedStream>(std::move(pieces), static_cast<int>(ids.size()), std::move(h), &worker_));
  }

  std::mutex mu;
  std::vector<std::string> prompts;

 private:
  const std::string id_ = "scripted-0";
  const Tokenizer* tokenizer_;
  Worker worker_;
};

class OneReplica final : public ClusterView {
 public:
  explicit OneReplica(std::shared_ptr<ScriptedReplica> r) : r_(std::move(r)) {}
  int Count(v1::Role role) override { return role == v1::ROLE_BOTH ? 1 : 0; }
  std::shared_ptr<ReplicaHandle> Pick(v1::Role role, std::span<const uint64_t>,
                                      const std::vector<std::string>& exclude) override {
    if (role != v1::ROLE_BOTH || !exclude.empty()) return nullptr;
    return r_;
  }

 private:
  std::shared_ptr<ScriptedReplica> r_;
};

TEST(OpenAiToolCallsTest, TheOpenAiNodeSdkReadsToolCallsAndSendsTheirResultsBack) {
  const char* src = std::getenv("TANDEM_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  const std::string dir = testing::TinyModelDir();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromDir(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  absl::StatusOr<std::unique_ptr<ModelChatTemplates>> templates = LoadChatTemplates(dir);
  ASSERT_TRUE(templates.ok() && *templates != nullptr);
  absl::StatusOr<ModelConfig> config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();

  auto replica = std::make_shared<ScriptedReplica>(tokenizer->get());
  OneReplica cluster(replica);
  GrpcAlarmClock clock;
  RequestCoreContext core{.cluster = &cluster, .clock = &clock, .tokenizer = tokenizer->get(),
                          .chat_templates = templates->get(), .config = &*config, .model_name = "tiny"};
  const output_parsing::OutputParserRegistry parsers = output_parsing::OutputParserRegistry::WithBuiltins();
  openai::CompletionContext context{.core = &core, .tokenizer = tokenizer->get(), .served_model = "tiny",
                                    .context_tokens = config->max_position_embeddings,
                                    .vocab_size = config->vocab_size, .max_prompt_bytes = kDefaultMaxPromptBytes,
                                    .unix_seconds = [] { return int64_t{1700000000}; }, .parsers = &parsers,
                                    .tool_call_parser = "deepseek_v3"};
  absl::StatusOr<std::unique_ptr<openai::OpenAiServer>> server =
      openai::OpenAiServer::Start("127.0.0.1:0", {}, context, &*config, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();

  testing::ProcessResult r = testing::RunProcess(
      {"/usr/bin/env", "node", absl::StrCat(src, "/tests/integration/openai/sdk_tool_calls.mjs"),
       absl::StrCat("http://", (*server)->bound_address(), "/v1"), "tiny"},
      {}, 120);
  std::fprintf(stderr, "%s", r.err.c_str());
  ASSERT_EQ(r.exit_code, 0) << r.err;

  std::lock_guard<std::mutex> lock(replica->mu);
  ASSERT_EQ(replica->prompts.size(), 4u);
  // The round trip: the template showed the model its call and the tool's output.
  const std::string& round_trip = replica->prompts[2];
  EXPECT_TRUE(absl::StrContains(round_trip, "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                                            "{\"city\": \"Paris\", \"days\": 3}\n```<｜tool▁call▁end｜>"))
      << round_trip;
  EXPECT_TRUE(absl::StrContains(round_trip, "<｜tool▁output▁begin｜>{\"forecast\": \"sunny\"}<｜tool▁output▁end｜>"))
      << round_trip;
  // DeepSeek-V3's template shows no tool definitions, so the whole and the streamed
  // request had the same prompt.
  EXPECT_EQ(replica->prompts[0], replica->prompts[1]);
  (*server)->Stop();
}

}  // namespace
}  // namespace tandem
