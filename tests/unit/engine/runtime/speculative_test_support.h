// Shared by the speculative-decoding engine tests (CPU and CUDA): a request's whole output
// with every logprob's bits, for bitwise comparisons of runs with drafts and without, and
// running a set of requests together.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "engine/runtime/engine.h"
#include "engine/runtime/output_stream.h"
#include "gtest/gtest.h"

namespace tandem::testing {

// Tokens, text, and every logprob's bits with its top ones (ids folded in).
struct Scored {
  std::vector<int32_t> tokens;
  std::vector<uint32_t> bits;
  RequestMetrics metrics;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  bool operator==(const Scored& o) const { return tokens == o.tokens && bits == o.bits; }
};

inline Scored Score(OutputStream& s) {
  Scored out;
  RequestOutput o;
  while (s.Next(&o)) {
    EXPECT_TRUE(o.status.ok()) << o.status;
    out.tokens.insert(out.tokens.end(), o.token_ids.begin(), o.token_ids.end());
    out.text += o.text;
    for (const TokenLogprobs& l : o.logprobs) {
      uint32_t b;
      std::memcpy(&b, &l.logprob, sizeof b);
      out.bits.push_back(b);
      for (const auto& [id, lp] : l.top) {
        std::memcpy(&b, &lp, sizeof b);
        out.bits.push_back(b ^ static_cast<uint32_t>(id));
      }
    }
    if (o.finished) {
      out.finish = o.finish_reason;
      out.metrics = o.metrics;
    }
  }
  return out;
}

// Submits the requests together to `e` and returns each one's output, in order.
inline std::vector<Scored> RunAll(Engine& e, std::vector<EngineRequest> requests) {
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (EngineRequest& r : requests) {
    absl::StatusOr<std::shared_ptr<OutputStream>> s = e.Submit(std::move(r));
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) streams.push_back(*s);
  }
  std::vector<Scored> out;
  for (auto& s : streams) out.push_back(Score(*s));
  return out;
}

}  // namespace tandem::testing
