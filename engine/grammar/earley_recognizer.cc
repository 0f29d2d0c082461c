#include "engine/grammar/earley_recognizer.h"

#include <algorithm>
#include <limits>

namespace tandem::grammar {

EarleyRecognizer::EarleyRecognizer(const RuleTable& table)
    : table_(table),
      pos_stamp_(table.num_positions(), 0),
      pos_head_(table.num_positions(), -1),
      rule_stamp_(table.num_rules(), 0) {}

void EarleyRecognizer::Clear() {
  items_.clear();
  next_same_.clear();
  set_begin_.clear();
  set_flags_.clear();
  indexed_.clear();
}

void EarleyRecognizer::ResetToStart() {
  Clear();
  const Item seed{table_.start_position(), 0};
  StartSet({&seed, 1});
}

void EarleyRecognizer::NewStamp() {
  if (stamp_ == std::numeric_limits<uint32_t>::max()) {
    std::fill(pos_stamp_.begin(), pos_stamp_.end(), 0);
    std::fill(rule_stamp_.begin(), rule_stamp_.end(), 0);
    stamp_ = 0;
  }
  ++stamp_;
}

void EarleyRecognizer::StartSet(std::span<const Item> seeds) {
  NewStamp();
  set_begin_.push_back(static_cast<uint32_t>(items_.size()));
  set_flags_.push_back(0);
  for (const Item& s : seeds) Add(s.pos, s.origin);
  Close(static_cast<int32_t>(set_begin_.size() - 1));
}

inline void EarleyRecognizer::Add(int32_t pos, int32_t origin) {
  ++work_;
  const int32_t index = static_cast<int32_t>(items_.size());
  if (pos_stamp_[pos] != stamp_) {
    pos_stamp_[pos] = stamp_;
    pos_head_[pos] = index;
    next_same_.push_back(-1);
    items_.push_back({pos, origin});
    return;
  }
  for (int32_t j = pos_head_[pos]; j >= 0; j = next_same_[j]) {
    if (items_[j].origin == origin) return;
  }
  next_same_.push_back(pos_head_[pos]);
  pos_head_[pos] = index;
  items_.push_back({pos, origin});
}

void EarleyRecognizer::Close(int32_t set) {
  uint8_t flags = 0;
  for (size_t j = set_begin_[set]; j < items_.size(); ++j) {
    const Item it = items_[j];
    switch (table_.kind(it.pos)) {
      case RuleTable::kTerminal:
        break;
      case RuleTable::kRule: {
        const int32_t r = table_.arg(it.pos);
        if (rule_stamp_[r] != stamp_) {
          rule_stamp_[r] = stamp_;
          for (int32_t a : table_.alternatives(r)) Add(a, set);
        }
        if (table_.nullable(r)) Add(it.pos + 1, it.origin);
        break;
      }
      case RuleTable::kEnd: {
        const int32_t r = table_.arg(it.pos);
        if (r == table_.start_rule()) flags |= kCanEnd;
        if (it.origin == set) break;  // nullable completions: see the header
        Complete(r, it.origin);
        break;
      }
      case RuleTable::kExit:
        flags |= kHasExit;
        break;
    }
  }
  set_flags_[set] = flags;
}

void EarleyRecognizer::Complete(int32_t rule, int32_t origin) {
  const uint32_t begin = set_begin_[origin], end = set_begin_[origin + 1];
  if (end - begin <= kIndexedSetSize) {
    for (uint32_t w = begin; w < end; ++w) {
      const int32_t wp = items_[w].pos;
      if (table_.kind(wp) == RuleTable::kRule && table_.arg(wp) == rule) Add(wp + 1, items_[w].origin);
    }
    return;
  }
  if (indexed_.size() <= static_cast<size_t>(origin)) {
    indexed_.resize(origin + 1, 0);
    if (waiters_.size() < indexed_.size()) waiters_.resize(indexed_.size());
  }
  auto& index = waiters_[origin];
  if (!indexed_[origin]) {
    index.clear();
    for (uint32_t w = begin; w < end; ++w) {
      const int32_t wp = items_[w].pos;
      if (table_.kind(wp) == RuleTable::kRule) index.push_back({table_.arg(wp), static_cast<int32_t>(w)});
    }
    std::sort(index.begin(), index.end());
    indexed_[origin] = 1;
  }
  auto it = std::lower_bound(index.begin(), index.end(), std::pair<int32_t, int32_t>{rule, -1});
  for (; it != index.end() && it->first == rule; ++it) {
    const Item w = items_[it->second];
    Add(w.pos + 1, w.origin);
  }
}

bool EarleyRecognizer::Push(uint8_t byte) {
  const size_t cur_begin = set_begin_.back(), cur_end = items_.size();
  NewStamp();
  const uint32_t begin = static_cast<uint32_t>(items_.size());
  set_begin_.push_back(begin);
  set_flags_.push_back(0);
  for (size_t j = cur_begin; j < cur_end; ++j) {
    const Item it = items_[j];
    if (table_.kind(it.pos) == RuleTable::kTerminal && table_.byte_set(it.pos).Contains(byte)) {
      Add(it.pos + 1, it.origin);
    }
  }
  if (items_.size() == begin) {
    set_begin_.pop_back();
    set_flags_.pop_back();
    return false;
  }
  Close(static_cast<int32_t>(set_begin_.size() - 1));
  return true;
}

void EarleyRecognizer::PopTo(size_t num_sets) {
  if (num_sets >= set_begin_.size()) return;
  items_.resize(set_begin_[num_sets]);
  next_same_.resize(set_begin_[num_sets]);
  set_begin_.resize(num_sets);
  set_flags_.resize(num_sets);
  if (indexed_.size() > num_sets) indexed_.resize(num_sets);
}

ByteSet EarleyRecognizer::NextBytes() const {
  ByteSet out;
  for (const Item& it : Set(set_begin_.size() - 1)) {
    if (table_.kind(it.pos) != RuleTable::kTerminal) continue;
    const ByteSet& s = table_.byte_set(it.pos);
    for (int k = 0; k < 4; ++k) out.bits[k] |= s.bits[k];
  }
  return out;
}

}  // namespace tandem::grammar
