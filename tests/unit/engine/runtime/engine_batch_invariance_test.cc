// --batch-invariant on the CPU (EngineOptions::batch_invariant): a request's log-probabilities
// are bitwise the same alone and among 1 to 255 random companions, whatever the step budget
// chunks its prompt into, greedy and seeded. The comparison is of the float bits, not within
// a tolerance: batch invariance is exactness or nothing.
#include <cstring>
#include <random>

#include "engine/runtime/engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/runtime/engine_test_support.h"

namespace tandem {
namespace {

using testing::Tokens;

struct Result {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;
  absl::Status status;
};

Result Drain(OutputStream& s) {
  Result r;
  RequestOutput o;
  while (s.Next(&o)) {
    r.tokens.insert(r.tokens.end(), o.token_ids.begin(), o.token_ids.end());
    r.logprobs.insert(r.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
    if (o.finished) r.status = o.status;
  }
  return r;
}

std::unique_ptr<Engine> MakeEngine(int32_t max_batch_tokens, int32_t max_running = 256) {
  EngineOptions o;
  o.num_threads = 2;
  o.batch_invariant = true;
  o.max_batch_tokens = max_batch_tokens;
  o.max_running = max_running;
  o.num_kv_blocks = 2048;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(testing::SmallTinyModelDir(), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

// The request under test: a 150-token prompt (chunked differently by each step budget),
// 5 top log-probabilities per token.
EngineRequest Target(bool seeded) {
  EngineRequest r;
  r.id = "target";
  r.prompt = Tokens(150, 77);
  r.sampling.logprobs = 5;
  if (seeded) {
    r.sampling.temperature = 0.9f;
    r.sampling.top_p = 0.95f;
    r.sampling.seed = 4242;
  } else {
    r.sampling.temperature = 0.0f;
  }
  r.stop.max_tokens = 20;
  r.stop.ignore_eos = true;
  return r;
}

EngineRequest Companion(int i, std::mt19937& rng) {
  EngineRequest r;
  r.id = "c" + std::to_string(i);
  r.prompt = Tokens(1 + static_cast<int>(rng() % 200), 1000 + i);
  const int kind = static_cast<int>(rng() % 3);
  r.sampling.temperature = kind == 0 ? 0.0f : 0.3f + 0.1f * static_cast<float>(rng() % 10);
  if (kind == 2) r.sampling.seed = rng();
  r.sampling.top_k = rng() % 2 ? 40 : 0;
  if (rng() % 4 == 0) r.sampling.logprobs = 2;
  r.stop.max_tokens = 1 + static_cast<int>(rng() % 30);
  r.stop.ignore_eos = true;
  return r;
}

// Every token's id, log-probability and top list as raw bits.
std::vector<uint32_t> Bits(const Result& r) {
  std::vector<uint32_t> out;
  auto put = [&](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    out.push_back(u);
  };
  for (const TokenLogprobs& t : r.logprobs) {
    out.push_back(static_cast<uint32_t>(t.token));
    put(t.logprob);
    for (const auto& [id, lp] : t.top) {
      out.push_back(static_cast<uint32_t>(id));
      put(lp);
    }
  }
  return out;
}

Result RunAmong(Engine& e, EngineRequest target, int companions, uint32_t seed) {
  std::mt19937 rng(seed);
  const int position = companions == 0 ? 0 : static_cast<int>(rng() % (companions + 1));
  std::vector<std::shared_ptr<OutputStream>> streams;
  int target_index = -1;
  for (int i = 0; i <= companions; ++i) {
    absl::StatusOr<std::shared_ptr<OutputStream>> s =
        e.Submit(i == position ? target : Companion(i, rng));
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return {};
    if (i == position) target_index = static_cast<int>(streams.size());
    streams.push_back(*s);
  }
  std::vector<Result> results;
  for (auto& s : streams) results.push_back(Drain(*s));
  for (const Result& r : results) EXPECT_TRUE(r.status.ok()) << r.status;
  return results[target_index];
}

class BatchInvarianceTest : public ::testing::TestWithParam<bool> {};

TEST_P(BatchInvarianceTest, LogprobsAreBitwiseTheSameAloneAndInAnyBatch) {
  const bool seeded = GetParam();
  std::unique_ptr<Engine> alone_engine = MakeEngine(2048);
  ASSERT_NE(alone_engine, nullptr);
  const Result alone = RunAmong(*alone_engine, Target(seeded), 0, 1);
  ASSERT_EQ(alone.logprobs.size(), 20u);
  const std::vector<uint32_t> reference = Bits(alone);

  // Step budgets chunk the 150-token prompt as 1x150, 3x64-ish, 10x16 (mixed with the
  // companions' chunks and decodes, so boundaries also move with the load).
  struct Case {
    int32_t max_batch_tokens;
    int companions;
  };
  const std::vector<Case> cases = {{2048, 1}, {2048, 7},  {64, 15},   {300, 31}, {16, 3},
                                   {512, 63}, {128, 100}, {2048, 255}, {97, 255}};
  for (const Case& c : cases) {
    std::unique_ptr<Engine> e = MakeEngine(c.max_batch_tokens);
    ASSERT_NE(e, nullptr);
    const Result batched = RunAmong(*e, Target(seeded), c.companions, 100 + c.companions + c.max_batch_tokens);
    EXPECT_EQ(batched.tokens, alone.tokens) << c.companions << " companions, step " << c.max_batch_tokens;
    EXPECT_TRUE(Bits(batched) == reference)
        << "logprobs differ in their bits with " << c.companions << " companions, step " << c.max_batch_tokens;
  }
}

INSTANTIATE_TEST_SUITE_P(GreedyAndSeeded, BatchInvarianceTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "Seeded" : "Greedy"; });

}  // namespace
}  // namespace tandem
