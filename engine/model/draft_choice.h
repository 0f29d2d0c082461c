// How the draft pass of speculative decoding picks a draft from the MTP layer's logits,
// whatever the architecture (docs/speculative-decoding.md): the argmax (the sampler's
// greedy choice) with its probability as the draft's confidence, among the tokens a
// grammar allows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>

#include "engine/model/forward_batch.h"

namespace tandem {

// The argmax, ties to the lowest id, and its softmax probability at temperature 1.
inline DraftToken ChooseDraft(const float* logits, int64_t vocab) {
  const int64_t best = std::max_element(logits, logits + vocab) - logits;
  double sum = 0.0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(logits[v]) - logits[best]);
  return {.token = static_cast<int32_t>(best), .confidence = static_cast<float>(1.0 / sum)};
}

// Tokens outside the bitmask (bit v % 32 of word v / 32; ids past its words too) to -inf.
// Returns false when none is left.
inline bool MaskDisallowed(float* logits, int64_t vocab, std::span<const uint32_t> allowed) {
  const int64_t words = static_cast<int64_t>(allowed.size());
  bool any = false;
  for (int64_t v = 0; v < vocab; ++v) {
    if (v / 32 >= words || (allowed[v / 32] >> (v % 32) & 1u) == 0) {
      logits[v] = -std::numeric_limits<float>::infinity();
    } else {
      any = true;
    }
  }
  return any;
}

}  // namespace tandem
