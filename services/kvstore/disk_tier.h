// The kvstore's SSD tier: one file per block under a directory, bounded by a byte
// capacity with LRU eviction (least recently written or read first), surviving restarts.
//
// File: DIR/<fingerprint hex>/<first two hex of hash>/<hash hex>.kvb, a 64-byte header
// then the block's bytes. Header, little-endian:
//   0  "TKVBLK\0\1"   8  u32 version (1)     12 u32 header bytes (64)
//   16 u64 fingerprint  24 u64 hash         32 u64 payload bytes
//   40 u64 XXH3-64 of the payload           48 u64 XXH3-64 of bytes [0, 48)   56 zero
// Files are written to DIR/tmp and renamed into place, so a crash leaves a whole file or
// none (plus debris in tmp, removed at the next start). Nothing is fsynced: a file torn
// by a power loss is caught by its checksums.
//
// Verification: at Open every file is read whole and checked (magic, version, sizes,
// both checksums, and that its name matches its key); every Read checks again. A file
// that fails is deleted and counted (corrupt_dropped): a damaged block is never served.
//
// Threads: every method is thread-safe. File I/O runs outside the index lock. One writer
// thread serves WriteAsync, in order.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "services/kvstore/block_key.h"

namespace tandem::kvstore {

struct DiskTierStats {
  int64_t blocks = 0;
  int64_t bytes_used = 0;  // file bytes (header included)
  int64_t capacity_bytes = 0;
  int64_t writes = 0;
  int64_t write_failures = 0;
  int64_t reads = 0;
  int64_t evictions = 0;
  int64_t corrupt_dropped = 0;
  int64_t loaded = 0;
};

class DiskTier {
 public:
  static constexpr size_t kHeaderBytes = 64;

  // Creates `dir` if needed, loads and verifies the blocks already there (evicting the
  // oldest beyond `capacity_bytes`), and starts the writer thread. Errors: INVALID_ARGUMENT
  // (empty dir, capacity < 1), the filesystem's error when `dir` cannot be created.
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(const std::string& dir, int64_t capacity_bytes);
  // Completes the queued writes, then stops the writer thread.
  ~DiskTier();

  bool Contains(const BlockKey& key) const;

  // The block's bytes, verified, and their XXH3-64 in *checksum. NOT_FOUND when absent;
  // DATA_LOSS when the file did not verify (it is deleted and dropped).
  absl::StatusOr<std::vector<char>> Read(const BlockKey& key, uint64_t* checksum);

  // Writes the block (replacing a previous copy), evicting least recently used files to
  // stay within the capacity. `checksum` is the XXH3-64 of the bytes (the caller has it).
  // Errors: RESOURCE_EXHAUSTED (one block larger than the capacity), the filesystem's.
  absl::Status Write(const BlockKey& key, const void* data, size_t length, uint64_t checksum);

  // Write on the writer thread; `done` runs there with Write's status. `data` must stay
  // valid until then.
  void WriteAsync(const BlockKey& key, const void* data, size_t length, uint64_t checksum,
                  std::function<void(absl::Status)> done);
  // Writes queued and not yet done.
  size_t pending_writes() const;

  DiskTierStats stats() const;
  const std::string& dir() const { return dir_; }
  // Where the block's file lives (whether or not it exists), for tests.
  std::string PathOf(const BlockKey& key) const;

 private:
  struct Entry {
    int64_t bytes = 0;
    std::list<BlockKey>::iterator lru;
  };
  struct Job {
    BlockKey key;
    const void* data;
    size_t length;
    uint64_t checksum;
    std::function<void(absl::Status)> done;
  };

  DiskTier(std::string dir, int64_t capacity) : dir_(std::move(dir)), capacity_(capacity) {}
  void Load();
  void Drop(const BlockKey& key, bool corrupt);  // forgets and deletes
  void WriterLoop();

  const std::string dir_;
  const int64_t capacity_;
  mutable std::mutex mu_;
  absl::flat_hash_map<BlockKey, Entry> index_;
  std::list<BlockKey> lru_;  // front: least recently used
  int64_t used_ = 0;         // bytes of indexed files plus space held by writes in progress
  uint64_t tmp_counter_ = 0;
  DiskTierStats stats_;

  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool writing_ = false;
  bool stop_ = false;
  std::thread writer_;
};

}  // namespace tandem::kvstore
