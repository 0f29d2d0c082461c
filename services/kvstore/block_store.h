// The storage core of a kvstore instance, without RPC or transport: a DRAM tier of
// fixed-size block slots with LRU eviction, over memory the caller provides (the
// instance's transfer-layer region, which writers put into directly), and an optional
// SSD tier (disk_tier.h).
//
// Puts are two-phase. Reserve hands out slots for blocks the store does not have; the
// writer fills them (a UCX put into the region) and Commit publishes them after checking
// each block's XXH3 against the writer's. A block reserved by one writer is skipped for
// every other (concurrent puts of the same block are deduplicated), as are blocks already
// stored in either tier. A reservation not committed within the lease is freed.
//
// Tiers: with a disk tier, every committed block is also written to disk in the
// background (write-through; the slot stays pinned until its file is written), so the
// disk holds the DRAM tier's overflow and everything survives a restart (the DRAM tier
// starts empty; the disk tier reloads and verifies its files). A read of a block that
// only the disk holds reads and verifies the file and promotes the block into a DRAM slot
// (evicting the least recently used unpinned block). The DRAM tier never exceeds its
// capacity: its memory is exactly the slots.
//
// Slot states: free -> reserved (a writer's) -> ready (readable; in the LRU while no
// reader or disk write pins it) -> free (evicted, or the reservation failed/expired).
//
// Thread-safe; one mutex over the index, taken for O(blocks) bookkeeping only: checksums,
// copies and disk I/O run outside it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "services/kvstore/block_key.h"
#include "services/kvstore/disk_tier.h"
#include "services/kvstore/kv_store_stats.h"

namespace tandem::kvstore {

struct BlockStoreOptions {
  int64_t block_bytes = 0;   // bytes of one block (checked positive)
  int32_t block_tokens = 64;  // tokens per block, for hit_tokens
  double lease_seconds = 30;  // reservations not committed within this are freed
  std::function<double()> clock;  // monotonic seconds; steady_clock when empty
};

class BlockStore {
 public:
  // `memory` (caller-owned, outliving the store) holds bytes / block_bytes slots; `disk`
  // (may be null) must outlive the store too.
  BlockStore(void* memory, size_t bytes, BlockStoreOptions options, DiskTier* disk);
  // Waits for the background disk writes of committed blocks. Every ReadHandle must be
  // gone before.
  ~BlockStore();
  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;

  // How many leading `hashes` are stored (ready in DRAM, or on disk).
  int32_t Lookup(uint64_t fingerprint, std::span<const uint64_t> hashes);
  // Whether each of `hashes` is stored (DRAM or disk), each on its own; counted as one
  // lookup, its hits being the hashes held.
  std::vector<bool> Holds(uint64_t fingerprint, std::span<const uint64_t> hashes);

  struct Reservation {
    std::string id;                // empty when no slot was reserved
    std::vector<int64_t> offsets;  // one per hash: slot byte offset in the memory, or -1
  };
  // Slots for the hashes not stored and not being written by someone else, while slots
  // can be found (free ones first, then by evicting least recently used ready blocks).
  Reservation Reserve(uint64_t fingerprint, std::span<const uint64_t> hashes);

  struct CommitResult {
    int32_t committed = 0;
    int32_t rejected = 0;
  };
  // Publishes the listed blocks of reservation `id` whose bytes hash to the checksum given
  // with them, frees the others (also the reservation's unlisted ones). NOT_FOUND for an
  // unknown or expired reservation (nothing is published); INVALID_ARGUMENT when the
  // two lists differ in length.
  absl::StatusOr<CommitResult> Commit(const std::string& id, std::span<const uint64_t> hashes,
                                      std::span<const uint64_t> checksums);

  struct ReadBlock {
    const void* data = nullptr;  // block_bytes bytes, valid while the handle lives
    uint64_t checksum = 0;       // XXH3-64 of them
  };
  // Blocks pinned for reading (not evicted or reused while it lives). Must not outlive
  // the store.
  class ReadHandle {
   public:
    ~ReadHandle();
    const std::vector<ReadBlock>& blocks() const { return blocks_; }

   private:
    friend class BlockStore;
    explicit ReadHandle(BlockStore* store) : store_(store) {}
    BlockStore* store_;
    std::vector<ReadBlock> blocks_;
    std::vector<int32_t> pinned_;                         // slots
    std::vector<std::shared_ptr<std::vector<char>>> buffers_;  // blocks read from disk, not promoted
  };
  // Pins the leading run of `hashes` that is stored, reading from disk (and promoting
  // into DRAM) what only the disk holds. Blocks on disk that fail verification end the
  // run (and are dropped). Does disk I/O: call it off latency-critical threads.
  std::unique_ptr<ReadHandle> Read(uint64_t fingerprint, std::span<const uint64_t> hashes);

  // Frees the reservations whose lease passed (also done by Reserve).
  void ExpireReservations();

  KvStoreStats stats() const;
  int64_t num_slots() const { return static_cast<int64_t>(slots_.size()); }
  int64_t block_bytes() const { return options_.block_bytes; }
  // Slots free or evictable now.
  int64_t num_available() const;

 private:
  enum class State : uint8_t { kFree, kReserved, kReady };
  struct Slot {
    State state = State::kFree;
    BlockKey key;
    uint64_t checksum = 0;
    int32_t pins = 0;
    int32_t prev = -1, next = -1;  // LRU links (ready and unpinned only)
    bool in_lru = false;
  };
  struct PendingReservation {
    std::vector<int32_t> slots;
    double expires_at = 0;
  };

  char* SlotData(int32_t slot) const { return memory_ + static_cast<int64_t>(slot) * options_.block_bytes; }
  int32_t AllocateSlotLocked();  // -1 when every slot is reserved or pinned
  void FreeSlotLocked(int32_t slot);
  void PinLocked(int32_t slot);
  void UnpinLocked(int32_t slot);
  void LruPushBackLocked(int32_t slot);
  void LruRemoveLocked(int32_t slot);
  void ExpireLocked(double now);
  bool StoredLocked(const BlockKey& key) const;
  void OnDiskWritten(int32_t slot);
  double Now() const;

  char* memory_;
  BlockStoreOptions options_;
  DiskTier* disk_;
  mutable std::mutex mu_;
  std::condition_variable disk_cv_;
  std::vector<Slot> slots_;
  std::vector<int32_t> free_;
  int32_t lru_head_ = -1, lru_tail_ = -1;
  int64_t num_ready_ = 0, num_reserved_ = 0;
  absl::flat_hash_map<BlockKey, int32_t> index_;  // reserved and ready slots
  std::map<uint64_t, PendingReservation> reservations_;
  uint64_t next_reservation_ = 1;
  int64_t pending_disk_writes_ = 0;
  KvStoreStats stats_;
};

}  // namespace tandem::kvstore
