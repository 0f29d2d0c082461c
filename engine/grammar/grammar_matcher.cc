#include "engine/grammar/grammar_matcher.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "kernels/common/check.h"

namespace tandem::grammar {

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)),
      rec_(grammar_->table()),
      walker_(grammar_->vocabulary(), &rec_),
      entry_stamp_(grammar_->num_entries(), 0) {
  rec_.ResetToStart();
}

bool GrammarMatcher::AcceptBytes(std::string_view bytes) {
  if (terminated_) return false;
  const size_t before = rec_.num_sets();
  for (char c : bytes) {
    if (!rec_.Push(static_cast<uint8_t>(c))) {
      rec_.PopTo(before);
      return false;
    }
  }
  history_.push_back({static_cast<uint32_t>(before), false});
  return true;
}

bool GrammarMatcher::AcceptToken(int32_t token) {
  const GrammarVocabulary& v = grammar_->vocabulary();
  if (terminated_ || token < 0 || token >= v.size()) return false;
  if (v.is_end_token(token)) {
    if (!rec_.CanEnd()) return false;
    history_.push_back({static_cast<uint32_t>(rec_.num_sets()), true});
    terminated_ = true;
    return true;
  }
  // A special token's bytes are its marker, which only its token terminal matches.
  if (!v.matchable(token)) return false;
  return AcceptBytes(v.token_bytes(token));
}

void GrammarMatcher::Rollback(int num_tokens) {
  TANDEM_CHECK(num_tokens >= 0 && num_tokens <= static_cast<int>(history_.size())) << num_tokens;
  if (num_tokens == 0) return;
  const Accepted& first = history_[history_.size() - num_tokens];
  rec_.PopTo(first.sets_before);
  history_.resize(history_.size() - num_tokens);
  terminated_ = false;
  for (const Accepted& a : history_) terminated_ = terminated_ || a.end_token;
}

void GrammarMatcher::FillNextTokenBitmask(std::span<uint32_t> bitmask) {
  const GrammarVocabulary& v = grammar_->vocabulary();
  TANDEM_CHECK(bitmask.size() >= v.mask_words()) << bitmask.size();
  std::memset(bitmask.data(), 0, bitmask.size() * sizeof(uint32_t));
  if (terminated_) return;
  if (stamp_ == std::numeric_limits<uint32_t>::max()) {
    std::fill(entry_stamp_.begin(), entry_stamp_.end(), 0);
    stamp_ = 0;
  }
  ++stamp_;
  pending_.clear();
  const CompiledGrammar& g = *grammar_;
  const RuleTable& table = g.table();
  const auto use = [&](int32_t index, int32_t origin, int32_t pos) {
    const CompiledGrammar::Entry& e = g.entry_at(index);
    if (!e.uncertain.empty()) pending_.push_back({index, origin, pos});
    if (entry_stamp_[index] == stamp_) return;
    entry_stamp_[index] = stamp_;
    g.token_set(e.base).OrInto(bitmask);
    if (e.extra >= 0) g.token_set(e.extra).OrInto(bitmask);
  };
  const size_t last = rec_.num_sets() - 1;
  if (last == 0) {
    use(g.entry_index(table.start_position()), 0, table.start_position());
  } else {
    // The items that consumed input (origin before this set); the others were predicted
    // here by them, and their precomputed masks include what those allow.
    for (const EarleyRecognizer::Item& it : rec_.Set(last)) {
      if (static_cast<size_t>(it.origin) == last) continue;
      const RuleTable::Kind k = table.kind(it.pos);
      if (k != RuleTable::kTerminal && k != RuleTable::kRule) continue;
      const int32_t index = g.entry_index(it.pos);
      TANDEM_CHECK(index >= 0) << it.pos;
      use(index, it.origin, it.pos);
    }
  }
  if (!pending_.empty()) {
    std::sort(pending_.begin(), pending_.end(), [](const Pending& a, const Pending& b) {
      return a.entry != b.entry ? a.entry < b.entry : a.origin < b.origin;
    });
    pending_.erase(std::unique(pending_.begin(), pending_.end()), pending_.end());
  }
  for (const Pending& pend : pending_) {
    const CompiledGrammar::Entry& e = g.entry_at(pend.entry);
    // Down the sites to where the outer rule began.
    origins_.assign(1, pend.origin);
    for (int32_t rule = table.rule_of(pend.pos); rule != e.outer; rule = table.rule_of(table.sites(rule)[0])) {
      TANDEM_CHECK(table.sites(rule).size() == 1) << table.rule_name(rule);
      const int32_t site = table.sites(rule)[0];
      next_origins_.clear();
      for (int32_t o : origins_) {
        for (const EarleyRecognizer::Item& w : rec_.Set(static_cast<size_t>(o))) {
          if (w.pos == site) next_origins_.push_back(w.origin);
        }
      }
      std::sort(next_origins_.begin(), next_origins_.end());
      next_origins_.erase(std::unique(next_origins_.begin(), next_origins_.end()), next_origins_.end());
      origins_.swap(next_origins_);
    }
    TANDEM_CHECK(!origins_.empty());
    // The set the outer rule's completion leads to, then the suffixes from there.
    seeds_.clear();
    for (int32_t o : origins_) seeds_.push_back({table.end_position(e.outer), o});
    const size_t sets = rec_.num_sets();
    rec_.StartSet(seeds_);
    accepted_.clear();
    const absl::Status s = walker_.WalkSuffixes(e.uncertain, &accepted_);
    TANDEM_CHECK(s.ok()) << s;
    rec_.PopTo(sets);
    for (int32_t i : accepted_) {
      const int32_t id = e.uncertain[i].token;
      bitmask[id >> 5] |= uint32_t{1} << (id & 31);
    }
  }
  if (rec_.CanEnd()) {
    for (int32_t id : v.end_tokens()) bitmask[id >> 5] |= uint32_t{1} << (id & 31);
  }
}

}  // namespace tandem::grammar
