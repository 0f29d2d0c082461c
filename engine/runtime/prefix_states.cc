#include "engine/runtime/prefix_states.h"

#include "kernels/common/check.h"

namespace tandem {

PrefixStates::PrefixStates(int32_t first_slot, int32_t num_slots) : first_slot_(first_slot) {
  TANDEM_CHECK(first_slot >= 0 && num_slots >= 0) << first_slot << " " << num_slots;
  entries_.resize(static_cast<size_t>(num_slots));
  for (int32_t i = 0; i < num_slots; ++i) entries_[i].lru = lru_.insert(lru_.end(), i);
  by_hash_.reserve(static_cast<size_t>(num_slots));
}

PrefixStates::Entry& PrefixStates::At(int32_t slot) {
  const int32_t i = slot - first_slot_;
  TANDEM_CHECK(i >= 0 && i < size()) << "snapshot slot " << slot;
  return entries_[i];
}

void PrefixStates::Touch(int32_t index) {
  lru_.splice(lru_.end(), lru_, entries_[index].lru);
}

int32_t PrefixStates::Acquire(uint64_t hash) {
  const auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  ++entries_[it->second].pins;
  Touch(it->second);
  return first_slot_ + it->second;
}

void PrefixStates::Unpin(int32_t slot) {
  Entry& e = At(slot);
  TANDEM_CHECK(e.pins > 0) << "snapshot slot " << slot << " is not pinned";
  --e.pins;
}

int32_t PrefixStates::Put(uint64_t hash) {
  if (by_hash_.contains(hash)) return -1;
  for (const int32_t i : lru_) {
    Entry& e = entries_[i];
    if (e.pins > 0) continue;
    if (e.held) {
      by_hash_.erase(e.hash);
      ++evictions_;
    }
    e.held = true;
    e.hash = hash;
    by_hash_[hash] = i;
    ++version_;
    Touch(i);
    return first_slot_ + i;
  }
  return -1;
}

void PrefixStates::Forget(uint64_t hash) {
  const auto it = by_hash_.find(hash);
  if (it == by_hash_.end() || entries_[it->second].pins > 0) return;
  Entry& e = entries_[it->second];
  e.held = false;
  lru_.splice(lru_.begin(), lru_, e.lru);
  by_hash_.erase(it);
  ++version_;
}

std::vector<uint64_t> PrefixStates::HeldHashes() const {
  std::vector<uint64_t> out;
  out.reserve(by_hash_.size());
  for (const auto& [hash, index] : by_hash_) out.push_back(hash);
  return out;
}

}  // namespace tandem
