// Snapshots of a sequence's per-sequence KV streams (rings and states, kv_streams.h) at
// block boundaries, for prefix caching on a layout that has such streams (DeepSeek-V4's
// sliding window and compressor states): a prefix-cache hit takes the shared blocks for
// the paged streams and copies the snapshot taken where the prefix ends into its own
// slot, so it continues from exactly the state a full prefill reaches there.
//
// A snapshot is keyed by the hash of the block that ends at its boundary (block_hash.h:
// the chain value covers every token before it, the layout and the weights), so it stays
// right whatever happens to that block; a prefix is usable where both its blocks are
// cached and the snapshot of its last block is here. The snapshots live in a fixed set of
// the KV pool's sequence slots, least recently used first out. A snapshot a waiting
// restore will read is pinned until the engine copied it.
//
// Bookkeeping on the engine thread (the engine copies the rows: KvPool::CopySequenceSlot).
#pragma once

#include <cstdint>
#include <list>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace tandem {

class PrefixStates {
 public:
  // Pool slots [first_slot, first_slot + num_slots) hold the snapshots.
  PrefixStates(int32_t first_slot, int32_t num_slots);

  int32_t size() const { return static_cast<int32_t>(entries_.size()); }
  int32_t num_held() const { return static_cast<int32_t>(by_hash_.size()); }
  int64_t evictions() const { return evictions_; }
  // Changes whenever the set of held hashes does (for a mirror kept elsewhere).
  uint64_t version() const { return version_; }
  std::vector<uint64_t> HeldHashes() const;

  bool Contains(uint64_t hash) const { return by_hash_.contains(hash); }
  // The slot of `hash`'s snapshot, -1 when there is none; for a read right now (nothing
  // pinned, the LRU order unchanged).
  int32_t Find(uint64_t hash) const {
    const auto it = by_hash_.find(hash);
    return it == by_hash_.end() ? -1 : first_slot_ + it->second;
  }
  // The slot of `hash`'s snapshot, pinned (Unpin after the copy) and made the most
  // recently used; -1 when there is none.
  int32_t Acquire(uint64_t hash);
  void Unpin(int32_t slot);
  // The slot to write the snapshot after `hash` into: an empty one, else the least
  // recently used unpinned one (its snapshot forgotten). -1 when `hash` has one already
  // or every slot is pinned.
  int32_t Put(uint64_t hash);
  // Drops `hash`'s snapshot unless it is pinned (its slot is the next to be reused).
  void Forget(uint64_t hash);

 private:
  struct Entry {
    bool held = false;
    uint64_t hash = 0;
    int32_t pins = 0;
    std::list<int32_t>::iterator lru;  // in lru_ (every entry is, held or not)
  };
  Entry& At(int32_t slot);
  void Touch(int32_t index);

  int32_t first_slot_;
  std::vector<Entry> entries_;
  std::list<int32_t> lru_;  // entry indices, least recently used first; empty entries in front
  absl::flat_hash_map<uint64_t, int32_t> by_hash_;
  int64_t evictions_ = 0;
  uint64_t version_ = 0;
};

}  // namespace tandem
