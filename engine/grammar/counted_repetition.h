// A shortcut for step 1 of the token mask precomputation (compiled_grammar.h) at
// positions inside a counted repetition: X{m,n} lowers to m copies of X and a chain of
// optional ones (grammar.h), so the positions within a longest token of either bound
// each need a different answer, and each used to cost a walk of the whole vocabulary
// trie (hundreds of walks for a JSON string of minLength 500 and maxLength 1500).
//
// The answer depends on the position only through how many copies of X it still needs
// (k) and allows (K), and what follows them (R). One walk of the trie with X repeated
// without bound records, per token, how many whole copies of X it starts with and where
// it leaves X; every position's answer is then derived from those figures:
//   - accepted: tokens made of copies of X (the last one possibly unfinished) whose
//     count fits K, and tokens that leave X after i copies, k <= i <= K, into R and are
//     consumed by R (R walked from there: only those subtrees, shared between positions);
//   - uncertain (an exit reached, then refused): where the walk of the position would
//     die, with the depths at which R's start could exit (the boundaries of copies k..K
//     on the token's path) and those R reaches itself.
// The derivation is exact, not an approximation, under conditions it checks (else the
// caller walks the trie as before): the language of X is prefix-free on every path of
// the trie (so a token splits into copies of X one way only), X does not match the
// empty string, and no byte that can start X can start R (so at a copy's boundary the
// next byte says whether the token stays in X or leaves it).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/grammar/rule_table.h"
#include "engine/grammar/stack_walker.h"
#include "engine/grammar/token_walker.h"
#include "engine/grammar/vocabulary.h"

namespace tandem::grammar {

class CountedRepetitions {
 public:
  // `machine` and `walker` are the precomputation's (shared states and caches);
  // `horizon` is the longest token's length in bytes.
  CountedRepetitions(const RuleTable& table, const GrammarVocabulary& vocabulary, StackMachine* machine,
                     StackTrieWalker* walker, int64_t horizon, absl::Time deadline);
  ~CountedRepetitions();

  // Step 1 for position p (what StackTrieWalker::Walk from the state of p alone over the
  // whole trie gives, candidates sorted by node then depth) when p lies in a counted
  // repetition the shortcut handles; false when it does not (walk instead). Errors:
  // DEADLINE_EXCEEDED; FAILED_PRECONDITION when the stack machine cannot run the grammar.
  absl::StatusOr<bool> Derive(int32_t p, std::vector<int32_t>* accepted, std::vector<UncertainSubtree>* uncertain);

  // Step 2's walk of step 1's candidates `starts` (subtrees, each from its exit depth)
  // from the state of `stack` (StackMachine::Initial's argument) when the stack's
  // innermost position lies in a counted repetition the shortcut handles: what
  // StackTrieWalker::WalkShifted of each start gives, together; false when it does not
  // (walk instead). The figures are those of the starts' subtrees (`group` names the
  // starts, the same for every call with the same ones), walked once for every stack:
  // near a bound each copy of X has its own state, and hundreds of them walked the
  // same subtrees. Errors: as Derive.
  // The outcome is shared by every stack whose run differs only in counts the starts'
  // tokens cannot reach (null: not handled; it lives as long as this object).
  struct Outcome {
    std::vector<int32_t> accepted;
    std::vector<UncertainSubtree> uncertain;
  };
  absl::StatusOr<const Outcome*> DeriveShifted(std::span<const int32_t> stack, int64_t group,
                                               std::span<const UncertainSubtree> starts);

  // When the innermost position of `stack` lies in a counted repetition: appends to
  // *key what its state does to strings crossing fewer than `clip` copies' boundaries
  // (the element, the counts clipped to `clip`, the state after the copies) and returns
  // true; two stacks with equal keys are alike to such strings.
  bool ClippedRun(std::span<const int32_t> stack, int64_t clip, std::vector<int32_t>* key);

  // Positions answered by Derive, and step 2's groups answered by DeriveShifted, for
  // statistics.
  size_t derived() const { return derived_; }
  size_t derived_groups() const { return derived_groups_; }

 private:
  // The repeated symbol: a terminal (its byte set) or a rule (its canonical class).
  struct Element {
    bool terminal = false;
    ByteSet set;
    int32_t canonical = -1;
    int32_t rule = -1;  // a rule of the class
  };
  // What a position still needs: between `min` and `max` copies (max capped beyond the
  // horizon, where no token can tell), then position `after` (-1 when `min` already
  // exceeds the horizon: nothing after the copies is within reach of a token).
  struct Run {
    Element x;
    int64_t min = 0;
    int64_t max = 0;
    int64_t uncapped = 0;  // min + optional copies, saturated
    int32_t after = -1;
  };
  struct Figures;

  bool Matches(int32_t pos, const Element& x) const;
  bool ElementOf(int32_t pos, Element* x) const;
  // The optional copies a rule referenced at `pos` allows when it is an X{0,j} chain
  // (Tj ::= "" | X T(j-1)) or X* / X+ (h ::= "" | h X, h ::= X | h X); -1 otherwise.
  int64_t OptionalCopies(int32_t rule, const Element& x, bool* plus) const;
  bool Recognize(int32_t p, Run* run);
  bool RecognizeOnce(int32_t p, Run* run) const;
  static std::string KeyOf(const Element& x);
  // X's figures over the subtrees of `starts` ({0, 0}: the whole trie), each walked from
  // its depth with a copy of X starting there; null when X is not prefix-free on them.
  absl::StatusOr<std::unique_ptr<Figures>> Compute(const Element& x, std::span<const UncertainSubtree> starts);
  // R for a stack whose innermost position begins `run`: the stack with that position
  // past the copies (*rest; empty and kDead when nothing after them is within reach).
  StackMachine::State After(std::span<const int32_t> stack, const Run& run, std::vector<int32_t>* rest);
  // The outcome for `run` followed by the state of `rest` (empty: nothing within reach).
  absl::StatusOr<bool> Apply(const Figures& f, const Run& run, std::span<const int32_t> rest,
                             std::vector<int32_t>* accepted, std::vector<UncertainSubtree>* uncertain);

  const RuleTable& table_;
  const GrammarVocabulary& vocab_;
  StackMachine& machine_;
  StackTrieWalker& walker_;
  int64_t horizon_;
  absl::Time deadline_;
  // By element (and group, for step 2's); null: not prefix-free.
  absl::flat_hash_map<std::string, std::unique_ptr<Figures>> figures_;
  // R walked from where a token leaves X: (state of R, node, offset) -> outcome.
  absl::flat_hash_map<std::tuple<int32_t, int32_t, int32_t>, Outcome> subtrees_;
  // DeriveShifted's outcomes: (figures of the element and group, min and max copies
  // clipped to what its tokens reach, state of R) -> outcome.
  absl::node_hash_map<std::tuple<const Figures*, int64_t, int64_t, int32_t>, Outcome> shifted_;
  absl::flat_hash_map<int32_t, std::pair<Run, bool>> runs_;  // Recognize's answers by position
  size_t derived_ = 0;
  size_t derived_groups_ = 0;
};

}  // namespace tandem::grammar
