// An Earley recognizer over bytes: a chart of item sets, one per byte consumed, grown
// by Push and shrunk by PopTo, so that a caller can try a byte string and take it back
// (the token trie walks of the mask computation and rollback both rely on it).
//
// Items are (position in a RuleTable, origin set). Prediction, scanning and completion
// are the textbook ones; nullable rules are handled as Aycock and Horspool do (an item
// waiting for a nullable rule also moves past it at once), so completions from the
// current set never need to be revisited. Duplicates are found through per-position
// chains valid for the set under construction, without hashing.
//
// Cost per byte: proportional to the items of the new set plus, for each completed
// item, the items of its origin set. Memory: the whole chart (it grows with the input,
// a few items per byte for the grammars front ends produce).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/grammar/grammar.h"
#include "engine/grammar/rule_table.h"

namespace tandem::grammar {

class EarleyRecognizer {
 public:
  struct Item {
    int32_t pos;
    int32_t origin;
  };

  // `table` must outlive the recognizer.
  explicit EarleyRecognizer(const RuleTable& table);

  // Empties the chart.
  void Clear();
  // The chart of the whole grammar before any byte: one set, $start predicted.
  void ResetToStart();
  // Appends a set holding `seeds` and their closure, without consuming a byte (used to
  // build charts for precomputation, whose lower sets stand for context).
  void StartSet(std::span<const Item> seeds);

  // Consumes `byte`: appends the set it leads to and returns true, or returns false and
  // leaves the chart as it was when no item accepts it.
  bool Push(uint8_t byte);
  // Keeps the first `num_sets` sets.
  void PopTo(size_t num_sets);
  size_t num_sets() const { return set_begin_.size(); }

  // About the last set: whether $start has completed (the input so far is a sentence),
  // whether an exit marker was reached (RuleTable::kExit), and which bytes Push accepts.
  bool CanEnd() const { return (set_flags_.back() & kCanEnd) != 0; }
  bool HasExit() const { return (set_flags_.back() & kHasExit) != 0; }
  ByteSet NextBytes() const;

  std::span<const Item> Set(size_t k) const {
    const size_t end = k + 1 < set_begin_.size() ? set_begin_[k + 1] : items_.size();
    return {items_.data() + set_begin_[k], end - set_begin_[k]};
  }
  const RuleTable& table() const { return table_; }
  // Items added so far (a measure of work done, for deadline checks).
  uint64_t work() const { return work_; }

 private:
  static constexpr uint8_t kCanEnd = 1;
  static constexpr uint8_t kHasExit = 2;

  // Sets larger than this get an index of their items by the rule they wait for, built
  // on the first completion that looks into them (sets below the last never change).
  static constexpr uint32_t kIndexedSetSize = 24;

  void NewStamp();
  void Add(int32_t pos, int32_t origin);
  void Close(int32_t set);
  void Complete(int32_t rule, int32_t origin);

  const RuleTable& table_;
  std::vector<Item> items_;
  std::vector<int32_t> next_same_;  // per item: the next item of its set at the same position
  std::vector<uint32_t> set_begin_;
  std::vector<uint8_t> set_flags_;
  std::vector<uint32_t> pos_stamp_;  // per position: the stamp of the set pos_head_ is about
  std::vector<int32_t> pos_head_;
  std::vector<uint32_t> rule_stamp_;  // per rule: predicted in the set of this stamp
  uint32_t stamp_ = 0;
  uint64_t work_ = 0;
  // Per set: (rule waited for, item index) sorted, when the set is indexed.
  std::vector<std::vector<std::pair<int32_t, int32_t>>> waiters_;
  std::vector<char> indexed_;
};

}  // namespace tandem::grammar
