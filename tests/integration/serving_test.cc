// The served system end to end: real tandem-router / tandem-prefill / tandem-decode
// processes on loopback (ephemeral ports, ready files), KV over UCX (the transport comes
// from the UCX_TLS this test runs under: tcp, or shared memory).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "services/api/proto_convert.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/subprocess.h"

namespace tandem {
namespace {

using testing::Generate;
using testing::GenerationStub;
using testing::StartCluster;
using testing::StreamResult;
using testing::TextRequest;

class ServingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    EngineOptions o;
    o.num_threads = 1;
    auto e = Engine::Create(testing::TinyModelDir(), o);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = e->release();
    one_ = StartCluster(1, 1, 0).release();
    ASSERT_NE(one_, nullptr);
  }
  static void TearDownTestSuite() {
    delete one_;
    delete engine_;
  }
  static std::string Long(int words, int salt) {
    static const char* kWords[] = {"prefill", "decode", "router", "latent", "attention", "expert", "cache",
                                   "token", "stream", "replica", "日本語", "😀", "données", "1234567"};
    std::string s;
    for (int i = 0; i < words; ++i) s += std::string(kWords[(i * 7 + salt) % 14]) + (i % 9 == 8 ? ".\n" : " ");
    return s;
  }

  static Engine* engine_;
  static LocalCluster* one_;
};
Engine* ServingTest::engine_ = nullptr;
LocalCluster* ServingTest::one_ = nullptr;

std::vector<v1::GenerateRequest> MixedRequests() {
  std::vector<v1::GenerateRequest> out;
  out.push_back(TextRequest("Hello", 12, std::nullopt, 0.0f));
  out.push_back(TextRequest("The quick brown fox jumps over the lazy dog. 日本語のテキスト 😀", 20, 11, 0.8f));
  v1::GenerateRequest r = TextRequest(std::string(300, 'x') + " then a much longer prompt", 16, 7, 1.0f);
  r.mutable_sampling()->set_top_p(0.9f);
  r.mutable_sampling()->set_top_k(40);
  out.push_back(r);
  return out;
}

TEST_F(ServingTest, DisaggregatedOutputEqualsLocalAndAggregated) {
  std::vector<v1::GenerateRequest> reqs = MixedRequests();
  reqs.push_back(TextRequest(Long(400, 3), 10, std::nullopt, 0.0f));  // > 2 KV blocks of prompt
  auto two = StartCluster(2, 2, 0);
  auto both = StartCluster(0, 0, 1);
  ASSERT_TRUE(two && both);
  auto s1 = GenerationStub(one_->router_address());
  auto s2 = GenerationStub(two->router_address());
  auto sb = GenerationStub(both->router_address());
  for (const v1::GenerateRequest& r : reqs) {
    const std::vector<int32_t> expected = testing::ReferenceTokens(*engine_, r);
    ASSERT_FALSE(expected.empty());
    StreamResult a = Generate(*s1, r);
    ASSERT_TRUE(a.status.ok()) << a.status.error_message();
    EXPECT_EQ(a.tokens, expected) << r.ShortDebugString();
    EXPECT_EQ(a.final.usage().completion_tokens(), static_cast<int32_t>(expected.size()));
    EXPECT_FALSE(a.request_id.empty());
    EXPECT_GT(a.final.timing().ttft_ms(), 0.0);
    for (int rep = 0; rep < 2; ++rep) {  // round-robin: both replicas of each role
      StreamResult b = Generate(*s2, r);
      ASSERT_TRUE(b.status.ok()) << b.status.error_message();
      EXPECT_EQ(b.tokens, expected);
      EXPECT_EQ(b.text, a.text);
    }
    StreamResult c = Generate(*sb, r);
    ASSERT_TRUE(c.status.ok()) << c.status.error_message();
    EXPECT_EQ(c.tokens, expected) << "aggregated";
    EXPECT_EQ(c.text, a.text);
  }
}

// 200 streams at once (TANDEM_TEST_CONCURRENT_STREAMS overrides the count: the
// ThreadSanitizer run uses fewer).
TEST_F(ServingTest, TwoHundredConcurrentStreams) {
  const char* streams_env = std::getenv("TANDEM_TEST_CONCURRENT_STREAMS");
  const int streams = streams_env != nullptr ? std::max(1, std::atoi(streams_env)) : 200;
  std::mt19937 rng(3);
  std::vector<v1::GenerateRequest> reqs;
  for (int i = 0; i < streams; ++i) {
    v1::GenerateRequest r = TextRequest(Long(1 + static_cast<int>(rng() % 120), i), 1 + static_cast<int>(rng() % 24),
                                        i % 3 == 0 ? std::nullopt : std::optional<uint64_t>(i), i % 3 == 0 ? 0.0f : 0.9f);
    r.set_request_id("concurrent-" + std::to_string(i));
    reqs.push_back(r);
  }
  std::vector<std::vector<int32_t>> expected(reqs.size());
  {
    // The reference, computed concurrently in the local engine.
    std::vector<std::thread> threads;
    for (size_t i = 0; i < reqs.size(); ++i) {
      threads.emplace_back([&, i] { expected[i] = testing::ReferenceTokens(*engine_, reqs[i]); });
    }
    for (auto& t : threads) t.join();
  }
  std::vector<StreamResult> got(reqs.size());
  auto stub = GenerationStub(one_->router_address());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i) threads.emplace_back([&, i] { got[i] = Generate(*stub, reqs[i], 300); });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(got[i].status.ok()) << i << ": " << got[i].status.error_message();
    EXPECT_EQ(got[i].tokens, expected[i]) << i;
    EXPECT_EQ(got[i].request_id, "concurrent-" + std::to_string(i));
  }
}

TEST_F(ServingTest, BadInputIsInvalidArgumentNamingTheField) {
  auto stub = GenerationStub(one_->router_address());
  struct Case {
    std::string field;
    std::function<void(v1::GenerateRequest&)> edit;
  };
  const std::vector<Case> cases = {
      {"text", [](auto& r) { r.set_text(""); }},
      {"prompt", [](auto& r) { r.clear_prompt(); }},
      {"prompt", [](auto& r) {
         r.mutable_token_ids()->clear_ids();
         for (int i = 0; i < 5000; ++i) r.mutable_token_ids()->add_ids(5);
       }},
      {"stop.max_tokens", [](auto& r) { r.mutable_stop()->set_max_tokens(0); }},
      {"stop.max_tokens", [](auto& r) { r.mutable_stop()->set_max_tokens(1 << 30); }},
      {"sampling.temperature", [](auto& r) { r.mutable_sampling()->set_temperature(std::nanf("")); }},
      {"sampling.temperature", [](auto& r) { r.mutable_sampling()->set_temperature(-1.0f); }},
      {"sampling.top_p", [](auto& r) { r.mutable_sampling()->set_top_p(0.0f); }},
      {"sampling.top_p", [](auto& r) { r.mutable_sampling()->set_top_p(1.5f); }},
      {"model", [](auto& r) { r.set_model("no-such-model"); }},
      {"token_ids.ids[1]", [](auto& r) {
         r.mutable_token_ids()->add_ids(5);
         r.mutable_token_ids()->add_ids(-3);
       }},
      {"token_ids.ids[0]", [](auto& r) { r.mutable_token_ids()->add_ids(1 << 30); }},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest r = TextRequest("hello", 4, 1, 1.0f);
    c.edit(r);
    StreamResult s = Generate(*stub, r);
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field << ": " << s.status.error_message();
    EXPECT_NE(s.status.error_message().find(c.field), std::string::npos) << c.field << ": " << s.status.error_message();
    EXPECT_TRUE(s.tokens.empty());
  }
}

// gRPC's chat prompt is formatted with the model's chat template (the tiny model carries
// DeepSeek-V3's), on the router for Tokenize and Generate alike. Two system messages
// tell the template (which joins them with a blank line) from the built-in format it
// replaced (which does not).
TEST_F(ServingTest, ChatPromptsUseTheModelsChatTemplate) {
  v1::GenerateRequest chat = TextRequest("", 6, std::nullopt, 0.0f);
  for (auto [role, content] : {std::pair{"system", "Be brief."}, {"system", "Answer in French."}, {"user", "Hi"}}) {
    v1::ChatMessage* m = chat.mutable_chat()->add_messages();
    m->set_role(role);
    m->set_content(content);
  }
  absl::StatusOr<std::unique_ptr<ModelChatTemplates>> templates = LoadChatTemplates(testing::TinyModelDir());
  ASSERT_TRUE(templates.ok() && *templates != nullptr) << templates.status();
  const int64_t vocab = engine_->config().vocab_size;
  absl::StatusOr<std::vector<int32_t>> expected =
      PromptTokens(chat, engine_->tokenizer(), vocab, kDefaultMaxPromptBytes, templates->get());
  absl::StatusOr<std::vector<int32_t>> fallback =
      PromptTokens(chat, engine_->tokenizer(), vocab, kDefaultMaxPromptBytes, nullptr);
  ASSERT_TRUE(expected.ok() && fallback.ok());
  ASSERT_NE(*expected, *fallback) << "the conversation must tell the template from the built-in format";

  auto stub = GenerationStub(one_->router_address());
  v1::TokenizeRequest t;
  *t.mutable_chat() = chat.chat();
  v1::TokenizeResponse ids;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->Tokenize(&ctx, t, &ids).ok());
  EXPECT_EQ(std::vector<int32_t>(ids.ids().begin(), ids.ids().end()), *expected);

  StreamResult s = Generate(*stub, chat);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.tokens, testing::ReferenceTokens(*engine_, chat));
}

TEST_F(ServingTest, FullDecodeReplicaMakesRequestsWaitNotFail) {
  // A decode replica whose KV cache holds only a few requests at once: the rest wait for
  // room (the router retries the reservation) instead of failing.
  auto small = StartCluster(1, 1, 0, {"--kv-cache-mb=1"});
  ASSERT_NE(small, nullptr);
  auto stub = GenerationStub(small->router_address());
  std::vector<StreamResult> got(16);
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] { got[i] = Generate(*stub, TextRequest(Long(150, i), 20, i, 0.7f), 300); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 16; ++i) {
    EXPECT_TRUE(got[i].status.ok()) << i << ": " << got[i].status.error_message();
    EXPECT_EQ(got[i].tokens.size(), 20u) << i;
  }
}

TEST_F(ServingTest, CancelledRequestsReleaseEveryBlockAndLease) {
  // A short KV lease: reservations whose request was cancelled mid-prefill are freed by
  // expiry (never under a prefill that may still be writing into them).
  auto cluster = StartCluster(1, 1, 0, {"--kv-lease-ms=2000"});
  ASSERT_NE(cluster, nullptr);
  auto stub = GenerationStub(cluster->router_address());
  std::atomic<int> cancelled{0};
  std::mt19937 seeds(9);
  for (int wave = 0; wave < 10; ++wave) {
    std::vector<std::thread> threads;
    for (int i = 0; i < 50; ++i) {
      const unsigned delay_us = seeds() % 40000;
      threads.emplace_back([&, i, wave, delay_us] {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
        auto reader = stub->Generate(&ctx, TextRequest(Long(20 + i * 3, wave), 200, i, 0.9f));
        std::thread canceller([&ctx, delay_us] {
          std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
          ctx.TryCancel();
        });
        v1::GenerateResponse m;
        while (reader->Read(&m)) {
        }
        grpc::Status s = reader->Finish();
        canceller.join();
        if (s.error_code() == grpc::StatusCode::CANCELLED) cancelled++;
        else EXPECT_TRUE(s.ok()) << s.error_message();
      });
    }
    for (auto& t : threads) t.join();
  }
  EXPECT_GT(cancelled.load(), 250);
  // Every replica returns to zero KV blocks in use: no lease, no sequence left behind.
  for (const ProcessInfo& p : cluster->processes()) {
    if (p.role == "router") continue;
    int64_t in_use = -1;
    for (int i = 0; i < 300 && in_use != 0; ++i) {
      const std::string body = testing::HttpGet(p.ready.value("admin", ""), "/stats");
      nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
      in_use = j.is_object() ? j.value("kv_blocks_in_use", -1) : -1;
      if (in_use != 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(in_use, 0) << p.name;
  }
}

TEST_F(ServingTest, PythonGrpcClientCompletesAStream) {
  const char* src = std::getenv("TANDEM_SOURCE_DIR");
  const char* bin = std::getenv("TANDEM_BINARY_DIR");
  auto r = testing::RunProcess({"/usr/bin/python3", std::string(src) + "/tests/integration/python_client.py",
                                "--addr", one_->router_address(), "--stubs", std::string(bin) + "/python"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("finish_reason=FINISH_REASON_LENGTH tokens=8"), std::string::npos) << r.out << r.err;
}

}  // namespace
}  // namespace tandem
