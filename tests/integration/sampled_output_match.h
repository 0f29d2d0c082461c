// Whether two runs of one generation request produced the same output, as far as
// floating-point reproducibility allows: greedy outputs must be identical; a sampled
// output may part from the other run only at a token where both runs' next-token
// distributions agree (their top log-probabilities within a tolerance), i.e. where a
// seeded draw fell on the boundary between two tokens' cumulative probabilities and the
// logits' last bits (which vary from run to run on a GPU: float atomics, split-K sums)
// decided it. Used by the GPU serving test; unit-tested on its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/v1/generation.pb.h"

namespace tandem::testing {

struct OutputMatch {
  bool same = false;
  std::string why;   // when not the same: where the outputs part and why that is not allowed
  std::string note;  // when the same but parted: where, and the two distributions there
};

// got / want: the tokens and (for sampled requests, one per token) the log-probabilities
// of two runs. A token missing from one run's top list counts as agreeing when it lies
// within `tolerance` of that list's last entry (a swap at the list's edge).
OutputMatch MatchOutputs(bool sampled, const std::vector<int32_t>& got_tokens,
                         const std::vector<v1::TokenLogprob>& got_logprobs, const std::vector<int32_t>& want_tokens,
                         const std::vector<v1::TokenLogprob>& want_logprobs, float tolerance = 2e-3f);

}  // namespace tandem::testing
