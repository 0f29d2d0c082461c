// The token mask precomputation's fast walker: the same classification of a
// vocabulary trie's tokens as TokenWalker over an Earley chart (accepted, uncertain
// after an exit with its depths, refused), with the parser run as a stack machine
// whose states are interned and whose byte transitions are cached, so that the walk
// over hundreds of thousands of trie nodes costs a table lookup per node once the few
// distinct parser states are known.
//
// A machine state is the set of rule stacks (positions of a RuleTable, outermost
// first, the top a terminal about to be scanned) the input so far can be in, closed
// under prediction and completion, plus whether the outermost rule has completed (an
// exit, or $start's end). Left recursion of a rule on itself (h ::= h X, what
// repetitions lower to) loops at the same depth instead of pushing; a grammar whose
// closure would grow without consuming input (left recursion through other rules or
// nullable prefixes) makes the walk report it cannot run, and the caller uses the
// Earley walker instead.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/grammar/rule_table.h"
#include "engine/grammar/token_walker.h"
#include "engine/grammar/vocabulary.h"

namespace tandem::grammar {

class StackMachine {
 public:
  using State = int32_t;
  static constexpr State kDead = -1;

  explicit StackMachine(const RuleTable& table);

  // The state of one stack: `positions` outermost first (each but the last a kRule
  // position expecting the rule above it). When the outermost rule completes the state
  // exits, or, when it is $start, may end. nullopt-like kDead when the closure would
  // not terminate (see the header).
  State Initial(std::span<const int32_t> positions);
  // The state at the start of `rule` alone, every alternative: its completion exits.
  State Enter(int32_t rule);
  State Step(State s, uint8_t byte);
  bool HasExit(State s) const { return states_[s].exit; }
  bool CanEnd(State s) const { return states_[s].can_end; }
  const ByteSet& NextBytes(State s) const { return states_[s].next; }
  bool failed() const { return failed_; }  // a closure did not terminate
  size_t num_states() const { return states_.size(); }
  // Stacks expanded so far (a measure of work done, for deadline checks).
  uint64_t work() const { return work_; }

 private:
  static constexpr State kUnknown = -2;

  struct StateData {
    std::vector<int32_t> stacks;  // concatenated stacks, each preceded by its length
    std::vector<State> next_state;  // [256] once stepped from: kUnknown until computed
    ByteSet next;
    bool exit = false;
    bool can_end = false;
  };

  // Closes `stack` into `out` (scan stacks, concatenated with lengths) and the flags.
  void Expand(std::vector<int32_t>& stack, std::vector<int32_t>* out, bool* exit, bool* can_end, int budget);
  State Intern(std::vector<int32_t> stacks, bool exit, bool can_end);

  const RuleTable& t_;
  std::vector<std::vector<int32_t>> plain_alts_;  // per rule: alternatives not starting with the rule itself
  std::vector<std::vector<int32_t>> self_alts_;   // per rule: positions after the leading self reference
  std::vector<StateData> states_;
  absl::flat_hash_map<std::string, State> index_;
  State Compute(State s, uint8_t byte);
  // Scratch of one closure: stacks already expanded.
  absl::flat_hash_map<std::string, char> seen_;
  bool failed_ = false;
  uint64_t work_ = 0;
};

// TokenWalker's Walk over a StackMachine (see token_walker.h for the outputs).
class StackTrieWalker {
 public:
  StackTrieWalker(const GrammarVocabulary& vocabulary, StackMachine* machine, absl::Time deadline);
  // Errors: DEADLINE_EXCEEDED; FAILED_PRECONDITION when the machine cannot run this
  // grammar (use TokenWalker).
  absl::Status Walk(StackMachine::State start, std::span<const int32_t> nodes, std::vector<int32_t>* accepted,
                    std::vector<UncertainSubtree>* uncertain);
  // The subtree of `node` with its path shifted: from `start`, the path's bytes from
  // `offset` on, then the subtree (exit depths are bytes into the tokens).
  absl::Status WalkShifted(StackMachine::State start, int32_t node, int32_t offset, std::vector<int32_t>* accepted,
                           std::vector<UncertainSubtree>* uncertain);
  uint64_t steps() const { return steps_; }

 private:
  void WalkSubtree(int32_t node, StackMachine::State s);
  void Uncertain(int32_t node) {
    for (int32_t d : exit_depths_) uncertain_->push_back({node, d});
  }

  const GrammarVocabulary& vocab_;
  StackMachine& m_;
  absl::Time deadline_;
  std::vector<int32_t> exit_depths_;
  std::vector<int32_t>* accepted_ = nullptr;
  std::vector<UncertainSubtree>* uncertain_ = nullptr;
  uint64_t steps_ = 0;
  uint32_t until_check_ = 0;
  uint64_t checked_at_work_ = 0;
  bool expired_ = false;
};

}  // namespace tandem::grammar
