// Shared by the batch-invariance tests of the CPU and CUDA engines: a target request run
// alone and among random companions, and its tokens and log-probabilities as raw bits.
// Batch invariance is exactness or nothing: the comparison is of float bits.
#pragma once

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/runtime/engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/runtime/engine_test_support.h"

namespace tandem::testing {

struct InvariantResult {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;
  absl::Status status;
};

inline InvariantResult DrainWithLogprobs(OutputStream& s) {
  InvariantResult r;
  RequestOutput o;
  while (s.Next(&o)) {
    r.tokens.insert(r.tokens.end(), o.token_ids.begin(), o.token_ids.end());
    r.logprobs.insert(r.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
    if (o.finished) r.status = o.status;
  }
  return r;
}

// The request under test: a 150-token prompt (chunked differently by each step budget),
// 20 tokens; with `logprobs` 5 top log-probabilities per token (the host samples), else
// none (a device backend samples on the device).
inline EngineRequest InvarianceTarget(bool seeded, bool logprobs = true) {
  EngineRequest r;
  r.id = "target";
  r.prompt = Tokens(150, 77);
  r.sampling.logprobs = logprobs ? 5 : 0;
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

inline EngineRequest InvarianceCompanion(int i, std::mt19937& rng) {
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
inline std::vector<uint32_t> InvariantBits(const InvariantResult& r) {
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

// `target` submitted among `companions` random requests (at a random place in the order).
inline InvariantResult RunAmong(Engine& e, EngineRequest target, int companions, uint32_t seed) {
  std::mt19937 rng(seed);
  const int position = companions == 0 ? 0 : static_cast<int>(rng() % (companions + 1));
  std::vector<std::shared_ptr<OutputStream>> streams;
  int target_index = -1;
  for (int i = 0; i <= companions; ++i) {
    absl::StatusOr<std::shared_ptr<OutputStream>> s = e.Submit(i == position ? target : InvarianceCompanion(i, rng));
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return {};
    if (i == position) target_index = static_cast<int>(streams.size());
    streams.push_back(*s);
  }
  std::vector<InvariantResult> results;
  for (auto& s : streams) results.push_back(DrainWithLogprobs(*s));
  for (const InvariantResult& r : results) EXPECT_TRUE(r.status.ok()) << r.status;
  return results[target_index];
}

// A batch-invariant engine on `device` ("cpu", "cuda") over the shared tiny model, room
// for the largest case's 256 sequences.
inline std::unique_ptr<Engine> MakeInvariantEngine(const std::string& device, int32_t max_batch_tokens) {
  EngineOptions o;
  o.device = device;
  o.num_threads = 2;
  o.gpu_memory_utilization = 0.3;
  o.batch_invariant = true;
  o.max_batch_tokens = max_batch_tokens;
  o.max_running = 256;
  o.num_kv_blocks = 2048;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(SmallTinyModelDir(), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

struct InvarianceCase {
  int32_t max_batch_tokens;
  int companions;
};

// Step budgets chunk the 150-token prompt as 1x150 ... 10x16 (mixed with the companions'
// chunks and decodes, so boundaries also move with the load).
inline std::vector<InvarianceCase> InvarianceCases() {
  return {{2048, 1}, {2048, 7}, {64, 15}, {300, 31}, {16, 3}, {512, 63}, {128, 100}, {2048, 255}, {97, 255}};
}

// The target alone, then in every case of InvarianceCases on a fresh engine on `device`:
// tokens and bits equal to the lone run's.
inline void ExpectBatchInvariant(const std::string& device, bool seeded, bool logprobs = true) {
  std::unique_ptr<Engine> alone_engine = MakeInvariantEngine(device, 2048);
  ASSERT_NE(alone_engine, nullptr);
  const InvariantResult alone = RunAmong(*alone_engine, InvarianceTarget(seeded, logprobs), 0, 1);
  ASSERT_EQ(alone.tokens.size(), 20u);
  if (logprobs) ASSERT_EQ(alone.logprobs.size(), 20u);
  const std::vector<uint32_t> reference = InvariantBits(alone);
  for (const InvarianceCase& c : InvarianceCases()) {
    std::unique_ptr<Engine> e = MakeInvariantEngine(device, c.max_batch_tokens);
    ASSERT_NE(e, nullptr);
    const InvariantResult batched =
        RunAmong(*e, InvarianceTarget(seeded, logprobs), c.companions, 100 + c.companions + c.max_batch_tokens);
    EXPECT_EQ(batched.tokens, alone.tokens) << c.companions << " companions, step " << c.max_batch_tokens;
    EXPECT_TRUE(InvariantBits(batched) == reference)
        << "logprobs differ in their bits with " << c.companions << " companions, step " << c.max_batch_tokens;
  }
}

}  // namespace tandem::testing
