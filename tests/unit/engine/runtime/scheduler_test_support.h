// What the scheduler's tests share: a waiting sequence of consecutive token ids.
#pragma once

#include <memory>
#include <numeric>
#include <string>

#include "engine/runtime/sequence.h"

namespace tandem::testing {

// A prompt of n tokens first, first + 1, ...: prompts with different `first` share no block.
inline std::unique_ptr<Sequence> Seq(const std::string& id, int n, int first = 1) {
  auto s = std::make_unique<Sequence>();
  s->id = id;
  s->tokens.resize(static_cast<size_t>(n));
  std::iota(s->tokens.begin(), s->tokens.end(), first);
  s->prompt_len = n;
  return s;
}

}  // namespace tandem::testing
