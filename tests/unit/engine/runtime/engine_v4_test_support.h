// Shared by the DeepSeek-V4 engine tests: the generated tiny-v4 model, deterministic
// prompts, and a request run with every token's logprob and top 5 (for bitwise
// comparisons of a prefix reused against a full prefill).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/runtime/engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/model/deepseek_v4/v4_test_models.h"
#include "tests/unit/engine/runtime/engine_test_support.h"

namespace tandem::testing {

inline const std::string& V4Dir() {
  static TempDir* tmp = new TempDir();
  static const std::string dir = v4::testing::MakeV4Model(*tmp, "tiny-v4", v4::testing::TinyV4Json(512).dump());
  return dir;
}

inline std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[i] = 3 + (i * 131 + salt * 7919 + (i * i) % 17) % 500;
  return t;
}

// A request's tokens and every token's logprob and top 5, as its stream gave them.
struct Scored {
  std::vector<int32_t> tokens;
  std::vector<std::pair<float, std::vector<std::pair<int32_t, float>>>> logprobs;
  RequestMetrics metrics;
};

inline Scored RunScored(Engine& e, EngineRequest r) {
  r.sampling.logprobs = 5;
  absl::StatusOr<std::shared_ptr<OutputStream>> s = e.Submit(std::move(r));
  Scored out;
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return out;
  RequestOutput o;
  while ((*s)->Next(&o)) {
    out.tokens.insert(out.tokens.end(), o.token_ids.begin(), o.token_ids.end());
    for (const TokenLogprobs& l : o.logprobs) out.logprobs.push_back({l.logprob, l.top});
    if (o.finished) {
      EXPECT_TRUE(o.status.ok()) << o.status;
      out.metrics = o.metrics;
    }
  }
  return out;
}

inline Scored RunScored(Engine& e, const std::string& id, const std::vector<int32_t>& prompt, int max_tokens) {
  return RunScored(e, GreedyRequest(id, prompt, max_tokens));
}

}  // namespace tandem::testing
