// `tandem serve-local --prefill 2 --decode 2 --batch-invariant` as a user runs it: seeded and
// greedy requests give the same tokens and bitwise the same log-probabilities one at a time,
// all together, together again in another order (prefixes now in the prefix cache and the
// kvstore), and as an in-process engine computes them alone. Replicas, load, the
// prefill/decode split and reused KV change nothing.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "engine/util/mapped_file.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/api/proto_convert.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/subprocess.h"
#include "tests/unit/engine/model/test_models.h"

namespace tandem {
namespace {

using testing::BackgroundProcess;
using testing::BinaryPath;
using testing::StreamResult;

constexpr int kRequests = 32;

// What a request gave: its tokens and every log-probability (chosen and top) as bits.
struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<uint32_t> bits;
  int32_t cached_prompt_tokens = 0;  // not compared: how much KV was reused
  bool operator==(const Outcome& o) const { return tokens == o.tokens && bits == o.bits; }
};

uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

Outcome FromStream(const StreamResult& r) {
  Outcome o{.tokens = r.tokens, .cached_prompt_tokens = r.final.usage().cached_prompt_tokens()};
  for (const v1::TokenLogprob& lp : r.logprobs) {
    o.bits.push_back(static_cast<uint32_t>(lp.token_id()));
    o.bits.push_back(BitsOf(lp.logprob()));
    for (const v1::TopLogprob& t : lp.top()) {
      o.bits.push_back(static_cast<uint32_t>(t.token_id()));
      o.bits.push_back(BitsOf(t.logprob()));
    }
  }
  return o;
}

// Prompts of 4 shared openings (so later runs reuse cached KV) with different endings;
// two thirds sampled with their own seed, the rest greedy; all with 3 top log-probabilities.
std::vector<v1::GenerateRequest> Requests() {
  static const char* kWords[] = {"alpha", "beta", "gamma", "delta", "router", "prefill", "decode", "cache",
                                 "block", "token", "stream", "lease", "replica", "expert", "latent"};
  std::vector<v1::GenerateRequest> out;
  for (int i = 0; i < kRequests; ++i) {
    std::string text;
    for (int w = 0; w < 70; ++w) text += std::string(kWords[(w * 7 + (i % 4) * 5) % 15]) + " ";
    for (int w = 0; w < 3 + i % 11; ++w) text += std::string(kWords[(w * 3 + i) % 15]) + " ";
    const bool sampled = i % 3 != 0;
    v1::GenerateRequest r = testing::TextRequest(text, 12 + i % 9, sampled ? std::optional<uint64_t>(9000 + i)
                                                                           : std::nullopt,
                                                 sampled ? 0.9f : 0.0f);
    if (sampled) r.mutable_sampling()->set_top_p(0.95f);
    r.mutable_sampling()->set_logprobs(3);
    out.push_back(r);
  }
  return out;
}

std::vector<Outcome> RunConcurrently(const std::string& router, const std::vector<v1::GenerateRequest>& reqs,
                                     const std::vector<int>& order) {
  std::vector<Outcome> out(reqs.size());
  std::vector<std::thread> threads;
  for (int i : order) {
    threads.emplace_back([&, i] {
      auto stub = testing::GenerationStub(router);
      const StreamResult r = testing::Generate(*stub, reqs[i], 300);
      EXPECT_TRUE(r.status.ok()) << i << ": " << r.status.error_message();
      out[i] = FromStream(r);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

// The same request through an in-process engine (--batch-invariant), alone.
Outcome Alone(Engine& engine, const v1::GenerateRequest& r, int i) {
  absl::StatusOr<std::vector<int32_t>> prompt =
      PromptTokens(r, engine.tokenizer(), engine.config().vocab_size, kDefaultMaxPromptBytes, nullptr);
  absl::StatusOr<SamplingParams> sampling = FromProto(r.sampling(), engine.config().vocab_size);
  absl::StatusOr<StopParams> stop = FromProto(r.stop(), engine.config().vocab_size);
  EXPECT_TRUE(prompt.ok() && sampling.ok() && stop.ok());
  if (!prompt.ok() || !sampling.ok() || !stop.ok()) return {};
  auto stream = engine.Submit({.id = "alone" + std::to_string(i), .prompt = *prompt, .sampling = *sampling,
                               .stop = *stop});
  EXPECT_TRUE(stream.ok()) << stream.status();
  if (!stream.ok()) return {};
  Outcome o;
  RequestOutput out;
  while ((*stream)->Next(&out)) {
    o.tokens.insert(o.tokens.end(), out.token_ids.begin(), out.token_ids.end());
    for (const TokenLogprobs& lp : out.logprobs) {
      o.bits.push_back(static_cast<uint32_t>(lp.token));
      o.bits.push_back(BitsOf(lp.logprob));
      for (const auto& [id, v] : lp.top) {
        o.bits.push_back(static_cast<uint32_t>(id));
        o.bits.push_back(BitsOf(v));
      }
    }
  }
  return o;
}

TEST(BatchInvarianceTest, ServeLocalTwoPlusTwoGivesTheSameBitsUnderAnyLoad) {
  testing::TempDir tmp;
  const std::string ready = tmp.Sub("ready.json");
  BackgroundProcess cluster({BinaryPath("tandem"), "serve-local", "--prefill", "2", "--decode", "2",
                             "--batch-invariant", "--listen", "127.0.0.1:0", "--http-listen", "off", "--threads",
                             "1", "--ready-file", ready, "--run-dir", tmp.Sub("run")},
                            tmp.Sub("serve-local.log"));
  ASSERT_GT(cluster.pid(), 0);
  for (int i = 0; i < 1200 && !std::filesystem::exists(ready); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(std::filesystem::exists(ready)) << ReadFileToString(tmp.Sub("serve-local.log")).value_or("");
  const std::string router = nlohmann::json::parse(ReadFileToString(ready).value())["router"].value("grpc", "");
  ASSERT_FALSE(router.empty());
  // Every worker says it computes batch-invariantly.
  int invariant_workers = 0;
  for (const auto& entry : std::filesystem::directory_iterator(tmp.Sub("run"))) {
    const std::string log = ReadFileToString(entry.path().string()).value_or("");
    if (log.find("worker: model") != std::string::npos && log.find(", batch-invariant") != std::string::npos) {
      ++invariant_workers;
    }
  }
  EXPECT_EQ(invariant_workers, 4);

  const std::vector<v1::GenerateRequest> reqs = Requests();
  // One at a time: each request's steps hold it alone (the reference the others must equal).
  std::vector<Outcome> sequential;
  {
    auto stub = testing::GenerationStub(router);
    for (const v1::GenerateRequest& r : reqs) {
      const StreamResult s = testing::Generate(*stub, r, 300);
      ASSERT_TRUE(s.status.ok()) << s.status.error_message();
      ASSERT_EQ(s.logprobs.size(), s.tokens.size());
      sequential.push_back(FromStream(s));
    }
  }
  std::vector<int> order(kRequests);
  for (int i = 0; i < kRequests; ++i) order[i] = i;
  const std::vector<Outcome> together = RunConcurrently(router, reqs, order);
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  const std::vector<Outcome> shuffled = RunConcurrently(router, reqs, order);

  EngineOptions eo;
  eo.num_threads = 1;
  eo.batch_invariant = true;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(testing::TinyModelDir(), eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  // The reordered run reuses KV (prefix cache or kvstore) for the shared openings.
  int reused = 0;
  for (const Outcome& o : shuffled) reused += o.cached_prompt_tokens > 0;
  EXPECT_GE(reused, kRequests / 2);
  int sampled_equal = 0;
  for (int i = 0; i < kRequests; ++i) {
    const Outcome alone = Alone(**engine, reqs[i], i);
    ASSERT_FALSE(alone.tokens.empty());
    EXPECT_TRUE(sequential[i] == alone) << "request " << i << ": the cluster one at a time vs an engine alone";
    EXPECT_TRUE(together[i] == alone) << "request " << i << ": all " << kRequests << " at once";
    EXPECT_TRUE(shuffled[i] == alone) << "request " << i << ": at once again, reordered, prefixes cached";
    if (i % 3 != 0 && together[i] == alone && shuffled[i] == alone) ++sampled_equal;
  }
  EXPECT_EQ(sampled_equal, kRequests - (kRequests + 2) / 3);
}

}  // namespace
}  // namespace tandem
