// Tries the tokens of a vocabulary trie against an Earley recognizer: the tokens below
// given trie nodes are pushed byte by byte from the recognizer's current state (which
// stands for the trie's root), sharing prefixes, and sorted into three outcomes:
//   - accepted: every byte was consumed;
//   - uncertain: the recognizer died inside the token after reaching an exit marker
//     (RuleTable::kExit) at an earlier byte: the rest of the token belongs to a context
//     the recognizer does not hold (reported as whole trie subtrees);
//   - rejected: everything else (not reported).
// At run time the recognizer holds the whole chart, so no exit is ever reached and the
// walk answers exactly which tokens the grammar allows.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/grammar/earley_recognizer.h"
#include "engine/grammar/vocabulary.h"

namespace tandem::grammar {

class TokenWalker {
 public:
  // Both must outlive the walker. The deadline is checked every few thousand bytes.
  TokenWalker(const GrammarVocabulary& vocabulary, EarleyRecognizer* recognizer,
              absl::Time deadline = absl::InfiniteFuture());

  // Walks the subtrees of `nodes` (trie node indices, ascending, none inside another's
  // subtree; {0} for the whole vocabulary). Appends accepted token ids to *accepted and
  // uncertain subtrees to *uncertain. Leaves the recognizer as it found it. Errors:
  // DEADLINE_EXCEEDED when the deadline passed (the outputs are then incomplete).
  absl::Status Walk(std::span<const int32_t> nodes, std::vector<int32_t>* accepted,
                    std::vector<int32_t>* uncertain);

  // Bytes pushed so far over all walks (successful pushes), for statistics.
  uint64_t pushes() const { return pushes_; }

 private:
  bool Push(uint8_t byte);
  void WalkSubtree(int32_t node);

  const GrammarVocabulary& vocab_;
  EarleyRecognizer& rec_;
  absl::Time deadline_;
  size_t base_ = 0;                // recognizer sets at the trie root
  std::vector<char> exited_;       // [depth]: an exit was reached at this depth or above
  std::vector<int32_t>* accepted_ = nullptr;
  std::vector<int32_t>* uncertain_ = nullptr;
  uint64_t pushes_ = 0;
  uint32_t until_check_ = 0;
  bool expired_ = false;
};

}  // namespace tandem::grammar
