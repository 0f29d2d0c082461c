// Shared by the engine tests: one generated tiny model (vocabulary cut to 1,024 so steps
// are fast) for the whole test binary, deterministic prompt tokens, greedy requests,
// draining a stream, reservations.
#pragma once

#include <future>
#include <string>
#include <vector>

#include "engine/runtime/engine.h"
#include "engine/runtime/output_stream.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/model/test_models.h"

namespace tandem::testing {

inline const std::string& SmallTinyModelDir() {
  static TempDir* dir = new TempDir();
  static const std::string path = [] {
    nlohmann::json j = nlohmann::json::parse(PresetJson("tiny"));
    j["vocab_size"] = 1024;
    return MakeModel(*dir, "tiny", j.dump());
  }();
  return path;
}

// A request's whole output: its tokens, its text and the final output.
struct Result {
  std::vector<int32_t> tokens;
  std::string text;
  RequestOutput final;
};

inline Result Drain(OutputStream& s) {
  Result r;
  RequestOutput o;
  while (s.Next(&o)) {
    r.tokens.insert(r.tokens.end(), o.token_ids.begin(), o.token_ids.end());
    r.text += o.text;
    if (o.finished) r.final = o;
  }
  return r;
}

// n prompt tokens in [3, 1003), different for each salt.
inline std::vector<int32_t> Tokens(int n, int salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[i] = 3 + (i * 131 + salt * 7919 + (i * i) % 17) % 1000;
  return t;
}

// Greedy (temperature 0), exactly max_tokens (EOS ignored).
inline EngineRequest GreedyRequest(const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
  EngineRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.stop.max_tokens = max_tokens;
  r.stop.ignore_eos = true;
  return r;
}

// A reservation (blocks, token, sequence slot) made through ReserveKvAsync; an empty one,
// and a test failure, when it is refused.
inline KvLeases::Reservation ReserveWithToken(Engine& e, const std::string& id, int32_t num_tokens) {
  std::promise<absl::StatusOr<KvLeases::Reservation>> p;
  e.ReserveKvAsync(id, num_tokens, 0, [&p](absl::StatusOr<KvLeases::Reservation> r) { p.set_value(std::move(r)); });
  absl::StatusOr<KvLeases::Reservation> r = p.get_future().get();
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : KvLeases::Reservation{};
}

}  // namespace tandem::testing
