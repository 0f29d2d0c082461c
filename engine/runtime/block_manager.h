// Accounting of one paged KV cache's blocks (docs/design.md §4): reference counts, copy-free
// sharing of prefix blocks through a hash-indexed prefix cache, and an LRU of cached
// blocks nobody holds, evicted when fresh blocks run out.
//
// Threads: a BlockManager is owned and used by one engine thread; it has no locks and
// must not be shared.
//
// Every block id first_id..first_id+num_blocks-1 is, at any time, exactly one of:
//   - in use:   refcount > 0 (held by one or more sequences); published or private;
//   - cached:   refcount 0 and published: findable by hash, evictable (in the LRU);
//   - free:     refcount 0 and unpublished (on the free list).
//
// Typical use for a new sequence with full-block hashes `h` (block_hash.h):
//   auto shared = bm.AcquireCachedPrefix(h);          // reuse what is cached
//   auto fresh = bm.Allocate(needed - shared.size());  // after acquiring: see Allocate
//   if (!fresh.ok()) bm.Release(shared);               // undo, retry later or preempt
//   ... compute KV of the fresh blocks; for each block that became full:
//   bm.Publish(block, hash);
//   ... when the sequence ends or is preempted:
//   bm.Release(block_table);                           // the whole table, in order
//
// Cost: O(1) per block for every operation (hash map reserved up front, intrusive LRU
// list, free stack); nothing is allocated per call beyond the returned vectors.
// Broken invariants (releasing a block not held, publishing a free block, bad ids)
// abort through TANDEM_CHECK.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace tandem {

// A change to the set of cached hashes, for cache-aware routing elsewhere.
struct KvCacheEvent {
  enum class Kind : uint8_t { kStored, kRemoved };
  Kind kind;
  uint64_t hash;
  bool operator==(const KvCacheEvent&) const = default;
};

// Events since the previous TakeEvents(), in the order they happened. `dropped` counts
// events lost because more than max_pending_events piled up; when it is non-zero the
// consumer's view is stale and it should resync from CachedHashes().
struct KvCacheEvents {
  std::vector<KvCacheEvent> events;
  int64_t dropped = 0;
};

// Cumulative counters.
struct BlockManagerStats {
  int64_t prefix_queries = 0;      // AcquireCachedPrefix calls
  int64_t queried_blocks = 0;      // hashes passed to them (hit rate = hit / queried)
  int64_t hit_blocks = 0;          // blocks they returned
  int64_t evictions = 0;           // cached blocks evicted by Allocate
  int64_t rejected_publishes = 0;  // Publish calls whose hash another block already had
  int64_t dropped_events = 0;      // events lost to the max_pending_events bound
};

class BlockManager {
 public:
  static constexpr int32_t kDefaultMaxPendingEvents = 65536;

  // Manages block ids first_id..first_id+num_blocks-1, all free. At most
  // max_pending_events events are kept between TakeEvents() calls (0 disables them). All
  // must be >= 0 (checked). A first_id above 0: one of several managers over disjoint
  // ranges of one pool (the ranks of a data-parallel replica, scheduler.h), whose ids are
  // then ids in that pool wherever they go.
  explicit BlockManager(int32_t num_blocks, int32_t max_pending_events = kDefaultMaxPendingEvents,
                        int32_t first_id = 0);

  BlockManager(const BlockManager&) = delete;
  BlockManager& operator=(const BlockManager&) = delete;

  // n fresh (unpublished) blocks with refcount 1: from the free list first, then by
  // evicting least-recently-released cached blocks (their hashes are unpublished and
  // reported as kRemoved). Returns RESOURCE_EXHAUSTED, allocating and evicting nothing,
  // when fewer than n blocks are free or cached-unheld. n >= 0 (checked).
  // Acquire a sequence's cached prefix *before* allocating its other blocks: Allocate may
  // evict exactly the cached blocks the prefix would have reused.
  absl::StatusOr<std::vector<int32_t>> Allocate(int32_t n);
  bool CanAllocate(int32_t n) const { return n <= num_free(); }

  // Decrements the refcount of each block. At zero, a published block joins the LRU tail
  // (still findable by hash, evictable) and a private one goes back to the free list.
  // The blocks are released from LAST TO FIRST: pass a sequence's block table in order, so
  // that its first blocks (the prefix, shared most) become the most recently released and
  // are evicted last. Releasing a block that is not held aborts.
  void Release(std::span<const int32_t> blocks);

  // Makes `block` (held by the caller, refcount > 0, its KV fully computed) findable by
  // `hash`. Returns true when the block is now cached under `hash` (also when it already
  // was). Returns false, changing nothing, when another block already holds `hash`: the
  // caller keeps its block as a private one (it may release it and share the cached one
  // instead). A block is published under one hash for its life: publishing it again
  // under another hash aborts.
  bool Publish(int32_t block, uint64_t hash);

  // Walks `hashes` in order while each is cached, takes a reference on each block found
  // (a cached unheld block leaves the LRU) and returns their ids: the longest cached
  // prefix, possibly empty. The caller owns one reference on each returned block.
  // At most `at_most` blocks are taken (a caller that can use only a shorter prefix, e.g.
  // the one whose state snapshot it has); the query still counts every hash.
  std::vector<int32_t> AcquireCachedPrefix(std::span<const uint64_t> hashes, size_t at_most = SIZE_MAX);

  // How many leading `hashes` AcquireCachedPrefix would return now; changes nothing
  // (no counters either).
  int32_t CachedPrefixLength(std::span<const uint64_t> hashes) const;

  // Queries.
  int32_t num_blocks() const { return num_blocks_; }
  int32_t first_id() const { return first_id_; }
  bool Owns(int32_t id) const { return id >= first_id_ && id - first_id_ < num_blocks_; }
  int32_t num_free() const { return static_cast<int32_t>(free_list_.size()) + lru_size_; }
  int32_t num_unused() const { return static_cast<int32_t>(free_list_.size()); }  // free, not cached
  int32_t num_evictable() const { return lru_size_; }  // cached and unheld
  int32_t num_in_use() const { return num_in_use_; }
  int32_t num_cached() const { return static_cast<int32_t>(hash_to_block_.size()); }  // held or not
  double usage() const {  // in use / total; 0 for an empty cache
    return num_blocks_ == 0 ? 0.0 : static_cast<double>(num_in_use_) / num_blocks_;
  }
  const BlockManagerStats& stats() const { return stats_; }

  int32_t ref_count(int32_t block) const;
  bool is_published(int32_t block) const;

  // Events since the previous call (see KvCacheEvents), and a full snapshot of the cached
  // hashes (unordered) for a consumer that starts late or lost events.
  KvCacheEvents TakeEvents();
  std::vector<uint64_t> CachedHashes() const;

  // Verifies every internal invariant in O(num_blocks); aborts on a violation. For tests.
  void CheckInvariants() const;

 private:
  enum class State : uint8_t { kFree, kInUse, kCached };
  static constexpr int32_t kNone = -1;

  // The index of block `id` in the vectors below (checked to be one of ours).
  int32_t Local(int32_t id) const;
  void LruPushBack(int32_t block);
  void LruRemove(int32_t block);
  int32_t EvictOldest();
  void RecordEvent(KvCacheEvent::Kind kind, uint64_t hash);

  int32_t num_blocks_;
  int32_t max_pending_events_;
  int32_t first_id_;
  std::vector<int32_t> ref_counts_;
  std::vector<State> states_;
  std::vector<uint64_t> hashes_;     // valid where published_
  std::vector<uint8_t> published_;
  std::vector<int32_t> free_list_;   // a stack: the most recently freed block is reused first
  std::vector<int32_t> lru_prev_, lru_next_;
  int32_t lru_head_ = kNone;         // least recently released cached block: evicted first
  int32_t lru_tail_ = kNone;
  int32_t lru_size_ = 0;
  int32_t num_in_use_ = 0;
  absl::flat_hash_map<uint64_t, int32_t> hash_to_block_;
  std::vector<KvCacheEvent> pending_events_;
  int64_t dropped_since_take_ = 0;
  BlockManagerStats stats_;
};

}  // namespace tandem
