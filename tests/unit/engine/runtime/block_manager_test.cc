#include "engine/runtime/block_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/runtime/block_hash.h"

namespace tandem {
namespace {

using Kind = KvCacheEvent::Kind;

std::vector<int32_t> MustAllocate(BlockManager& bm, int32_t n) {
  auto blocks = bm.Allocate(n);
  EXPECT_TRUE(blocks.ok()) << blocks.status();
  return blocks.ok() ? *blocks : std::vector<int32_t>{};
}

TEST(BlockManagerTest, StartsAllFree) {
  BlockManager bm(8);
  EXPECT_EQ(bm.num_blocks(), 8);
  EXPECT_EQ(bm.num_free(), 8);
  EXPECT_EQ(bm.num_in_use(), 0);
  EXPECT_EQ(bm.num_cached(), 0);
  EXPECT_EQ(bm.usage(), 0.0);
  EXPECT_TRUE(bm.CanAllocate(8));
  EXPECT_FALSE(bm.CanAllocate(9));
  bm.CheckInvariants();
}

// A manager over a range of a larger pool (a data-parallel rank's): its ids are the
// pool's, everywhere they go in and out.
TEST(BlockManagerTest, IdsStartAtFirstId) {
  BlockManager bm(4, BlockManager::kDefaultMaxPendingEvents, /*first_id=*/8);
  EXPECT_TRUE(bm.Owns(8) && bm.Owns(11));
  EXPECT_FALSE(bm.Owns(7) || bm.Owns(12));
  const std::vector<int32_t> a = MustAllocate(bm, 3);
  EXPECT_EQ(a, (std::vector<int32_t>{8, 9, 10}));
  EXPECT_TRUE(bm.Publish(a[0], 77));
  EXPECT_TRUE(bm.is_published(8));
  EXPECT_EQ(bm.ref_count(9), 1);
  bm.Release(a);
  const uint64_t h = 77;
  EXPECT_EQ(bm.AcquireCachedPrefix(std::span<const uint64_t>(&h, 1)), (std::vector<int32_t>{8}));
  bm.CheckInvariants();
  EXPECT_DEATH(bm.Release(std::vector<int32_t>{3}), "outside \\[8, 12\\)");
}

TEST(BlockManagerTest, AllocateAndReleaseTrackRefcounts) {
  BlockManager bm(8);
  const auto a = MustAllocate(bm, 3);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(std::set<int32_t>(a.begin(), a.end()).size(), 3u);
  for (int32_t b : a) {
    EXPECT_GE(b, 0);
    EXPECT_LT(b, 8);
    EXPECT_EQ(bm.ref_count(b), 1);
    EXPECT_FALSE(bm.is_published(b));
  }
  EXPECT_EQ(bm.num_in_use(), 3);
  EXPECT_EQ(bm.num_free(), 5);
  EXPECT_DOUBLE_EQ(bm.usage(), 3.0 / 8);
  const auto b = MustAllocate(bm, 5);
  std::set<int32_t> all(a.begin(), a.end());
  all.insert(b.begin(), b.end());
  EXPECT_EQ(all.size(), 8u);
  EXPECT_EQ(bm.num_free(), 0);
  EXPECT_DOUBLE_EQ(bm.usage(), 1.0);
  bm.Release(a);
  EXPECT_EQ(bm.num_free(), 3);
  for (int32_t x : a) EXPECT_EQ(bm.ref_count(x), 0);
  bm.Release(b);
  EXPECT_EQ(bm.num_free(), 8);
  EXPECT_EQ(bm.num_in_use(), 0);
  EXPECT_TRUE(MustAllocate(bm, 0).empty());
  bm.CheckInvariants();
}

TEST(BlockManagerTest, ExhaustionAllocatesNothing) {
  BlockManager bm(4);
  const auto a = MustAllocate(bm, 3);
  ASSERT_TRUE(bm.Publish(a[0], 100));
  bm.Release(std::span(a).first(1));  // one cached-evictable block, one free, two in use
  EXPECT_EQ(bm.num_free(), 2);
  const auto before = bm.TakeEvents();
  auto r = bm.Allocate(3);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(bm.CanAllocate(3));
  // Nothing allocated, nothing evicted.
  EXPECT_EQ(bm.num_free(), 2);
  EXPECT_EQ(bm.num_in_use(), 2);
  EXPECT_EQ(bm.num_cached(), 1);
  EXPECT_EQ(bm.stats().evictions, 0);
  EXPECT_TRUE(bm.TakeEvents().events.empty());
  const uint64_t h[] = {100};
  EXPECT_EQ(bm.CachedPrefixLength(h), 1);
  bm.CheckInvariants();
  EXPECT_TRUE(bm.CanAllocate(2));
  EXPECT_EQ(MustAllocate(bm, 2).size(), 2u);
}

TEST(BlockManagerTest, PrefixSharingWithoutCopies) {
  BlockManager bm(16);
  const uint64_t fp = 1234;
  std::vector<int32_t> prompt(4 * 4 + 2);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i * 7);
  const auto hashes = HashFullBlocks(prompt, 4, fp);
  ASSERT_EQ(hashes.size(), 4u);

  // Sequence A: nothing cached; 5 blocks (4 full + the partial tail).
  EXPECT_TRUE(bm.AcquireCachedPrefix(hashes).empty());
  const auto a = MustAllocate(bm, 5);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(bm.Publish(a[i], hashes[i]));
  EXPECT_EQ(bm.num_cached(), 4);

  // Sequence B, same prompt: shares A's four full blocks, allocates only its own tail.
  const auto shared = bm.AcquireCachedPrefix(hashes);
  ASSERT_EQ(shared, std::vector<int32_t>(a.begin(), a.begin() + 4));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bm.ref_count(a[i]), 2);
  EXPECT_EQ(bm.ref_count(a[4]), 1);
  const auto b_tail = MustAllocate(bm, 1);
  EXPECT_EQ(bm.num_in_use(), 6);

  // Sequence C diverges in block 2: shares two blocks.
  auto other = prompt;
  other[9] += 1;
  const auto c_hashes = HashFullBlocks(other, 4, fp);
  EXPECT_EQ(bm.CachedPrefixLength(c_hashes), 2);
  const auto c_shared = bm.AcquireCachedPrefix(c_hashes);
  ASSERT_EQ(c_shared, std::vector<int32_t>(a.begin(), a.begin() + 2));
  EXPECT_EQ(bm.ref_count(a[0]), 3);

  // A ends: its blocks stay held by B and C.
  bm.Release(a);
  EXPECT_EQ(bm.ref_count(a[0]), 2);
  EXPECT_EQ(bm.ref_count(a[3]), 1);
  EXPECT_EQ(bm.ref_count(a[4]), 0);  // A's private tail is free again
  std::vector<int32_t> b_table = shared;
  b_table.push_back(b_tail[0]);
  bm.Release(b_table);
  bm.Release(c_shared);
  EXPECT_EQ(bm.num_in_use(), 0);
  EXPECT_EQ(bm.num_free(), 16);
  EXPECT_EQ(bm.num_cached(), 4);  // still findable
  EXPECT_EQ(bm.num_evictable(), 4);
  EXPECT_EQ(bm.AcquireCachedPrefix(hashes).size(), 4u);
  bm.CheckInvariants();
}

TEST(BlockManagerTest, EvictsLeastRecentlyReleasedFirst) {
  BlockManager bm(4);
  const auto blocks = MustAllocate(bm, 4);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(bm.Publish(blocks[i], 100 + i));
  (void)bm.TakeEvents();
  // Release order: 2, 0, 3, 1.
  for (int i : {2, 0, 3, 1}) bm.Release(std::span(blocks).subspan(i, 1));
  EXPECT_EQ(bm.num_free(), 4);
  EXPECT_EQ(bm.num_unused(), 0);
  EXPECT_EQ(bm.num_evictable(), 4);

  const auto first = MustAllocate(bm, 1);
  EXPECT_EQ(first[0], blocks[2]);
  EXPECT_FALSE(bm.is_published(blocks[2]));
  const uint64_t h2[] = {102};
  EXPECT_EQ(bm.CachedPrefixLength(h2), 0);
  EXPECT_TRUE(bm.AcquireCachedPrefix(h2).empty());
  const auto next = MustAllocate(bm, 2);
  EXPECT_EQ(next, (std::vector<int32_t>{blocks[0], blocks[3]}));
  EXPECT_EQ(bm.stats().evictions, 3);
  const auto ev = bm.TakeEvents();
  EXPECT_EQ(ev.events, (std::vector<KvCacheEvent>{
                           {Kind::kRemoved, 102}, {Kind::kRemoved, 100}, {Kind::kRemoved, 103}}));
  EXPECT_EQ(bm.num_cached(), 1);
  const uint64_t h1[] = {101};
  EXPECT_EQ(bm.AcquireCachedPrefix(h1), (std::vector<int32_t>{blocks[1]}));
  bm.CheckInvariants();
}

TEST(BlockManagerTest, FreeBlocksAreUsedBeforeEvicting) {
  BlockManager bm(4);
  const auto a = MustAllocate(bm, 2);
  ASSERT_TRUE(bm.Publish(a[0], 1));
  bm.Release(a);  // a[0] cached, a[1] free; two never used
  const auto b = MustAllocate(bm, 3);
  EXPECT_EQ(std::count(b.begin(), b.end(), a[0]), 0);
  EXPECT_EQ(bm.stats().evictions, 0);
  EXPECT_EQ(bm.num_cached(), 1);
  EXPECT_EQ(MustAllocate(bm, 1), (std::vector<int32_t>{a[0]}));
  EXPECT_EQ(bm.stats().evictions, 1);
}

TEST(BlockManagerTest, ReleaseOfATableEvictsItsTailFirst) {
  BlockManager bm(3);
  const auto seq = MustAllocate(bm, 3);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(bm.Publish(seq[i], 10 + i));
  bm.Release(seq);  // released last to first: seq[0] is the most recent
  EXPECT_EQ(MustAllocate(bm, 1), (std::vector<int32_t>{seq[2]}));
  EXPECT_EQ(MustAllocate(bm, 1), (std::vector<int32_t>{seq[1]}));
  const uint64_t chain[] = {10, 11, 12};
  EXPECT_EQ(bm.CachedPrefixLength(chain), 1);  // the prefix block survived longest
}

TEST(BlockManagerTest, HeldCachedBlocksAreNeverEvicted) {
  BlockManager bm(4);
  const auto a = MustAllocate(bm, 2);
  ASSERT_TRUE(bm.Publish(a[0], 7));
  ASSERT_TRUE(bm.Publish(a[1], 8));
  bm.Release(std::span(a).subspan(1, 1));  // 8 cached and evictable; 7 held
  EXPECT_EQ(bm.num_free(), 3);
  const auto b = MustAllocate(bm, 3);
  EXPECT_EQ(std::count(b.begin(), b.end(), a[0]), 0);
  EXPECT_EQ(bm.num_free(), 0);
  auto r = bm.Allocate(1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(bm.is_published(a[0]));
  const uint64_t h[] = {7};
  EXPECT_EQ(bm.AcquireCachedPrefix(h), (std::vector<int32_t>{a[0]}));
  EXPECT_EQ(bm.ref_count(a[0]), 2);
  bm.CheckInvariants();
}

TEST(BlockManagerTest, DuplicatePublishKeepsTheExistingMapping) {
  BlockManager bm(4);
  const auto a = MustAllocate(bm, 1);
  const auto b = MustAllocate(bm, 1);
  EXPECT_TRUE(bm.Publish(a[0], 55));
  EXPECT_TRUE(bm.Publish(a[0], 55));   // idempotent
  EXPECT_FALSE(bm.Publish(b[0], 55));  // b stays private
  EXPECT_FALSE(bm.is_published(b[0]));
  EXPECT_EQ(bm.num_cached(), 1);
  EXPECT_EQ(bm.stats().rejected_publishes, 1);
  const uint64_t h[] = {55};
  const auto got = bm.AcquireCachedPrefix(h);
  EXPECT_EQ(got, a);
  bm.Release(b);  // private: straight back to the free list
  EXPECT_EQ(bm.num_unused(), 3);
  EXPECT_EQ(bm.TakeEvents().events, (std::vector<KvCacheEvent>{{Kind::kStored, 55}}));
  bm.Release(a);
  bm.Release(got);
  EXPECT_EQ(bm.num_evictable(), 1);
  bm.CheckInvariants();
}

TEST(BlockManagerTest, StatsCounters) {
  BlockManager bm(8);
  const auto a = MustAllocate(bm, 3);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(bm.Publish(a[i], 1000 + i));
  const uint64_t q1[] = {1000, 1001, 9, 1002};
  const uint64_t q2[] = {5, 1000};
  const uint64_t q3[] = {1000, 1001, 1002};
  EXPECT_EQ(bm.AcquireCachedPrefix(q1).size(), 2u);
  EXPECT_EQ(bm.AcquireCachedPrefix(q2).size(), 0u);
  EXPECT_EQ(bm.AcquireCachedPrefix(q3).size(), 3u);
  EXPECT_EQ(bm.AcquireCachedPrefix({}).size(), 0u);
  EXPECT_EQ(bm.CachedPrefixLength(q3), 3);  // not counted
  EXPECT_EQ(bm.stats().prefix_queries, 4);
  EXPECT_EQ(bm.stats().queried_blocks, 9);
  EXPECT_EQ(bm.stats().hit_blocks, 5);
  EXPECT_EQ(bm.stats().evictions, 0);
}

TEST(BlockManagerTest, EventsAreOrderedAndBounded) {
  BlockManager bm(4, /*max_pending_events=*/3);
  const auto a = MustAllocate(bm, 4);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(bm.Publish(a[i], 200 + i));
  auto ev = bm.TakeEvents();
  EXPECT_EQ(ev.events, (std::vector<KvCacheEvent>{
                           {Kind::kStored, 200}, {Kind::kStored, 201}, {Kind::kStored, 202}}));
  EXPECT_EQ(ev.dropped, 1);
  EXPECT_EQ(bm.stats().dropped_events, 1);
  auto snapshot = bm.CachedHashes();
  std::sort(snapshot.begin(), snapshot.end());
  EXPECT_EQ(snapshot, (std::vector<uint64_t>{200, 201, 202, 203}));

  ev = bm.TakeEvents();
  EXPECT_TRUE(ev.events.empty());
  EXPECT_EQ(ev.dropped, 0);

  // Evicted, then stored again under the same hash: order is kept.
  bm.Release(std::span(a).first(1));
  const auto b = MustAllocate(bm, 1);
  ASSERT_EQ(b[0], a[0]);
  ASSERT_TRUE(bm.Publish(b[0], 200));
  ev = bm.TakeEvents();
  EXPECT_EQ(ev.events, (std::vector<KvCacheEvent>{{Kind::kRemoved, 200}, {Kind::kStored, 200}}));

  BlockManager quiet(2, /*max_pending_events=*/0);
  const auto q = MustAllocate(quiet, 1);
  quiet.Publish(q[0], 1);
  ev = quiet.TakeEvents();
  EXPECT_TRUE(ev.events.empty());
  EXPECT_EQ(ev.dropped, 1);
}

TEST(BlockManagerTest, EmptyManager) {
  BlockManager bm(0);
  EXPECT_EQ(bm.usage(), 0.0);
  EXPECT_TRUE(bm.CanAllocate(0));
  EXPECT_EQ(bm.Allocate(1).status().code(), absl::StatusCode::kResourceExhausted);
  bm.CheckInvariants();
}

// A simple model of the specified behaviour, checked against the real one step by step.
class ReferenceModel {
 public:
  explicit ReferenceModel(int32_t n) : ref_(static_cast<size_t>(n), 0), hash_of_(static_cast<size_t>(n)) {
    for (int32_t b = 0; b < n; ++b) free_.insert(b);
  }

  int32_t available() const { return static_cast<int32_t>(free_.size() + lru_.size()); }

  // Checks that `got` is a valid answer to Allocate(n) and applies it.
  void Allocate(const std::vector<int32_t>& got) {
    const size_t from_free = std::min(got.size(), free_.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const int32_t b = got[i];
      if (i < from_free) {
        ASSERT_TRUE(free_.count(b)) << "block " << b << " was not free";
        free_.erase(b);
      } else {
        ASSERT_FALSE(lru_.empty());
        ASSERT_EQ(b, lru_.front()) << "not the least recently released cached block";
        lru_.pop_front();
        events_.push_back({Kind::kRemoved, *hash_of_[b]});
        by_hash_.erase(*hash_of_[b]);
        hash_of_[b].reset();
      }
      ref_[b] = 1;
    }
  }

  void Release(const std::vector<int32_t>& blocks) {
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
      const int32_t b = *it;
      ASSERT_GT(ref_[b], 0);
      if (--ref_[b] > 0) continue;
      if (hash_of_[b]) {
        lru_.push_back(b);
      } else {
        free_.insert(b);
      }
    }
  }

  bool Publish(int32_t b, uint64_t h) {
    if (hash_of_[b]) return *hash_of_[b] == h;  // the test never republishes differently
    if (by_hash_.count(h)) return false;
    by_hash_[h] = b;
    hash_of_[b] = h;
    events_.push_back({Kind::kStored, h});
    return true;
  }

  std::vector<int32_t> Acquire(const std::vector<uint64_t>& hashes) {
    std::vector<int32_t> out;
    for (uint64_t h : hashes) {
      auto it = by_hash_.find(h);
      if (it == by_hash_.end()) break;
      const int32_t b = it->second;
      if (ref_[b] == 0) lru_.remove(b);
      ++ref_[b];
      out.push_back(b);
    }
    return out;
  }

  void ExpectMatches(const BlockManager& bm, bool per_block) const {
    int32_t in_use = 0;
    for (int32_t r : ref_) in_use += r > 0;
    ASSERT_EQ(bm.num_in_use(), in_use);
    ASSERT_EQ(bm.num_free(), available());
    ASSERT_EQ(bm.num_unused(), static_cast<int32_t>(free_.size()));
    ASSERT_EQ(bm.num_evictable(), static_cast<int32_t>(lru_.size()));
    ASSERT_EQ(bm.num_cached(), static_cast<int32_t>(by_hash_.size()));
    ASSERT_EQ(in_use + available(), bm.num_blocks());
    if (!per_block) return;
    for (int32_t b = 0; b < bm.num_blocks(); ++b) {
      ASSERT_EQ(bm.ref_count(b), ref_[b]) << "block " << b;
      ASSERT_EQ(bm.is_published(b), hash_of_[b].has_value()) << "block " << b;
    }
  }

  std::vector<KvCacheEvent> TakeEvents() { return std::exchange(events_, {}); }
  std::optional<uint64_t> hash_of(int32_t b) const { return hash_of_[b]; }

 private:
  std::vector<int32_t> ref_;
  std::vector<std::optional<uint64_t>> hash_of_;
  std::map<uint64_t, int32_t> by_hash_;
  std::set<int32_t> free_;
  std::list<int32_t> lru_;  // front: least recently released
  std::vector<KvCacheEvent> events_;
};

TEST(BlockManagerTest, RandomizedAgainstReferenceModel) {
  constexpr int32_t kBlocks = 48;
  constexpr int kSteps = 100000;
  constexpr uint64_t kHashPool = 40;  // small, so that hashes collide and chains recur
  BlockManager bm(kBlocks, /*max_pending_events=*/1 << 20);
  ReferenceModel ref(kBlocks);
  std::mt19937_64 rng(20240611);
  auto uniform = [&](int64_t lo, int64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::vector<std::vector<int32_t>> holdings;  // what "sequences" hold, one entry per reference
  int64_t exhausted = 0, acquired = 0, evictions_seen = 0;

  for (int step = 0; step < kSteps; ++step) {
    const int op = static_cast<int>(uniform(0, 99));
    if (op < 30) {  // allocate
      const int32_t n = static_cast<int32_t>(uniform(0, 6));
      const bool can = ref.available() >= n;
      ASSERT_EQ(bm.CanAllocate(n), can);
      auto r = bm.Allocate(n);
      if (!can) {
        ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
        ++exhausted;
      } else {
        ASSERT_TRUE(r.ok());
        ASSERT_EQ(static_cast<int32_t>(r->size()), n);
        ref.Allocate(*r);
        if (HasFatalFailure()) return;
        if (n > 0) holdings.push_back(*r);
      }
    } else if (op < 55) {  // publish a held block
      if (holdings.empty()) continue;
      const auto& h = holdings[uniform(0, static_cast<int64_t>(holdings.size()) - 1)];
      const int32_t b = h[uniform(0, static_cast<int64_t>(h.size()) - 1)];
      // Republishing a published block uses its own hash (a different one would abort).
      uint64_t hash = static_cast<uint64_t>(uniform(0, kHashPool - 1)) * 0x9e3779b97f4a7c15ull;
      if (const auto own = ref.hash_of(b)) hash = *own;
      ASSERT_EQ(bm.Publish(b, hash), ref.Publish(b, hash)) << "step " << step;
    } else if (op < 75) {  // acquire a cached prefix
      std::vector<uint64_t> hashes(static_cast<size_t>(uniform(0, 5)));
      for (auto& x : hashes) x = static_cast<uint64_t>(uniform(0, kHashPool - 1)) * 0x9e3779b97f4a7c15ull;
      const auto got = bm.AcquireCachedPrefix(hashes);
      ASSERT_EQ(got, ref.Acquire(hashes)) << "step " << step;
      acquired += static_cast<int64_t>(got.size());
      if (!got.empty()) holdings.push_back(got);
    } else {  // release a whole holding
      if (holdings.empty()) continue;
      const size_t i = static_cast<size_t>(uniform(0, static_cast<int64_t>(holdings.size()) - 1));
      bm.Release(holdings[i]);
      ref.Release(holdings[i]);
      holdings[i] = std::move(holdings.back());
      holdings.pop_back();
    }
    bm.CheckInvariants();
    ref.ExpectMatches(bm, step % 97 == 0);
    if (HasFatalFailure()) return;
    if (step % 1009 == 0) {
      const auto events = bm.TakeEvents();
      ASSERT_EQ(events.dropped, 0);
      ASSERT_EQ(events.events, ref.TakeEvents()) << "step " << step;
      for (const auto& e : events.events) evictions_seen += e.kind == Kind::kRemoved;
    }
  }
  // The run exercised every path.
  EXPECT_GT(exhausted, 0);
  EXPECT_GT(acquired, 0);
  EXPECT_GT(evictions_seen, 0);
  EXPECT_GT(bm.stats().rejected_publishes, 0);

  for (const auto& h : holdings) bm.Release(h);
  bm.CheckInvariants();
  EXPECT_EQ(bm.num_in_use(), 0);
  EXPECT_EQ(bm.num_free(), kBlocks);
}

TEST(BlockManagerDeathTest, ReleasingAFreeBlockAborts) {
  BlockManager bm(4);
  const int32_t never_allocated[] = {2};
  EXPECT_DEATH(bm.Release(never_allocated), "not held");
  const auto a = MustAllocate(bm, 1);
  bm.Release(a);
  EXPECT_DEATH(bm.Release(a), "not held");  // double free
}

TEST(BlockManagerDeathTest, ReleasingAnEvictableCachedBlockAborts) {
  BlockManager bm(4);
  const auto a = MustAllocate(bm, 1);
  ASSERT_TRUE(bm.Publish(a[0], 3));
  bm.Release(a);
  EXPECT_DEATH(bm.Release(a), "not held");
}

TEST(BlockManagerDeathTest, BrokenCallsAbort) {
  BlockManager bm(4);
  const int32_t out_of_range[] = {4};
  EXPECT_DEATH(bm.Release(out_of_range), "block id 4");
  EXPECT_DEATH(bm.Publish(0, 1), "not held");
  const auto a = MustAllocate(bm, 1);
  ASSERT_TRUE(bm.Publish(a[0], 1));
  EXPECT_DEATH(bm.Publish(a[0], 2), "already published");
  EXPECT_DEATH((void)bm.Allocate(-1), "check failed");
}

}  // namespace
}  // namespace tandem
