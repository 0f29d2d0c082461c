#include "engine/runtime/block_manager.h"

#include <algorithm>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/check.h"

namespace tandem {

BlockManager::BlockManager(int32_t num_blocks, int32_t max_pending_events, int32_t first_id)
    : num_blocks_(num_blocks), max_pending_events_(max_pending_events), first_id_(first_id) {
  TANDEM_CHECK_GE(num_blocks, 0);
  TANDEM_CHECK_GE(first_id, 0);
  TANDEM_CHECK_GE(max_pending_events, 0);
  const size_t n = static_cast<size_t>(num_blocks);
  ref_counts_.assign(n, 0);
  states_.assign(n, State::kFree);
  hashes_.assign(n, 0);
  published_.assign(n, 0);
  lru_prev_.assign(n, kNone);
  lru_next_.assign(n, kNone);
  // Popped from the back: block 0 is handed out first.
  free_list_.reserve(n);
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_list_.push_back(b);
  // At most one hash per block, so the map never grows past this.
  hash_to_block_.reserve(n);
  pending_events_.reserve(static_cast<size_t>(max_pending_events));
}

int32_t BlockManager::Local(int32_t id) const {
  const int32_t block = id - first_id_;
  TANDEM_CHECK(block >= 0 && block < num_blocks_)
      << "block id " << id << " outside [" << first_id_ << ", " << first_id_ + num_blocks_ << ")";
  return block;
}

void BlockManager::LruPushBack(int32_t block) {
  lru_prev_[block] = lru_tail_;
  lru_next_[block] = kNone;
  if (lru_tail_ == kNone) {
    lru_head_ = block;
  } else {
    lru_next_[lru_tail_] = block;
  }
  lru_tail_ = block;
  ++lru_size_;
}

void BlockManager::LruRemove(int32_t block) {
  const int32_t prev = lru_prev_[block];
  const int32_t next = lru_next_[block];
  if (prev == kNone) {
    lru_head_ = next;
  } else {
    lru_next_[prev] = next;
  }
  if (next == kNone) {
    lru_tail_ = prev;
  } else {
    lru_prev_[next] = prev;
  }
  lru_prev_[block] = lru_next_[block] = kNone;
  --lru_size_;
}

void BlockManager::RecordEvent(KvCacheEvent::Kind kind, uint64_t hash) {
  if (static_cast<int32_t>(pending_events_.size()) < max_pending_events_) {
    pending_events_.push_back({kind, hash});
  } else {
    ++dropped_since_take_;
    ++stats_.dropped_events;
  }
}

int32_t BlockManager::EvictOldest() {
  const int32_t block = lru_head_;
  TANDEM_CHECK(block != kNone) << "no evictable block";
  LruRemove(block);
  const uint64_t hash = hashes_[block];
  const size_t erased = hash_to_block_.erase(hash);
  TANDEM_CHECK_EQ(erased, size_t{1}) << "cached block " << block << " missing from the hash map";
  published_[block] = 0;
  hashes_[block] = 0;
  states_[block] = State::kFree;
  ++stats_.evictions;
  RecordEvent(KvCacheEvent::Kind::kRemoved, hash);
  return block;
}

absl::StatusOr<std::vector<int32_t>> BlockManager::Allocate(int32_t n) {
  TANDEM_CHECK_GE(n, 0);
  if (n > num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache: need ", n, " blocks, ", num_free(), " available (", num_unused(), " free + ",
        lru_size_, " evictable cached) of ", num_blocks_, " (", num_in_use_, " in use)"));
  }
  std::vector<int32_t> blocks;
  blocks.reserve(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    int32_t block;
    if (!free_list_.empty()) {
      block = free_list_.back();
      free_list_.pop_back();
    } else {
      block = EvictOldest();
    }
    TANDEM_CHECK(states_[block] == State::kFree && ref_counts_[block] == 0) << "block " << block;
    states_[block] = State::kInUse;
    ref_counts_[block] = 1;
    ++num_in_use_;
    blocks.push_back(block + first_id_);
  }
  return blocks;
}

void BlockManager::Release(std::span<const int32_t> blocks) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const int32_t block = Local(*it);
    TANDEM_CHECK(ref_counts_[block] > 0)
        << "releasing block " << *it << " that is not held (double free?)";
    if (--ref_counts_[block] > 0) continue;
    --num_in_use_;
    if (published_[block]) {
      states_[block] = State::kCached;
      LruPushBack(block);
    } else {
      states_[block] = State::kFree;
      free_list_.push_back(block);
    }
  }
}

bool BlockManager::Publish(int32_t id, uint64_t hash) {
  const int32_t block = Local(id);
  TANDEM_CHECK(ref_counts_[block] > 0) << "publishing block " << block << " that is not held";
  if (published_[block]) {
    TANDEM_CHECK(hashes_[block] == hash)
        << "block " << block << " already published under hash " << hashes_[block]
        << ", now " << hash;
    return true;
  }
  const auto [it, inserted] = hash_to_block_.try_emplace(hash, block);
  if (!inserted) {
    ++stats_.rejected_publishes;
    return false;
  }
  published_[block] = 1;
  hashes_[block] = hash;
  RecordEvent(KvCacheEvent::Kind::kStored, hash);
  return true;
}

std::vector<int32_t> BlockManager::AcquireCachedPrefix(std::span<const uint64_t> hashes, size_t at_most) {
  ++stats_.prefix_queries;
  stats_.queried_blocks += static_cast<int64_t>(hashes.size());
  std::vector<int32_t> blocks;
  for (const uint64_t hash : hashes.first(std::min(hashes.size(), at_most))) {
    const auto it = hash_to_block_.find(hash);
    if (it == hash_to_block_.end()) break;
    const int32_t block = it->second;
    if (ref_counts_[block] == 0) {
      TANDEM_CHECK(states_[block] == State::kCached) << "block " << block;
      LruRemove(block);
      states_[block] = State::kInUse;
      ++num_in_use_;
    }
    ++ref_counts_[block];
    if (blocks.empty()) blocks.reserve(hashes.size());
    blocks.push_back(block + first_id_);
  }
  stats_.hit_blocks += static_cast<int64_t>(blocks.size());
  return blocks;
}

int32_t BlockManager::CachedPrefixLength(std::span<const uint64_t> hashes) const {
  int32_t n = 0;
  for (const uint64_t hash : hashes) {
    if (!hash_to_block_.contains(hash)) break;
    ++n;
  }
  return n;
}

int32_t BlockManager::ref_count(int32_t id) const { return ref_counts_[Local(id)]; }

bool BlockManager::is_published(int32_t id) const { return published_[Local(id)] != 0; }

KvCacheEvents BlockManager::TakeEvents() {
  KvCacheEvents out;
  out.events.assign(pending_events_.begin(), pending_events_.end());
  out.dropped = dropped_since_take_;
  pending_events_.clear();  // keeps its capacity
  dropped_since_take_ = 0;
  return out;
}

std::vector<uint64_t> BlockManager::CachedHashes() const {
  std::vector<uint64_t> out;
  out.reserve(hash_to_block_.size());
  for (const auto& [hash, block] : hash_to_block_) out.push_back(hash);
  return out;
}

void BlockManager::CheckInvariants() const {
  int32_t in_use = 0, free = 0, cached = 0, published = 0;
  for (int32_t b = 0; b < num_blocks_; ++b) {
    TANDEM_CHECK_GE(ref_counts_[b], 0) << "block " << b;
    switch (states_[b]) {
      case State::kInUse:
        TANDEM_CHECK(ref_counts_[b] > 0) << "in-use block " << b << " with refcount 0";
        ++in_use;
        break;
      case State::kFree:
        TANDEM_CHECK(ref_counts_[b] == 0 && !published_[b]) << "free block " << b;
        ++free;
        break;
      case State::kCached:
        TANDEM_CHECK(ref_counts_[b] == 0 && published_[b]) << "cached block " << b;
        ++cached;
        break;
    }
    if (published_[b]) {
      ++published;
      const auto it = hash_to_block_.find(hashes_[b]);
      TANDEM_CHECK(it != hash_to_block_.end() && it->second == b) << "published block " << b;
    }
  }
  TANDEM_CHECK_EQ(in_use, num_in_use_);
  TANDEM_CHECK_EQ(free, static_cast<int32_t>(free_list_.size()));
  TANDEM_CHECK_EQ(cached, lru_size_);
  TANDEM_CHECK_EQ(in_use + free + cached, num_blocks_);
  TANDEM_CHECK_EQ(published, static_cast<int32_t>(hash_to_block_.size()));
  std::vector<bool> on_free_list(static_cast<size_t>(num_blocks_), false);
  for (const int32_t b : free_list_) {
    (void)Local(b + first_id_);
    TANDEM_CHECK(states_[b] == State::kFree) << "block " << b << " on the free list";
    TANDEM_CHECK(!on_free_list[b]) << "block " << b << " twice on the free list";
    on_free_list[b] = true;
  }
  // Walk the LRU both ways.
  int32_t count = 0, prev = kNone;
  for (int32_t b = lru_head_; b != kNone; b = lru_next_[b]) {
    (void)Local(b + first_id_);
    TANDEM_CHECK(states_[b] == State::kCached) << "block " << b << " in the LRU";
    TANDEM_CHECK_EQ(lru_prev_[b], prev);
    prev = b;
    TANDEM_CHECK_LE(++count, lru_size_) << "LRU cycle";
  }
  TANDEM_CHECK_EQ(prev, lru_tail_);
  TANDEM_CHECK_EQ(count, lru_size_);
}

}  // namespace tandem
