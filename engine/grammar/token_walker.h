// Tries the tokens of a vocabulary trie against an Earley recognizer: the tokens below
// given trie nodes are pushed byte by byte from the recognizer's current state (which
// stands for the trie's root), sharing prefixes, and sorted into three outcomes:
//   - accepted: every byte was consumed;
//   - uncertain: the recognizer died inside the token after reaching an exit marker
//     (RuleTable::kExit) at an earlier byte: the rest of the token belongs to a context
//     the recognizer does not hold (reported as whole trie subtrees);
//   - rejected: everything else (not reported).
// Uncertain subtrees carry the depth (bytes into the token) at which an exit was
// reached on the way to them: what follows that depth is up to the context.
//
// WalkSuffixes tries byte strings (token suffixes) the same way, for the matcher's run
// time check of uncertain tokens.
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

// A token's bytes from `offset` on.
struct TokenSuffix {
  int32_t token;
  int32_t offset;
};

// Tokens left undecided: those below trie node `node`, from byte `depth` on (an exit
// was reached there, above the node). A subtree with several exits on its way appears
// once per exit depth.
struct UncertainSubtree {
  int32_t node;
  int32_t depth;
  bool operator==(const UncertainSubtree&) const = default;
  bool operator<(const UncertainSubtree& o) const { return node != o.node ? node < o.node : depth < o.depth; }
};

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
                    std::vector<UncertainSubtree>* uncertain);

  // Walks the subtree of `node` with its path shifted: the path's bytes from `offset`
  // on are pushed first. Appends the ids of the subtree's tokens consumed entirely
  // (their bytes from `offset` on) to *accepted.
  absl::Status WalkShifted(int32_t node, int32_t offset, std::vector<int32_t>* accepted);

  // Tries each suffix (sorted by its bytes: SortSuffixes) from the recognizer's current
  // state; appends the index of each one consumed entirely to *accepted. Leaves the
  // recognizer as it found it.
  absl::Status WalkSuffixes(std::span<const TokenSuffix> suffixes, std::vector<int32_t>* accepted);
  // Sorts by suffix bytes and drops duplicates.
  static void SortSuffixes(const GrammarVocabulary& vocabulary, std::vector<TokenSuffix>* suffixes);

  // Bytes pushed so far over all walks (successful pushes), for statistics.
  uint64_t pushes() const { return pushes_; }

 private:
  bool Push(uint8_t byte);
  void WalkSubtree(int32_t node);
  void Uncertain(int32_t node) {
    for (int32_t d : exit_depths_) uncertain_->push_back({node, d});
  }
  void Pushed(size_t depth) {
    if (rec_.HasExit()) exit_depths_.push_back(static_cast<int32_t>(depth));
  }
  void PoppedTo(size_t depth) {
    while (!exit_depths_.empty() && exit_depths_.back() > static_cast<int32_t>(depth)) exit_depths_.pop_back();
  }

  const GrammarVocabulary& vocab_;
  EarleyRecognizer& rec_;
  absl::Time deadline_;
  size_t base_ = 0;                // recognizer sets at the trie root
  std::vector<int32_t> exit_depths_;  // on the current path
  std::vector<int32_t>* accepted_ = nullptr;
  std::vector<UncertainSubtree>* uncertain_ = nullptr;
  std::vector<UncertainSubtree> ignored_;
  uint64_t pushes_ = 0;
  uint64_t checked_at_work_ = 0;
  bool expired_ = false;
};

}  // namespace tandem::grammar
