// The engine's structured-output steps (engine.h, EngineRequest::constraint): a
// constrained request waits for its grammar off the engine thread, gets a matcher that
// has accepted its output so far, and has its logits masked before each sample.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/runtime/engine.h"
#include "kernels/common/check.h"

namespace tandem {

void Engine::CompileThen(const std::string& id, const OutputConstraint& c, std::function<void(Compiled)> then) {
  compiling_[id] = std::move(then);
  constraints_->Compile(c, [this, id](Compiled g) {
    Post([this, id, g = std::move(g)]() mutable {
      auto it = compiling_.find(id);
      if (it == compiling_.end()) return;  // cancelled meanwhile
      std::function<void(Compiled)> then = std::move(it->second);
      compiling_.erase(it);
      then(std::move(g));
    });
  });
}

absl::Status Engine::AttachMatcher(Sequence& s, const ConstraintCompiler::Grammar& g) const {
  s.matcher = std::make_unique<grammar::GrammarMatcher>(g);
  const std::span<const int32_t> done = s.generated();
  for (size_t i = 0; i < done.size(); ++i) {
    if (!s.matcher->AcceptToken(done[i])) {
      return absl::InvalidArgumentError(absl::StrCat("resume_tokens[", i, "] (token ", done[i],
                                                     ") does not satisfy the request's constraint"));
    }
  }
  return absl::OkStatus();
}

void Engine::PrecompileConstraint(OutputConstraint c) {
  constraints_->Compile(std::move(c), [](Compiled) {});
}

std::span<const uint32_t> Engine::DeviceMask(const Sequence& s, size_t row) {
  if (device_masks_.size() <= row) device_masks_.resize(row + 1);
  std::vector<uint32_t>& m = device_masks_[row];
  // One size for every row (the backend wants one per step): every grammar has the
  // engine's vocabulary.
  m.resize(std::max((static_cast<size_t>(backend_->config().vocab_size) + 31) / 32,
                    s.matcher->grammar().vocabulary().mask_words()));
  pending_masks_.emplace_back(&s, row);
  return m;
}

ForwardOptions Engine::WithMaskFill(ForwardOptions fo) {
  if (!pending_masks_.empty()) fo.before_sampling = [this] { FillDeviceMasks(); };
  return fo;
}

void Engine::FillDeviceMasks() {
  const double start = Now();
  // Rows apart: each its own matcher (its own scratch) and mask; the compiled grammars they
  // share are read-only.
  mask_pool_->ParallelFor(static_cast<int64_t>(pending_masks_.size()), 1, [this](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const auto& [s, row] = pending_masks_[static_cast<size_t>(i)];
      std::vector<uint32_t>& m = device_masks_[row];
      std::fill(m.begin(), m.end(), 0u);
      s->matcher->FillNextTokenBitmask(m);
    }
  });
  pending_masks_.clear();
  counters_.constraint_mask_seconds += Now() - start;
}

void Engine::AcceptConstrained(Sequence& s, int32_t token) {
  const double start = Now();
  TANDEM_CHECK(s.matcher->AcceptToken(token)) << s.id << ": token " << token << " outside its constraint";
  counters_.constrained_tokens++;
  counters_.constraint_accept_seconds += Now() - start;
}

void Engine::ConstrainLogits(Sequence& s, std::span<float> logits, int32_t step) {
  const size_t words = std::max((logits.size() + 31) / 32, s.matcher->grammar().vocabulary().mask_words());
  constraint_mask_.assign(words, 0);
  s.matcher->FillNextTokenBitmask(constraint_mask_);
  MaskLogits(logits, constraint_mask_);
  if (step >= s.min_tokens) return;
  // min_tokens holds back EOS and stop tokens, unless the grammar allows nothing else (it
  // is complete): the constraint wins, as in vLLM.
  std::vector<std::pair<int32_t, float>> kept;
  for (const std::vector<int32_t>* ids : {&eos_ids_, &s.stop_token_ids}) {
    for (int32_t id : *ids) {
      if (id >= 0 && static_cast<size_t>(id) < logits.size()) kept.emplace_back(id, logits[id]);
    }
  }
  SuppressTokens(logits, eos_ids_);
  SuppressTokens(logits, s.stop_token_ids);
  for (float l : logits) {
    if (std::isfinite(l)) return;
  }
  for (const auto& [id, l] : kept) logits[id] = l;
}

}  // namespace tandem
