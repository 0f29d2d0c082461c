// A grammar flattened for the Earley recognizer: every alternative's symbols laid out one
// after another, each followed by an end marker, so that an Earley item is a position in
// this table (an LR(0) item: rule, alternative, dot) plus an origin.
//
// Building the table also specializes rules by site: a rule that is referenced from
// several places, is not recursive and is small gets one copy per referencing site (up
// to a budget). A rule referenced from exactly one site has a known continuation when it
// completes, which lets the token mask precomputation (compiled_grammar.h) decide far
// more tokens at compile time; shared helper rules ("string", a character class) would
// otherwise leave every token that crosses their end to the run time check. Copies are
// the same language; the precomputation shares the work between identical copies
// (canonical_rule).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/grammar/grammar.h"

namespace tandem::grammar {

struct RuleTableOptions {
  // Positions the copies may add in all (beyond the grammar's own).
  size_t specialization_budget = 200000;
  // A rule is copied only if it, with everything it references (counted as a tree),
  // has at most this many positions.
  size_t max_copied_rule_size = 4096;
  // Bounded repetition rules allowing more than this many further copies share their
  // canonical number (canonical_rule) with the one allowing this many plus one: within
  // this many bytes (set to the longest token) they cannot be told apart. 0: off.
  int32_t repeat_horizon = 0;
};

class RuleTable {
 public:
  enum Kind : uint8_t {
    kTerminal,  // arg: byte set
    kRule,      // arg: the rule expected next
    kEnd,       // arg: the rule this alternative completes
    kExit,      // a marker for the precomputation: the rule below it completed
  };

  static RuleTable Build(const Grammar& grammar, const RuleTableOptions& options = {});

  size_t num_positions() const { return kind_.size(); }
  Kind kind(int32_t pos) const { return static_cast<Kind>(kind_[pos]); }
  int32_t arg(int32_t pos) const { return arg_[pos]; }
  int32_t rule_of(int32_t pos) const { return rule_of_[pos]; }
  int32_t dot(int32_t pos) const { return dot_[pos]; }  // index of the symbol in its alternative
  const ByteSet& byte_set(int32_t pos) const { return byte_sets_[arg_[pos]]; }
  const std::vector<ByteSet>& byte_sets() const { return byte_sets_; }

  size_t num_rules() const { return alt_starts_.size(); }
  const std::vector<int32_t>& alternatives(int32_t rule) const { return alt_starts_[rule]; }
  bool nullable(int32_t rule) const { return nullable_[rule] != 0; }
  const std::string& rule_name(int32_t rule) const { return names_[rule]; }
  // The position [kRule rule][kExit]: an item there waits for `rule` and marks its
  // completion.
  int32_t exit_wait(int32_t rule) const { return exit_wait_[rule]; }
  // An end marker of `rule` (an item there completes it).
  int32_t end_position(int32_t rule) const { return end_position_[rule]; }
  // $start ::= root; the parse starts with an item at start_position().
  int32_t start_rule() const { return start_rule_; }
  int32_t start_position() const { return alt_starts_[start_rule_][0]; }
  int32_t end_of_start() const { return start_position() + 1; }

  // Positions that expect `rule` (kRule, arg == rule), except its own left-recursive
  // ones (the first symbol of one of its alternatives).
  const std::vector<int32_t>& sites(int32_t rule) const { return sites_[rule]; }
  // Rules with identical bodies, up to renaming of rules with identical bodies, share a
  // number; recursive rules have their own; bounded repetition rules deeper than the
  // horizon share the number of the first beyond it (RuleTableOptions::repeat_horizon):
  // identical for any input of at most that many bytes.
  int32_t canonical_rule(int32_t rule) const { return canonical_[rule]; }
  size_t num_canonical_rules() const { return num_canonical_; }
  // Whether a site is a tail call: the last symbol of its alternative, in a rule without
  // left self-recursion, so that completing the rule there completes the site's rule.
  bool is_tail_site(int32_t site) const {
    return kind(site + 1) == kEnd && !self_recursive_[rule_of(site)];
  }
  // How many rules the specialization added.
  size_t num_copies() const { return num_copies_; }

 private:
  std::vector<uint8_t> kind_;
  std::vector<int32_t> arg_;
  std::vector<int32_t> rule_of_;
  std::vector<int32_t> dot_;
  std::vector<ByteSet> byte_sets_;
  std::vector<std::vector<int32_t>> alt_starts_;
  std::vector<char> nullable_;
  std::vector<std::string> names_;
  std::vector<int32_t> exit_wait_;
  std::vector<int32_t> end_position_;
  std::vector<std::vector<int32_t>> sites_;
  std::vector<int32_t> canonical_;
  std::vector<char> self_recursive_;  // per rule: has an alternative starting with itself
  size_t num_canonical_ = 0;
  size_t num_copies_ = 0;
  int32_t start_rule_ = 0;
};

}  // namespace tandem::grammar
