// A grammar compiled against a vocabulary: its rule table and, for every position an
// Earley item can hold after consuming input, which tokens that item allows regardless
// of the rest of the parser's state (XGrammar's context-independent tokens), decided at
// compile time; the tokens that depend on the rest are left to the matcher's run time
// check (grammar_matcher.h).
//
// How a position p of rule R is precomputed:
//   1. Within R alone (shared by every copy of R: RuleTable::canonical_rule): a chart
//      holding an item at p, R's completion leading to an exit marker, walks the whole
//      vocabulary trie. Tokens consumed entirely are allowed by any item at p (whatever
//      lies below R in the real chart, this path exists there). Tokens that die after R
//      completed inside them are candidates; the rest are refused.
//   2. Through R's known continuation: while a rule has a single referencing site, its
//      completion can only go there (rule_table.h), so the candidates are walked again
//      with the chain of those sites under R, up to a rule with several sites (whose
//      completion is again an exit) or to $start (after which nothing may follow).
//      Candidates consumed entirely are allowed too; those dying after the outer exit
//      stay uncertain.
//      Each uncertain token is kept as the suffix after the depth at which the outer
//      rule completed (the rest is the context's), and only if some context could take
//      it: a chart whose bottom set holds every site of every rule (any rule's
//      completion may go to any of its sites, an over-approximation of every real
//      context) must consume the suffix after the outer rule's completion.
//   3. At run time the matcher unites what the items of the current set allow; for an
//      item with uncertain suffixes it follows the sites down the real chart to where
//      the outer rule began, builds the set that the outer rule's completion leads to
//      (the same whatever the token's prefix), and tries only the suffixes from there.
// Grammars whose rules are all specialized up to the root (what the JSON schema front
// end produces, recursion aside) leave nothing uncertain.
//
// Compile cost: one full trie walk per distinct (rule body, position) and a walk of the
// candidates per position; the deadline bounds it (a hostile grammar fails instead of
// holding a compile thread).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/rule_table.h"
#include "engine/grammar/token_walker.h"
#include "engine/grammar/vocabulary.h"

namespace tandem::grammar {

// A set of token ids: a sorted list when small, else a bitmask over the vocabulary.
struct TokenSet {
  std::vector<int32_t> ids;
  std::vector<uint32_t> bits;  // empty unless dense

  static TokenSet FromIds(std::vector<int32_t> ids, size_t vocab_size);
  bool empty() const { return ids.empty() && bits.empty(); }
  void OrInto(std::span<uint32_t> mask) const;
  size_t bytes() const { return ids.size() * sizeof(int32_t) + bits.size() * sizeof(uint32_t); }
};

struct CompileOptions {
  // Past it, Compile fails (INVALID_ARGUMENT, the message says the limit was reached).
  absl::Time deadline = absl::InfiniteFuture();
  RuleTableOptions table;
  // Walk with the stack machine (stack_walker.h) where it can run the grammar; the
  // Earley walker otherwise. The results are the same (tested); this is for tests.
  bool stack_walker = true;
  // Derive step 1 at positions inside counted repetitions (X{m,n}, X*, X+ beside required
  // copies) from per-token figures instead of a walk per position (counted_repetition.h).
  // The results are the same (tested); off is the general path, for tests and benchmarks.
  bool counted_repetitions = true;
};

class CompiledGrammar {
 public:
  // What one item position allows: base (shared between identical rule bodies) and
  // extra are allowed outright (indices of token_set(), which holds each distinct set
  // once; extra -1 for none); a token of `uncertain` is allowed when its suffix is
  // consumed after `outer` completes in the real chart (found below the item by
  // following each rule's single site, RuleTable::sites, up to `outer`).
  struct Entry {
    int32_t base = -1;
    int32_t extra = -1;
    int32_t outer = -1;
    std::vector<TokenSuffix> uncertain;  // sorted by suffix bytes
  };

  struct Stats {
    size_t positions = 0;         // in the rule table
    size_t entries = 0;           // positions with precomputed masks
    size_t shared_walks = 0;      // step 1 results (distinct rule bodies and positions)
    size_t derived = 0;           // of which derived from counted repetitions, not walked
    size_t derived_groups = 0;    // step 2's outcomes derived from counted repetitions
    size_t copies = 0;            // rules added by site specialization
    size_t uncertain = 0;         // token suffixes left to run time, over all entries
    size_t pruned = 0;            // suffixes no context can consume, dropped
    size_t mask_bytes = 0;        // storage of all token sets
    uint64_t pushes = 0;          // bytes pushed by all walks (stack machine steps included)
    size_t machine_states = 0;    // distinct stack machine states
    bool stack_walker = false;    // whether the stack machine ran every walk
    absl::Duration compile_time;  // wall time of Compile
  };

  // Errors: INVALID_ARGUMENT when the deadline passes during the precomputation ("the
  // grammar took longer to compile than its limit"), or when the grammar names a token
  // that is not a special token of the vocabulary, or one of its end tokens.
  static absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(
      const Grammar& grammar, std::shared_ptr<const GrammarVocabulary> vocabulary,
      const CompileOptions& options = {});

  const RuleTable& table() const { return table_; }
  const GrammarVocabulary& vocabulary() const { return *vocab_; }
  const std::shared_ptr<const GrammarVocabulary>& vocabulary_ptr() const { return vocab_; }
  // The entry of an item position, or null for positions no item holds after input
  // (dot 0, end markers).
  const Entry* entry(int32_t pos) const {
    const int32_t e = entry_of_[pos];
    return e < 0 ? nullptr : &entries_[e];
  }
  int32_t entry_index(int32_t pos) const { return entry_of_[pos]; }
  size_t num_entries() const { return entries_.size(); }
  const Entry& entry_at(int32_t index) const { return entries_[index]; }
  const TokenSet& token_set(int32_t index) const { return sets_[index]; }
  const Stats& stats() const { return stats_; }

 private:
  CompiledGrammar() = default;

  std::shared_ptr<const GrammarVocabulary> vocab_;
  RuleTable table_;
  std::vector<int32_t> entry_of_;
  std::vector<Entry> entries_;
  std::vector<TokenSet> sets_;
  Stats stats_;
};

}  // namespace tandem::grammar
