// The router's OpenAI-compatible HTTP API on a real cluster (tandem-router with
// --http-listen, one prefill and one decode replica, UCX over tcp): driven by the
// official OpenAI Node SDK (tests/integration/openai/sdk_client.mjs), compared token for
// token with the gRPC API on the same requests, its SSE framing read byte for byte from
// a raw socket, bad input, and clients that go away mid-stream.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/subprocess.h"

namespace tandem {
namespace {

using Json = nlohmann::json;
using testing::Generate;
using testing::GenerationStub;
using testing::StartCluster;
using testing::StreamResult;

constexpr char kKey[] = "sk-tandem-test-key";
constexpr char kLimitedKey[] = "sk-tandem-limited-key";

// A connected socket to host:port, or -1.
int Connect(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(host_port.substr(colon + 1), &port)) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{.tv_sec = 120, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

void SendAll(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

// Everything the server sends until it closes (or the timeout).
std::string ReadAll(int fd) {
  std::string out;
  char buf[8192];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::string Post(const std::string& path, const std::string& body, const std::string& extra_headers = "",
                 bool close_after = true) {
  return absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer ", kKey,
                      "\r\nContent-Type: application/json\r\n", extra_headers, "Content-Length: ", body.size(),
                      close_after ? "\r\nConnection: close" : "", "\r\n\r\n", body);
}

struct RawResponse {
  int status = 0;
  std::string head;  // status line and headers
  std::string body;  // as sent (chunked framing kept)
};

RawResponse Split(const std::string& raw) {
  RawResponse r;
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) return r;
  r.head = raw.substr(0, end + 2);
  r.body = raw.substr(end + 4);
  if (raw.size() > 12) absl::SimpleAtoi(raw.substr(9, 3), &r.status);
  return r;
}

// The chunked body's payload, checking the framing: "HEX\r\nDATA\r\n" ... "0\r\n\r\n".
std::string Dechunk(const std::string& body, bool* well_formed) {
  std::string out;
  size_t pos = 0;
  *well_formed = false;
  for (;;) {
    const size_t line_end = body.find("\r\n", pos);
    if (line_end == std::string::npos) return out;
    size_t size = 0;
    if (!absl::SimpleHexAtoi(body.substr(pos, line_end - pos), &size)) return out;
    pos = line_end + 2;
    if (size == 0) {
      *well_formed = body.substr(pos) == "\r\n";
      return out;
    }
    if (pos + size + 2 > body.size() || body.substr(pos + size, 2) != "\r\n") return out;
    out += body.substr(pos, size);
    pos += size + 2;
  }
}

class OpenAiApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    keys_file_ = new std::string(absl::StrCat(::testing::TempDir(), "/openai_api_keys.txt"));
    std::ofstream(*keys_file_) << kKey << " name=test\n" << kLimitedKey << " name=limited rps=0.01 burst=1\n";
    // A short KV lease, as the gRPC cancellation test has: a request cancelled mid-prefill
    // leaves its reservation to the decode replica's expiry (never freed under a prefill
    // that may still write into it).
    cluster_ = StartCluster(1, 1, 0, {"--kv-lease-ms=2000"},
                            {"--http-listen=127.0.0.1:0", "--api-keys-file=" + *keys_file_})
                   .release();
    ASSERT_NE(cluster_, nullptr);
    http_ = new std::string(cluster_->router_http_address());
    ASSERT_FALSE(http_->empty()) << "the router's ready file has no \"http\" address";
  }
  static void TearDownTestSuite() {
    delete cluster_;
    delete http_;
    delete keys_file_;
  }
  static grpc::Status WithKey(grpc::ClientContext* ctx) {
    ctx->AddMetadata("authorization", absl::StrCat("Bearer ", kKey));
    return grpc::Status::OK;
  }
  // The gRPC API's answer to `r`, with the test key.
  static StreamResult GrpcGenerate(const v1::GenerateRequest& r) {
    auto channel = grpc::CreateChannel(cluster_->router_address(), grpc::InsecureChannelCredentials());
    auto stub = v1::Generation::NewStub(channel);
    grpc::ClientContext ctx;
    WithKey(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    StreamResult out;
    auto reader = stub->Generate(&ctx, r);
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
      out.text += m.text();
      for (int id : m.token_ids()) out.tokens.push_back(id);
      for (const auto& lp : m.logprobs()) out.logprobs.push_back(lp);
      if (m.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) out.final = m;
    }
    out.status = reader->Finish();
    return out;
  }
  static std::string Exchange(const std::string& request) {
    const int fd = Connect(*http_);
    if (fd < 0) return "";
    SendAll(fd, request);
    std::string out = ReadAll(fd);
    close(fd);
    return out;
  }

  static LocalCluster* cluster_;
  static std::string* http_;
  static std::string* keys_file_;
};
LocalCluster* OpenAiApiTest::cluster_ = nullptr;
std::string* OpenAiApiTest::http_ = nullptr;
std::string* OpenAiApiTest::keys_file_ = nullptr;

TEST_F(OpenAiApiTest, TheOpenAiNodeSdkDrivesEveryEndpointAndGetsTheGrpcTokens) {
  const char* src = std::getenv("TANDEM_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  // A router with no replica: its completions answer 503.
  auto unserved = StartCluster(0, 0, 0, {}, {"--http-listen=127.0.0.1:0", "--api-keys-file=" + *keys_file_});
  ASSERT_NE(unserved, nullptr);
  testing::ProcessResult r = testing::RunProcess(
      {"/usr/bin/env", "node", absl::StrCat(src, "/tests/integration/openai/sdk_client.mjs"), absl::StrCat("http://", *http_, "/v1"),
       "tiny", kKey, kLimitedKey, absl::StrCat("http://", unserved->router_http_address(), "/v1")},
      {}, 300);
  std::fprintf(stderr, "%s", r.err.c_str());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json results = Json::parse(r.out, nullptr, false);
  ASSERT_TRUE(results.is_object()) << r.out;

  // The same requests through gRPC: the same text, token for token.
  const std::string prompt = "The router balances requests across replicas";
  v1::GenerateRequest greedy;
  greedy.set_text(prompt);
  greedy.mutable_sampling()->set_temperature(0);
  greedy.mutable_stop()->set_max_tokens(12);
  greedy.mutable_stop()->set_ignore_eos(true);
  StreamResult g = GrpcGenerate(greedy);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(results["completion_greedy"].get<std::string>(), g.text);
  EXPECT_EQ(results["completion_prompt_tokens"].get<int>(), g.final.usage().prompt_tokens());

  v1::GenerateRequest seeded = greedy;
  seeded.mutable_sampling()->set_temperature(0.8f);
  seeded.mutable_sampling()->set_seed(1234);
  seeded.mutable_sampling()->set_logprobs(2);
  seeded.mutable_stop()->set_max_tokens(10);
  StreamResult s = GrpcGenerate(seeded);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(results["completion_seeded"].get<std::string>(), s.text);
  ASSERT_EQ(results["completion_seeded_logprobs"].size(), s.logprobs.size());
  for (size_t i = 0; i < s.logprobs.size(); ++i) {
    EXPECT_EQ(results["completion_seeded_logprobs"][i].get<double>(), static_cast<double>(s.logprobs[i].logprob()))
        << "token " << i;
  }

  v1::GenerateRequest chat;
  auto* m0 = chat.mutable_chat()->add_messages();
  m0->set_role("system");
  m0->set_content("You are terse.");
  auto* m1 = chat.mutable_chat()->add_messages();
  m1->set_role("user");
  m1->set_content("Name three colours.");
  chat.mutable_sampling()->set_temperature(0);
  chat.mutable_stop()->set_max_tokens(16);
  chat.mutable_stop()->set_ignore_eos(true);
  StreamResult c = GrpcGenerate(chat);
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  EXPECT_EQ(results["chat_greedy"].get<std::string>(), c.text);

  // Structured output: the SDK's greedy response_format json_schema chat is the gRPC chat
  // with the same constraint, token for token.
  v1::GenerateRequest structured = chat;
  structured.mutable_stop()->set_ignore_eos(false);
  structured.mutable_stop()->set_max_tokens(80);
  structured.mutable_constraint()->set_json_schema(
      R"({"type":"object","properties":{"city":{"enum":["Paris","Lima","Oslo"]},)"
      R"("days":{"type":"integer","minimum":1,"maximum":14},"unit":{"enum":["C","F"]}},)"
      R"("required":["city","days","unit"],"additionalProperties":false})");
  structured.mutable_constraint()->set_strict(true);
  StreamResult st = GrpcGenerate(structured);
  ASSERT_TRUE(st.status.ok()) << st.status.error_message();
  ASSERT_TRUE(results["structured_chat"].is_array());
  EXPECT_EQ(results["structured_chat"][0].get<std::string>(), st.text);

  // The conversation with tools, as a gRPC chat: the same prompt and the same tokens.
  std::ifstream conversations_file(absl::StrCat(src, "/tests/goldens/chat_templates/conversations.json"));
  const nlohmann::ordered_json conversations = nlohmann::ordered_json::parse(conversations_file, nullptr, false);
  ASSERT_TRUE(conversations.is_object());
  v1::GenerateRequest tools_chat;
  for (const auto& conversation : conversations["conversations"]) {
    if (conversation["name"] != "tool_call_string_arguments") continue;
    tools_chat.mutable_chat()->set_tools_json(conversation["tools"].dump());
    for (const auto& m : conversation["messages"]) {
      v1::ChatMessage* out = tools_chat.mutable_chat()->add_messages();
      out->set_role(m["role"].get<std::string>());
      if (m["content"].is_string()) out->set_content(m["content"].get<std::string>());
      if (m.contains("tool_call_id")) out->set_tool_call_id(m["tool_call_id"].get<std::string>());
      if (m.contains("tool_calls")) {
        for (const auto& c : m["tool_calls"]) {
          v1::ToolCall* call = out->add_tool_calls();
          call->set_id(c["id"].get<std::string>());
          call->set_name(c["function"]["name"].get<std::string>());
          call->set_arguments(c["function"]["arguments"].get<std::string>());
        }
      }
    }
  }
  ASSERT_GT(tools_chat.chat().messages_size(), 0);
  tools_chat.mutable_sampling()->set_temperature(0);
  tools_chat.mutable_stop()->set_max_tokens(8);
  tools_chat.mutable_stop()->set_ignore_eos(true);
  StreamResult t = GrpcGenerate(tools_chat);
  ASSERT_TRUE(t.status.ok()) << t.status.error_message();
  EXPECT_EQ(results["tools_chat"].get<std::string>(), t.text);
  EXPECT_EQ(results["tools_prompt_tokens"].get<int>(), t.final.usage().prompt_tokens());

  // n = 3 with seed 7: choice i samples with seed 7 + i, as a gRPC request with that seed.
  for (int i = 0; i < 3; ++i) {
    v1::GenerateRequest choice = chat;
    choice.mutable_sampling()->set_temperature(1.0f);
    choice.mutable_sampling()->set_seed(7 + i);
    choice.mutable_stop()->set_max_tokens(8);
    StreamResult ci = GrpcGenerate(choice);
    ASSERT_TRUE(ci.status.ok());
    EXPECT_EQ(results["chat_n3"][i].get<std::string>(), ci.text) << "choice " << i;
  }
}

TEST_F(OpenAiApiTest, LogitBiasForcesATokenAsInTheGrpcApi) {
  // +100 on one token: every generated token is it, through HTTP and gRPC alike.
  const RawResponse r = Split(Exchange(Post(
      "/v1/completions",
      R"({"prompt":"Hello there","max_tokens":5,"temperature":0.9,"seed":3,"ignore_eos":true,"logit_bias":{"1000":100}})")));
  ASSERT_EQ(r.status, 200) << r.body;
  const Json body = Json::parse(r.body, nullptr, false);
  ASSERT_TRUE(body.is_object()) << r.body;
  v1::GenerateRequest same;
  same.set_text("Hello there");
  same.mutable_sampling()->set_temperature(0.9f);
  same.mutable_sampling()->set_seed(3);
  (*same.mutable_sampling()->mutable_logit_bias())[1000] = 100.0f;
  same.mutable_stop()->set_max_tokens(5);
  same.mutable_stop()->set_ignore_eos(true);
  const StreamResult g = GrpcGenerate(same);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.tokens, std::vector<int32_t>(5, 1000));
  EXPECT_EQ(body["choices"][0]["text"].get<std::string>(), g.text);
}

TEST_F(OpenAiApiTest, SkipSpecialTokensFalseKeepsTheirText) {
  // EOS forced (id 1, "<｜end▁of▁sentence｜>" in the generated tokenizer) and ignored:
  // three EOS tokens, whose text only skip_special_tokens: false keeps, on both
  // generation paths (the prefill replica's first token, the decode replica's rest).
  const std::string eos = "<｜end▁of▁sentence｜>";
  for (const bool skip : {true, false}) {
    SCOPED_TRACE(skip ? "skip_special_tokens: true" : "skip_special_tokens: false");
    const RawResponse r = Split(Exchange(Post(
        "/v1/completions", absl::StrCat(R"({"prompt":"Hello there","max_tokens":3,"temperature":0,"ignore_eos":true,)",
                                        R"("logit_bias":{"1":100},"logprobs":0,"skip_special_tokens":)",
                                        skip ? "true" : "false", "}"))));
    ASSERT_EQ(r.status, 200) << r.body;
    const Json body = Json::parse(r.body, nullptr, false);
    ASSERT_TRUE(body.is_object()) << r.body;
    EXPECT_EQ(body["choices"][0]["text"].get<std::string>(), skip ? "" : eos + eos + eos) << r.body;
    EXPECT_EQ(body["usage"]["completion_tokens"].get<int>(), 3);
  }
}

TEST_F(OpenAiApiTest, ServerSentEventsAreFramedByteForByte) {
  const std::string raw = Exchange(Post(
      "/v1/completions",
      R"({"model":"tiny","prompt":"Hello there","max_tokens":5,"temperature":0,"ignore_eos":true,"stream":true,)"
      R"("stream_options":{"include_usage":true}})"));
  const RawResponse r = Split(raw);
  ASSERT_EQ(r.status, 200) << raw;
  EXPECT_TRUE(absl::StartsWith(r.head, "HTTP/1.1 200 OK\r\n")) << r.head;
  EXPECT_TRUE(absl::StrContains(r.head, "\r\nContent-Type: text/event-stream\r\n")) << r.head;
  EXPECT_TRUE(absl::StrContains(r.head, "\r\nTransfer-Encoding: chunked\r\n")) << r.head;
  EXPECT_TRUE(absl::StrContains(r.head, "\r\nCache-Control: no-cache\r\n")) << r.head;
  EXPECT_TRUE(absl::StrContains(r.head, "\r\nx-request-id: ")) << r.head;
  EXPECT_FALSE(absl::StrContains(r.head, "Content-Length")) << r.head;
  bool framed = false;
  const std::string events = Dechunk(r.body, &framed);
  EXPECT_TRUE(framed) << r.body;
  // Every event is "data: <one line of JSON>\n\n"; the last is "data: [DONE]\n\n".
  ASSERT_TRUE(absl::EndsWith(events, "\n\ndata: [DONE]\n\n")) << events;
  std::vector<std::string> parts = absl::StrSplit(events.substr(0, events.size() - 2), "\n\n");
  ASSERT_GE(parts.size(), 3u) << events;
  EXPECT_EQ(parts.back(), "data: [DONE]");
  parts.pop_back();
  std::string text;
  int finished = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    ASSERT_TRUE(absl::StartsWith(parts[i], "data: ")) << parts[i];
    ASSERT_EQ(parts[i].find('\n'), std::string::npos) << parts[i];
    const Json e = Json::parse(parts[i].substr(6), nullptr, false);
    ASSERT_TRUE(e.is_object()) << parts[i];
    EXPECT_EQ(e["object"], "text_completion");
    EXPECT_EQ(e["model"], "tiny");
    EXPECT_TRUE(e["id"].get<std::string>().rfind("cmpl-", 0) == 0);
    if (i + 1 == parts.size()) {
      // The usage event: no choices.
      EXPECT_TRUE(e["choices"].empty());
      EXPECT_EQ(e["usage"]["completion_tokens"], 5);
      continue;
    }
    EXPECT_TRUE(e["usage"].is_null());
    ASSERT_EQ(e["choices"].size(), 1u);
    text += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) {
      ++finished;
      EXPECT_EQ(e["choices"][0]["finish_reason"], "length");
    }
  }
  EXPECT_EQ(finished, 1);
  v1::GenerateRequest same;
  same.set_text("Hello there");
  same.mutable_sampling()->set_temperature(0);
  same.mutable_stop()->set_max_tokens(5);
  same.mutable_stop()->set_ignore_eos(true);
  EXPECT_EQ(text, GrpcGenerate(same).text);
}

TEST_F(OpenAiApiTest, BadInputGetsAClearStatusAndTheRouterStaysUp) {
  struct Case {
    const char* what;
    std::string request;
    int status;
    const char* param;  // expected error.param, or nullptr
  };
  const std::string big_header(20000, 'x');
  const std::vector<Case> cases = {
      {"malformed JSON", Post("/v1/completions", "{\"prompt\": \"a\", "), 400, nullptr},
      {"not an object", Post("/v1/completions", "[1, 2]"), 400, nullptr},
      {"wrong type", Post("/v1/completions", R"({"prompt": "a", "temperature": "hot"})"), 400, "temperature"},
      {"NaN-like value", Post("/v1/completions", R"({"prompt": "a", "top_p": 7})"), 400, "top_p"},
      {"missing prompt", Post("/v1/completions", R"({"max_tokens": 3})"), 400, "prompt"},
      {"empty messages", Post("/v1/chat/completions", R"({"messages": []})"), 400, "messages"},
      {"bad role", Post("/v1/chat/completions", R"({"messages": [{"role": "wizard", "content": "x"}]})"), 400,
       "messages[0].role"},
      {"token id out of range", Post("/v1/completions", R"({"prompt": [1, 99999999], "max_tokens": 2})"), 400,
       "prompt"},
      {"prompt longer than the context", Post("/v1/completions", R"({"prompt": "a", "max_tokens": 100000000})"), 400,
       "max_tokens"},
      {"logit_bias key not a token id", Post("/v1/completions", R"({"prompt": "a", "logit_bias": {"x": 1}})"), 400,
       "logit_bias"},
      {"logit_bias out of range", Post("/v1/completions", R"({"prompt": "a", "logit_bias": {"5": 500}})"), 400,
       "logit_bias"},
      {"unknown endpoint", Post("/v1/embeddings", "{}"), 404, nullptr},
      {"wrong method", "GET /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", 405, nullptr},
      {"no key", "GET /v1/models HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", 401, nullptr},
      {"not JSON content", Post("/v1/completions", "prompt=a", "Content-Type: text/plain\r\n"), 400, nullptr},
      {"oversized body", "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000000\r\n\r\n{", 413,
       nullptr},
      {"oversized headers", absl::StrCat("GET /v1/models HTTP/1.1\r\nHost: t\r\nX-Big: ", big_header, "\r\n\r\n"), 431,
       nullptr},
      {"garbage", "\x01\x02 not http at all\r\n\r\n", 400, nullptr},
  };
  for (const Case& c : cases) {
    const std::string raw = Exchange(c.request);
    const RawResponse r = Split(raw);
    EXPECT_EQ(r.status, c.status) << c.what << ": " << raw.substr(0, 300);
    const std::string body = absl::StrContains(r.head, "chunked") ? "" : r.body;
    const Json e = Json::parse(body, nullptr, false);
    ASSERT_TRUE(e.is_object() && e.contains("error")) << c.what << ": " << body;
    EXPECT_TRUE(e["error"]["message"].is_string()) << c.what;
    EXPECT_EQ(e["error"]["code"], c.status) << c.what;
    if (c.param != nullptr) {
      EXPECT_EQ(e["error"]["param"], c.param) << c.what << ": " << body;
    }
  }
  // Still serving, keep-alive included: two requests on one connection.
  const int fd = Connect(*http_);
  ASSERT_GE(fd, 0);
  const std::string body = R"({"prompt":"ok","max_tokens":2,"temperature":0})";
  SendAll(fd, Post("/v1/completions", body, "", /*close_after=*/false) + Post("/v1/completions", body));
  const std::string both = ReadAll(fd);
  close(fd);
  EXPECT_EQ(both.find("HTTP/1.1 200 OK"), 0u) << both;
  EXPECT_NE(both.find("HTTP/1.1 200 OK", 10), std::string::npos) << both;
}

TEST_F(OpenAiApiTest, ClientsThatGoAwayMidStreamAreCancelledAndTheirKvFreed) {
  std::vector<std::thread> clients;
  std::atomic<int> got_first_event{0};
  for (int i = 0; i < 24; ++i) {
    clients.emplace_back([&, i] {
      const int fd = Connect(*http_);
      if (fd < 0) return;
      SendAll(fd, Post(i % 2 ? "/v1/completions" : "/v1/chat/completions",
                       i % 2 ? absl::StrCat(R"({"prompt":"long story )", i, R"(","max_tokens":3000,"ignore_eos":true,)",
                                            R"("stream":true})")
                             : absl::StrCat(R"({"messages":[{"role":"user","content":"go )", i,
                                            R"("}],"max_tokens":3000,"ignore_eos":true,"stream":true})")));
      char buf[4096];
      std::string seen;
      while (seen.find("data: ") == std::string::npos) {
        const ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) break;
        seen.append(buf, static_cast<size_t>(n));
      }
      if (seen.find("data: ") != std::string::npos) ++got_first_event;
      close(fd);  // mid-stream: thousands of tokens still to come
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(got_first_event.load(), 24);
  // Every request was cancelled: each replica back to zero KV blocks in use.
  for (const ProcessInfo& p : cluster_->processes()) {
    if (p.role == "router") continue;
    int64_t in_use = -1;
    for (int i = 0; i < 600 && in_use != 0; ++i) {
      const Json j = Json::parse(testing::HttpGet(p.ready.value("admin", ""), "/stats"), nullptr, false);
      in_use = j.is_object() ? j.value("kv_blocks_in_use", -1) : -1;
      if (in_use != 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(in_use, 0) << p.name;
  }
  const RawResponse after = Split(Exchange(Post("/v1/completions", R"({"prompt":"still up","max_tokens":2})")));
  EXPECT_EQ(after.status, 200);
}

TEST_F(OpenAiApiTest, AThousandStreamsHeldAtOnceAllComplete) {
  const char* src = std::getenv("TANDEM_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  // The default KV lease here: a thousand requests queue for the prefill replica for
  // longer than the suite's short lease.
  auto cluster = StartCluster(1, 1, 0, {}, {"--http-listen=127.0.0.1:0", "--api-keys-file=" + *keys_file_});
  ASSERT_NE(cluster, nullptr);
  // While the SDK holds them, the router's in-flight gauge shows how many it serves at once.
  std::atomic<bool> done{false};
  std::atomic<int> most_running{0};
  std::thread watcher([&] {
    const std::string admin = cluster->processes()[0].ready.value("admin", "");
    while (!done) {
      const std::vector<std::string> lines = absl::StrSplit(testing::HttpGet(admin, "/metrics"), '\n');
      for (const std::string& line : lines) {
        if (!absl::StartsWith(line, "tandem_requests_running{")) continue;
        double v = 0;
        if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) {
          most_running = std::max(most_running.load(), static_cast<int>(v));
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  testing::ProcessResult r = testing::RunProcess(
      {"/usr/bin/env", "node", absl::StrCat(src, "/tests/integration/openai/many_streams.mjs"),
       absl::StrCat("http://", cluster->router_http_address(), "/v1"), "tiny", kKey, "1000", "24"},
      {}, 540);
  done = true;
  watcher.join();
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err.substr(0, 2000);
  const Json j = Json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["completed"], 1000);
  std::printf("1000 streams: at most %d in flight at the router at once\n", most_running.load());
  EXPECT_GE(most_running.load(), 500) << "the streams were not held concurrently";
  for (const ProcessInfo& p : cluster->processes()) {
    if (p.role == "router") continue;
    int64_t in_use = -1;
    for (int i = 0; i < 600 && in_use != 0; ++i) {
      const Json s = Json::parse(testing::HttpGet(p.ready.value("admin", ""), "/stats"), nullptr, false);
      in_use = s.is_object() ? s.value("kv_blocks_in_use", -1) : -1;
      if (in_use != 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(in_use, 0) << p.name;
  }
}

}  // namespace
}  // namespace tandem
