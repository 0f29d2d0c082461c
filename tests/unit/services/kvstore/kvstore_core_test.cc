// The kvstore's storage core without RPC: consistent hashing (only the joining or leaving
// instance's share moves), the SSD tier (verified on load and on read, corrupt files
// dropped, capacity), the DRAM tier (two-phase puts, deduplication, checksums, leases,
// LRU eviction) and both tiers together under capacity pressure and across a restart.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "services/kvstore/block_store.h"
#include "services/kvstore/byte_size.h"
#include "services/kvstore/disk_tier.h"
#include "services/kvstore/hash_ring.h"
#include "xxhash.h"

namespace tandem::kvstore {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kFp = 0xf1f2f3f4f5f6f7f8ull;
constexpr int64_t kBlock = 4096;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tandem-kvstore-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::vector<char> BlockBytes(uint64_t hash) {
  std::vector<char> b(kBlock);
  std::mt19937_64 rng(hash);
  for (size_t i = 0; i < b.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&b[i], &v, 8);
  }
  return b;
}

uint64_t Xxh(const void* p, size_t n) { return XXH3_64bits(p, n); }
std::vector<uint64_t> U(std::initializer_list<uint64_t> l) { return l; }

// Writes `hashes` into the store the way a writer does: reserve, fill the slots, commit.
int PutBlocks(BlockStore& store, char* memory, const std::vector<uint64_t>& hashes) {
  BlockStore::Reservation r = store.Reserve(kFp, hashes);
  std::vector<uint64_t> written, sums;
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (r.offsets[i] < 0) continue;
    const std::vector<char> b = BlockBytes(hashes[i]);
    std::memcpy(memory + r.offsets[i], b.data(), b.size());
    written.push_back(hashes[i]);
    sums.push_back(Xxh(b.data(), b.size()));
  }
  if (r.id.empty()) return 0;
  absl::StatusOr<BlockStore::CommitResult> c = store.Commit(r.id, written, sums);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? c->committed : 0;
}

// Reads `hashes` and checks every delivered block's bytes and checksum.
int ReadAndCheck(BlockStore& store, const std::vector<uint64_t>& hashes) {
  std::unique_ptr<BlockStore::ReadHandle> h = store.Read(kFp, hashes);
  for (size_t i = 0; i < h->blocks().size(); ++i) {
    const std::vector<char> want = BlockBytes(hashes[i]);
    EXPECT_EQ(std::memcmp(h->blocks()[i].data, want.data(), want.size()), 0) << i;
    EXPECT_EQ(h->blocks()[i].checksum, Xxh(want.data(), want.size())) << i;
  }
  return static_cast<int>(h->blocks().size());
}

std::vector<uint64_t> Hashes(int n, uint64_t salt) {
  std::vector<uint64_t> h;
  for (int i = 0; i < n; ++i) h.push_back(XXH3_64bits_withSeed(&i, sizeof i, salt));
  return h;
}

// ---- Consistent hashing ----

TEST(HashRingTest, KeysSpreadAndOnlyTheChangingInstancesShareMoves) {
  HashRing ring;
  EXPECT_EQ(ring.Owner(1), -1);
  for (const char* n : {"kvstore-0", "kvstore-1", "kvstore-2"}) ring.Add(n);
  const std::vector<uint64_t> keys = Hashes(30000, 1);
  std::map<std::string, int> count;
  std::vector<std::string> before;
  for (uint64_t k : keys) {
    before.push_back(ring.OwnerName(k));
    count[before.back()]++;
  }
  // Within 1.5x of an even spread (10,000 each), in both directions.
  ASSERT_EQ(count.size(), 3u);
  int lo = 30000, hi = 0;
  for (auto& [n, c] : count) {
    EXPECT_NEAR(c, 10000, 2000) << n;
    lo = std::min(lo, c);
    hi = std::max(hi, c);
  }
  EXPECT_LE(hi, 1.5 * 10000);
  EXPECT_GE(lo, 10000 / 1.5);
  EXPECT_LE(hi, 1.5 * lo);

  HashRing grown = ring;
  grown.Add("kvstore-3");
  int moved = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string& now = grown.OwnerName(keys[i]);
    if (now != before[i]) {
      ++moved;
      EXPECT_EQ(now, "kvstore-3") << "a key moved between instances that stayed";
    }
  }
  EXPECT_NEAR(moved, 7500, 1500);  // about a quarter

  // Removing one of the 3 moves exactly its keys (a third), spread over the other two,
  // which stay within 1.5x of even (15,000 each).
  HashRing shrunk = ring;
  shrunk.Remove("kvstore-1");
  int lost = 0;
  std::map<std::string, int> after;
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string& now = shrunk.OwnerName(keys[i]);
    after[now]++;
    if (before[i] != "kvstore-1") {
      EXPECT_EQ(now, before[i]);
    } else {
      EXPECT_NE(now, "kvstore-1");
      ++lost;
    }
  }
  EXPECT_EQ(lost, count["kvstore-1"]);
  ASSERT_EQ(after.size(), 2u);
  for (auto& [n, c] : after) {
    EXPECT_LE(c, 1.5 * 15000) << n;
    EXPECT_GE(c, 15000 / 1.5) << n;
  }
  // The same names give the same owners whatever the order they were added in.
  HashRing other;
  for (const char* n : {"kvstore-2", "kvstore-0", "kvstore-1"}) other.Add(n);
  for (size_t i = 0; i < 1000; ++i) EXPECT_EQ(other.OwnerName(keys[i]), before[i]);
}

TEST(ByteSizeTest, UnitsAndErrors) {
  EXPECT_EQ(*ParseByteSize("1048576", "x"), 1048576);
  EXPECT_EQ(*ParseByteSize("512M", "x"), 512ll << 20);
  EXPECT_EQ(*ParseByteSize("4G", "x"), 4ll << 30);
  EXPECT_EQ(*ParseByteSize("1.5GiB", "x"), 3ll << 29);
  EXPECT_EQ(*ParseByteSize("64kb", "x"), 64 << 10);
  EXPECT_EQ(*ParseByteSize("2T", "x"), 2ll << 40);
  for (const char* bad : {"", "G", "-1", "12Q", "1e30", "nan"}) {
    EXPECT_EQ(ParseByteSize(bad, "--capacity").status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// ---- SSD tier ----

TEST(DiskTierTest, WritesReadsVerifiesAndSurvivesReopening) {
  TempDir dir;
  const std::vector<uint64_t> hashes = Hashes(10, 2);
  {
    auto disk = DiskTier::Open(dir.path(), 1 << 20);
    ASSERT_TRUE(disk.ok()) << disk.status();
    for (uint64_t h : hashes) {
      const std::vector<char> b = BlockBytes(h);
      ASSERT_TRUE((*disk)->Write({kFp, h}, b.data(), b.size(), Xxh(b.data(), b.size())).ok());
    }
    EXPECT_TRUE((*disk)->Contains({kFp, hashes[3]}));
    EXPECT_FALSE((*disk)->Contains({kFp + 1, hashes[3]})) << "the fingerprint is part of the key";
    uint64_t sum = 0;
    absl::StatusOr<std::vector<char>> got = (*disk)->Read({kFp, hashes[3]}, &sum);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, BlockBytes(hashes[3]));
    EXPECT_EQ(sum, Xxh(got->data(), got->size()));
    EXPECT_EQ((*disk)->Read({kFp, 12345}, nullptr).status().code(), absl::StatusCode::kNotFound);
    EXPECT_EQ((*disk)->stats().blocks, 10);
    EXPECT_EQ((*disk)->stats().bytes_used, 10 * (kBlock + 64));
  }
  // Debris of an interrupted write is removed; intact files load.
  std::ofstream(dir.path() + "/tmp/123.456") << "partial";
  auto disk = DiskTier::Open(dir.path(), 1 << 20);
  ASSERT_TRUE(disk.ok());
  EXPECT_EQ((*disk)->stats().loaded, 10);
  EXPECT_EQ((*disk)->stats().corrupt_dropped, 0);
  EXPECT_FALSE(fs::exists(dir.path() + "/tmp/123.456"));
  for (uint64_t h : hashes) EXPECT_EQ(*(*disk)->Read({kFp, h}, nullptr), BlockBytes(h));
}

TEST(DiskTierTest, CorruptFilesAreDroppedNeverServed) {
  TempDir dir;
  const std::vector<uint64_t> hashes = Hashes(4, 3);
  std::string paths[4];
  {
    auto disk = DiskTier::Open(dir.path(), 1 << 20);
    ASSERT_TRUE(disk.ok());
    for (int i = 0; i < 4; ++i) {
      const std::vector<char> b = BlockBytes(hashes[i]);
      ASSERT_TRUE((*disk)->Write({kFp, hashes[i]}, b.data(), b.size(), Xxh(b.data(), b.size())).ok());
      paths[i] = (*disk)->PathOf({kFp, hashes[i]});
    }
    // Damage block 0's payload while the tier runs: the read notices and drops it.
    {
      std::fstream f(paths[0], std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(64 + 100);
      f.put('\x5a');
    }
    EXPECT_EQ((*disk)->Read({kFp, hashes[0]}, nullptr).status().code(), absl::StatusCode::kDataLoss);
    EXPECT_FALSE((*disk)->Contains({kFp, hashes[0]}));
    EXPECT_FALSE(fs::exists(paths[0]));
    EXPECT_EQ((*disk)->stats().corrupt_dropped, 1);
  }
  // Offline damage: a flipped header byte, a truncated file, a file renamed to another key.
  {
    std::fstream f(paths[1], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x01');
  }
  fs::resize_file(paths[2], 64 + kBlock / 2);
  const std::string renamed = paths[3].substr(0, paths[3].size() - 20) + "00000000000000aa.kvb";
  fs::copy_file(paths[3], renamed);
  auto disk = DiskTier::Open(dir.path(), 1 << 20);
  ASSERT_TRUE(disk.ok());
  EXPECT_EQ((*disk)->stats().loaded, 1);
  EXPECT_EQ((*disk)->stats().corrupt_dropped, 3);
  EXPECT_TRUE((*disk)->Contains({kFp, hashes[3]}));
  EXPECT_FALSE((*disk)->Contains({kFp, hashes[1]}));
  EXPECT_FALSE((*disk)->Contains({kFp, hashes[2]}));
  EXPECT_FALSE(fs::exists(renamed));
}

TEST(DiskTierTest, CapacityEvictsTheLeastRecentlyUsed) {
  TempDir dir;
  const int64_t file = kBlock + 64;
  auto disk = DiskTier::Open(dir.path(), 5 * file);
  ASSERT_TRUE(disk.ok());
  const std::vector<uint64_t> hashes = Hashes(8, 4);
  for (int i = 0; i < 5; ++i) {
    const std::vector<char> b = BlockBytes(hashes[i]);
    ASSERT_TRUE((*disk)->Write({kFp, hashes[i]}, b.data(), b.size(), Xxh(b.data(), b.size())).ok());
  }
  ASSERT_TRUE((*disk)->Read({kFp, hashes[0]}, nullptr).ok());  // 0 is now the most recent
  for (int i = 5; i < 7; ++i) {
    const std::vector<char> b = BlockBytes(hashes[i]);
    ASSERT_TRUE((*disk)->Write({kFp, hashes[i]}, b.data(), b.size(), Xxh(b.data(), b.size())).ok());
  }
  EXPECT_TRUE((*disk)->Contains({kFp, hashes[0]}));
  EXPECT_FALSE((*disk)->Contains({kFp, hashes[1]}));
  EXPECT_FALSE((*disk)->Contains({kFp, hashes[2]}));
  EXPECT_EQ((*disk)->stats().evictions, 2);
  EXPECT_LE((*disk)->stats().bytes_used, 5 * file);
  std::vector<char> huge(6 * file);
  EXPECT_EQ((*disk)->Write({kFp, 1}, huge.data(), huge.size(), 0).code(), absl::StatusCode::kResourceExhausted);
}

// ---- DRAM tier ----

TEST(BlockStoreTest, PutLookupReadAndDeduplication) {
  std::vector<char> memory(16 * kBlock);
  BlockStore store(memory.data(), memory.size(), {.block_bytes = kBlock}, nullptr);
  EXPECT_EQ(store.num_slots(), 16);
  const std::vector<uint64_t> hashes = Hashes(6, 5);
  EXPECT_EQ(store.Lookup(kFp, hashes), 0);
  EXPECT_EQ(PutBlocks(store, memory.data(), {hashes[0], hashes[1], hashes[2]}), 3);
  EXPECT_EQ(store.Lookup(kFp, hashes), 3);
  EXPECT_EQ(store.Lookup(kFp + 1, hashes), 0) << "another layout never matches";
  EXPECT_EQ(ReadAndCheck(store, hashes), 3);

  // Already stored: not reserved again. Two writers of the same new block: one slot.
  BlockStore::Reservation a = store.Reserve(kFp, U({hashes[2], hashes[3], hashes[4]}));
  EXPECT_EQ(a.offsets[0], -1);
  EXPECT_GE(a.offsets[1], 0);
  BlockStore::Reservation b = store.Reserve(kFp, U({hashes[3], hashes[4], hashes[5], hashes[5]}));
  EXPECT_EQ(b.offsets[0], -1);
  EXPECT_EQ(b.offsets[1], -1);
  EXPECT_GE(b.offsets[2], 0);
  EXPECT_EQ(b.offsets[3], -1) << "listed twice in one request";
  EXPECT_EQ(store.Lookup(kFp, hashes), 3) << "reserved blocks are not visible yet";
  EXPECT_EQ(store.stats().dedup_blocks, 4);

  // A commit whose bytes differ from the checksum is rejected; unlisted slots are freed.
  const std::vector<char> b3 = BlockBytes(hashes[3]);
  std::memcpy(memory.data() + a.offsets[1], b3.data(), b3.size());
  absl::StatusOr<BlockStore::CommitResult> ca = store.Commit(a.id, U({hashes[3], hashes[4]}), U({Xxh(b3.data(), b3.size()), 7}));
  ASSERT_TRUE(ca.ok());
  EXPECT_EQ(ca->committed, 1);
  EXPECT_EQ(ca->rejected, 1);
  EXPECT_EQ(store.Lookup(kFp, hashes), 4);
  EXPECT_EQ(store.Commit(a.id, U({}), U({})).status().code(), absl::StatusCode::kNotFound) << "committed once";
  absl::StatusOr<BlockStore::CommitResult> cb = store.Commit(b.id, U({}), U({}));
  ASSERT_TRUE(cb.ok());
  EXPECT_EQ(cb->committed, 0);
  EXPECT_EQ(store.stats().dram_blocks, 4);
  EXPECT_EQ(store.stats().dram_bytes_used, 4 * kBlock);
  EXPECT_EQ(ReadAndCheck(store, hashes), 4);
}

TEST(BlockStoreTest, UncommittedReservationsExpire) {
  std::vector<char> memory(4 * kBlock);
  double now = 100;
  BlockStore store(memory.data(), memory.size(), {.block_bytes = kBlock, .lease_seconds = 5, .clock = [&] { return now; }},
                   nullptr);
  const std::vector<uint64_t> hashes = Hashes(4, 6);
  BlockStore::Reservation r = store.Reserve(kFp, hashes);
  EXPECT_EQ(store.Reserve(kFp, Hashes(1, 7)).offsets[0], -1) << "every slot reserved";
  now = 106;
  store.ExpireReservations();
  EXPECT_EQ(store.stats().expired_reservations, 1);
  EXPECT_EQ(store.Commit(r.id, U({hashes[0]}), U({0})).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(PutBlocks(store, memory.data(), hashes), 4) << "the slots are free again";
}

TEST(BlockStoreTest, LruEvictionKeepsRecentlyReadBlocks) {
  std::vector<char> memory(4 * kBlock);
  BlockStore store(memory.data(), memory.size(), {.block_bytes = kBlock}, nullptr);
  const std::vector<uint64_t> h = Hashes(6, 8);
  EXPECT_EQ(PutBlocks(store, memory.data(), {h[0], h[1], h[2], h[3]}), 4);
  EXPECT_EQ(ReadAndCheck(store, {h[0]}), 1);  // 1 is now the least recently used
  {
    // A pinned block (a read in flight) is never evicted.
    std::unique_ptr<BlockStore::ReadHandle> pinned = store.Read(kFp, U({h[1]}));
    EXPECT_EQ(PutBlocks(store, memory.data(), {h[4]}), 1);
    EXPECT_EQ(store.Lookup(kFp, U({h[1]})), 1);
    EXPECT_EQ(store.Lookup(kFp, U({h[2]})), 0) << "2 was the least recently used unpinned block";
  }
  EXPECT_EQ(PutBlocks(store, memory.data(), {h[5]}), 1);
  EXPECT_EQ(store.Lookup(kFp, U({h[3]})), 0);
  EXPECT_EQ(store.Lookup(kFp, U({h[0]})), 1);
  EXPECT_EQ(store.stats().dram_evictions, 2);
}

// ---- Both tiers ----

TEST(BlockStoreTest, CapacityPressureSpillsToDiskAndHitsContinueFromIt) {
  TempDir dir;
  const int kWorkingSet = 200;
  auto disk = DiskTier::Open(dir.path(), 1 << 30);
  ASSERT_TRUE(disk.ok());
  // DRAM holds 10% of the working set.
  std::vector<char> memory(kWorkingSet / 10 * kBlock);
  BlockStore store(memory.data(), memory.size(), {.block_bytes = kBlock}, disk->get());
  const std::vector<uint64_t> hashes = Hashes(kWorkingSet, 9);
  int64_t max_used = 0;
  for (int i = 0; i < kWorkingSet; i += 5) {
    std::vector<uint64_t> group(hashes.begin() + i, hashes.begin() + i + 5);
    // Writes may find DRAM full of blocks still being written to disk: retry as a
    // writer's next offload would.
    for (int tries = 0; tries < 500 && store.Lookup(kFp, group) < 5; ++tries) {
      PutBlocks(store, memory.data(), group);
      max_used = std::max(max_used, store.stats().dram_bytes_used);
      if (store.Lookup(kFp, group) < 5) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_EQ(store.Lookup(kFp, group), 5) << i;
  }
  for (int i = 0; i < 500 && (*disk)->pending_writes() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  KvStoreStats s = store.stats();
  EXPECT_LE(max_used, s.dram_capacity_bytes);
  EXPECT_LE(s.dram_bytes_used, s.dram_capacity_bytes);
  EXPECT_GT(s.dram_evictions, kWorkingSet / 2);
  EXPECT_EQ(s.disk_blocks, kWorkingSet) << "the SSD tier holds the overflow";
  // Every block is still a hit; most come back from disk (and are promoted).
  EXPECT_EQ(store.Lookup(kFp, hashes), kWorkingSet);
  for (int i = 0; i < kWorkingSet; i += 10) {
    EXPECT_EQ(ReadAndCheck(store, std::vector<uint64_t>(hashes.begin() + i, hashes.begin() + i + 10)), 10) << i;
    EXPECT_LE(store.stats().dram_bytes_used, s.dram_capacity_bytes);
  }
  EXPECT_GE(store.stats().disk_reads, kWorkingSet - kWorkingSet / 10);
}

TEST(BlockStoreTest, RestartFromTheDiskTierServesVerifiedBlocks) {
  TempDir dir;
  const std::vector<uint64_t> hashes = Hashes(12, 10);
  std::string damaged;
  {
    auto disk = DiskTier::Open(dir.path(), 1 << 30);
    ASSERT_TRUE(disk.ok());
    std::vector<char> memory(32 * kBlock);
    BlockStore store(memory.data(), memory.size(), {.block_bytes = kBlock}, disk->get());
    EXPECT_EQ(PutBlocks(store, memory.data(), hashes), 12);
    damaged = (*disk)->PathOf({kFp, hashes[7]});
  }  // the store waits for its disk writes
  {
    std::fstream f(damaged, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(64 + 5);
    f.put('\x33');
  }
  auto disk = DiskTier::Open(dir.path(), 1 << 30);
  ASSERT_TRUE(disk.ok());
  EXPECT_EQ((*disk)->stats().loaded, 11);
  EXPECT_EQ((*disk)->stats().corrupt_dropped, 1);
  std::vector<char> memory(32 * kBlock);  // a new, empty DRAM tier
  BlockStore store(memory.data(), memory.size(), {.block_bytes = kBlock}, disk->get());
  EXPECT_EQ(store.Lookup(kFp, hashes), 7) << "the damaged block ends the prefix";
  EXPECT_EQ(ReadAndCheck(store, hashes), 7);
  EXPECT_EQ(store.stats().dram_blocks, 7) << "promoted";
  EXPECT_EQ(ReadAndCheck(store, std::vector<uint64_t>(hashes.begin() + 8, hashes.end())), 4);
}

TEST(BlockStoreTest, ConcurrentWritersAndReadersKeepEveryInvariant) {
  TempDir dir;
  auto disk = DiskTier::Open(dir.path(), 64 * (kBlock + 64));
  ASSERT_TRUE(disk.ok());
  std::vector<char> memory(16 * kBlock);
  BlockStore store(memory.data(), memory.size(), {.block_bytes = kBlock}, disk->get());
  const std::vector<uint64_t> hashes = Hashes(100, 11);
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 300; ++i) {
        std::vector<uint64_t> group;
        const int start = static_cast<int>(rng() % 95);
        for (int j = 0; j < 5; ++j) group.push_back(hashes[static_cast<size_t>(start + j)]);
        if (rng() % 2) {
          PutBlocks(store, memory.data(), group);
        } else {
          std::unique_ptr<BlockStore::ReadHandle> h = store.Read(kFp, group);
          for (size_t k = 0; k < h->blocks().size(); ++k) {
            const std::vector<char> want = BlockBytes(group[k]);
            if (std::memcmp(h->blocks()[k].data, want.data(), want.size()) != 0) failed = true;
          }
        }
        if (store.stats().dram_bytes_used > store.stats().dram_capacity_bytes) failed = true;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_FALSE(failed);
  EXPECT_LE((*disk)->stats().bytes_used, 64 * (kBlock + 64));
}

}  // namespace
}  // namespace tandem::kvstore
