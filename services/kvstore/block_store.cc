#include "services/kvstore/block_store.h"

#include <chrono>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/check.h"
#include "xxhash.h"

namespace tandem::kvstore {

BlockStore::BlockStore(void* memory, size_t bytes, BlockStoreOptions options, DiskTier* disk)
    : memory_(static_cast<char*>(memory)), options_(std::move(options)), disk_(disk) {
  TANDEM_CHECK(options_.block_bytes > 0) << "block_bytes " << options_.block_bytes;
  const int64_t n = static_cast<int64_t>(bytes) / options_.block_bytes;
  TANDEM_CHECK(n < (int64_t{1} << 31)) << n << " slots";
  slots_.resize(static_cast<size_t>(n));
  free_.reserve(slots_.size());
  for (int64_t i = n - 1; i >= 0; --i) free_.push_back(static_cast<int32_t>(i));
  index_.reserve(slots_.size());
  stats_.dram_capacity_bytes = n * options_.block_bytes;
}

BlockStore::~BlockStore() {
  std::unique_lock<std::mutex> lock(mu_);
  disk_cv_.wait(lock, [this] { return pending_disk_writes_ == 0; });
}

double BlockStore::Now() const {
  if (options_.clock) return options_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void BlockStore::LruPushBackLocked(int32_t s) {
  Slot& slot = slots_[s];
  TANDEM_CHECK(!slot.in_lru);
  slot.prev = lru_tail_;
  slot.next = -1;
  if (lru_tail_ >= 0) slots_[lru_tail_].next = s;
  else lru_head_ = s;
  lru_tail_ = s;
  slot.in_lru = true;
}

void BlockStore::LruRemoveLocked(int32_t s) {
  Slot& slot = slots_[s];
  TANDEM_CHECK(slot.in_lru);
  if (slot.prev >= 0) slots_[slot.prev].next = slot.next;
  else lru_head_ = slot.next;
  if (slot.next >= 0) slots_[slot.next].prev = slot.prev;
  else lru_tail_ = slot.prev;
  slot.prev = slot.next = -1;
  slot.in_lru = false;
}

void BlockStore::PinLocked(int32_t s) {
  Slot& slot = slots_[s];
  if (slot.in_lru) LruRemoveLocked(s);
  slot.pins++;
}

void BlockStore::UnpinLocked(int32_t s) {
  Slot& slot = slots_[s];
  TANDEM_CHECK_GE(slot.pins, 1);
  if (--slot.pins == 0 && slot.state == State::kReady) LruPushBackLocked(s);  // most recently used
}

int32_t BlockStore::AllocateSlotLocked() {
  if (!free_.empty()) {
    const int32_t s = free_.back();
    free_.pop_back();
    return s;
  }
  if (lru_head_ < 0) return -1;
  const int32_t s = lru_head_;  // least recently used, unpinned, ready
  LruRemoveLocked(s);
  Slot& slot = slots_[s];
  index_.erase(slot.key);
  slot.state = State::kFree;
  num_ready_--;
  stats_.dram_evictions++;
  return s;
}

void BlockStore::FreeSlotLocked(int32_t s) {
  Slot& slot = slots_[s];
  TANDEM_CHECK(slot.pins == 0 && !slot.in_lru);
  if (slot.state == State::kReserved) num_reserved_--;
  if (slot.state == State::kReady) num_ready_--;
  if (auto it = index_.find(slot.key); it != index_.end() && it->second == s) index_.erase(it);
  slot.state = State::kFree;
  free_.push_back(s);
}

bool BlockStore::StoredLocked(const BlockKey& key) const {
  if (auto it = index_.find(key); it != index_.end() && slots_[it->second].state == State::kReady) return true;
  return disk_ != nullptr && disk_->Contains(key);
}

int32_t BlockStore::Lookup(uint64_t fingerprint, std::span<const uint64_t> hashes) {
  std::lock_guard<std::mutex> lock(mu_);
  int32_t n = 0;
  for (uint64_t h : hashes) {
    if (!StoredLocked({fingerprint, h})) break;
    ++n;
  }
  stats_.lookups++;
  stats_.lookup_blocks += static_cast<int64_t>(hashes.size());
  stats_.lookup_hit_blocks += n;
  return n;
}

std::vector<bool> BlockStore::Holds(uint64_t fingerprint, std::span<const uint64_t> hashes) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<bool> held;
  held.reserve(hashes.size());
  for (uint64_t h : hashes) {
    held.push_back(StoredLocked({fingerprint, h}));
    stats_.lookup_hit_blocks += held.back() ? 1 : 0;
  }
  stats_.lookups++;
  stats_.lookup_blocks += static_cast<int64_t>(hashes.size());
  return held;
}

BlockStore::Reservation BlockStore::Reserve(uint64_t fingerprint, std::span<const uint64_t> hashes) {
  Reservation r;
  r.offsets.assign(hashes.size(), -1);
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(Now());
  PendingReservation pending;
  for (size_t i = 0; i < hashes.size(); ++i) {
    const BlockKey key{fingerprint, hashes[i]};
    // Stored, in flight from another writer (or listed twice here): not written again.
    if (index_.contains(key) || (disk_ != nullptr && disk_->Contains(key))) {
      stats_.dedup_blocks++;
      continue;
    }
    const int32_t s = AllocateSlotLocked();
    if (s < 0) {
      stats_.no_room_blocks++;
      continue;
    }
    Slot& slot = slots_[s];
    slot.state = State::kReserved;
    slot.key = key;
    num_reserved_++;
    index_[key] = s;
    pending.slots.push_back(s);
    r.offsets[i] = static_cast<int64_t>(s) * options_.block_bytes;
    stats_.reserved_blocks++;
  }
  if (!pending.slots.empty()) {
    const uint64_t id = next_reservation_++;
    pending.expires_at = Now() + options_.lease_seconds;
    reservations_[id] = std::move(pending);
    r.id = absl::StrCat(id);
  }
  return r;
}

absl::StatusOr<BlockStore::CommitResult> BlockStore::Commit(const std::string& id, std::span<const uint64_t> hashes,
                                                            std::span<const uint64_t> checksums) {
  if (hashes.size() != checksums.size()) {
    return absl::InvalidArgumentError("checksums: one per block hash expected");
  }
  uint64_t rid = 0;
  PendingReservation pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ExpireLocked(Now());
    auto it = absl::SimpleAtoi(id, &rid) ? reservations_.find(rid) : reservations_.end();
    if (it == reservations_.end()) {
      return absl::NotFoundError(absl::StrCat("reservation '", id, "' is unknown or expired"));
    }
    // Out of the table: no expiry can free these slots while they are checked unlocked.
    pending = std::move(it->second);
    reservations_.erase(it);
  }
  absl::flat_hash_map<uint64_t, uint64_t> wanted;
  for (size_t i = 0; i < hashes.size(); ++i) wanted[hashes[i]] = checksums[i];
  CommitResult result;
  std::vector<std::pair<int32_t, uint64_t>> good;  // slot, checksum
  std::vector<int32_t> bad;
  absl::flat_hash_set<uint64_t> seen;
  for (int32_t s : pending.slots) {
    const BlockKey& key = slots_[s].key;  // stable: the slot is reserved and ours
    auto w = wanted.find(key.hash);
    if (w == wanted.end()) {
      bad.push_back(s);  // not written: released
      continue;
    }
    seen.insert(key.hash);
    const uint64_t actual = XXH3_64bits(SlotData(s), static_cast<size_t>(options_.block_bytes));
    if (actual == w->second) {
      good.emplace_back(s, actual);
    } else {
      bad.push_back(s);
      result.rejected++;
    }
  }
  for (uint64_t h : hashes) {
    if (!seen.contains(h)) result.rejected++;  // not part of the reservation
  }
  std::vector<int32_t> to_disk;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.rejected_blocks += result.rejected;
    for (int32_t s : bad) FreeSlotLocked(s);
    for (auto [s, checksum] : good) {
      Slot& slot = slots_[s];
      slot.state = State::kReady;
      slot.checksum = checksum;
      num_reserved_--;
      num_ready_++;
      stats_.committed_blocks++;
      stats_.put_bytes += options_.block_bytes;
      result.committed++;
      if (disk_ != nullptr) {
        slot.pins++;  // until its file is written: not evictable, bytes stable
        pending_disk_writes_++;
        to_disk.push_back(s);
      } else {
        LruPushBackLocked(s);
      }
    }
  }
  for (int32_t s : to_disk) {
    disk_->WriteAsync(slots_[s].key, SlotData(s), static_cast<size_t>(options_.block_bytes), slots_[s].checksum,
                      [this, s](absl::Status) { OnDiskWritten(s); });
  }
  return result;
}

void BlockStore::OnDiskWritten(int32_t s) {
  // Notified under the lock: the destructor, once it sees no pending write, destroys the
  // condition variable, so a notify after unlocking could touch a destroyed one
  // (ThreadSanitizer saw exactly that in kvstore_core_test).
  std::lock_guard<std::mutex> lock(mu_);
  UnpinLocked(s);
  pending_disk_writes_--;
  disk_cv_.notify_all();
}

std::unique_ptr<BlockStore::ReadHandle> BlockStore::Read(uint64_t fingerprint, std::span<const uint64_t> hashes) {
  std::unique_ptr<ReadHandle> handle(new ReadHandle(this));
  size_t i = 0;
  for (; i < hashes.size(); ++i) {
    const BlockKey key{fingerprint, hashes[i]};
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = index_.find(key); it != index_.end() && slots_[it->second].state == State::kReady) {
        PinLocked(it->second);
        handle->pinned_.push_back(it->second);
        handle->blocks_.push_back({SlotData(it->second), slots_[it->second].checksum});
        continue;
      }
    }
    if (disk_ == nullptr) break;
    // Only the disk has it (or nobody): read and verify the file, outside the lock.
    uint64_t checksum = 0;
    absl::StatusOr<std::vector<char>> bytes = disk_->Read(key, &checksum);
    if (!bytes.ok() || static_cast<int64_t>(bytes->size()) != options_.block_bytes) break;
    int32_t s = -1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = index_.find(key); it != index_.end() && slots_[it->second].state == State::kReady) {
        PinLocked(it->second);  // promoted by another reader meanwhile
        handle->pinned_.push_back(it->second);
        handle->blocks_.push_back({SlotData(it->second), slots_[it->second].checksum});
        continue;
      }
      if (!index_.contains(key)) s = AllocateSlotLocked();
      if (s >= 0) {
        Slot& slot = slots_[s];
        slot.state = State::kReserved;  // being filled
        slot.key = key;
        num_reserved_++;
        index_[key] = s;
      }
    }
    if (s < 0) {
      // No slot to promote into: serve from the buffer read.
      auto buffer = std::make_shared<std::vector<char>>(std::move(*bytes));
      handle->blocks_.push_back({buffer->data(), checksum});
      handle->buffers_.push_back(std::move(buffer));
      continue;
    }
    std::memcpy(SlotData(s), bytes->data(), bytes->size());
    std::lock_guard<std::mutex> lock(mu_);
    Slot& slot = slots_[s];
    slot.state = State::kReady;
    slot.checksum = checksum;
    num_reserved_--;
    num_ready_++;
    slot.pins++;  // the handle's; it joins the LRU when the handle lets go (already on disk)
    handle->pinned_.push_back(s);
    handle->blocks_.push_back({SlotData(s), checksum});
  }
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t n = static_cast<int64_t>(handle->blocks_.size());
  stats_.get_blocks += n;
  stats_.get_bytes += n * options_.block_bytes;
  stats_.hit_tokens += n * options_.block_tokens;
  stats_.get_misses += static_cast<int64_t>(hashes.size()) - n;
  return handle;
}

BlockStore::ReadHandle::~ReadHandle() {
  std::lock_guard<std::mutex> lock(store_->mu_);
  for (int32_t s : pinned_) store_->UnpinLocked(s);
}

void BlockStore::ExpireReservations() {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(Now());
}

void BlockStore::ExpireLocked(double now) {
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    if (it->second.expires_at <= now) {
      for (int32_t s : it->second.slots) FreeSlotLocked(s);
      stats_.expired_reservations++;
      it = reservations_.erase(it);
    } else {
      ++it;
    }
  }
}

int64_t BlockStore::num_available() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = static_cast<int64_t>(free_.size());
  for (int32_t s = lru_head_; s >= 0; s = slots_[s].next) ++n;
  return n;
}

KvStoreStats BlockStore::stats() const {
  KvStoreStats s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = stats_;
    s.dram_blocks = num_ready_;
    s.dram_bytes_used = (num_ready_ + num_reserved_) * options_.block_bytes;
  }
  if (disk_ != nullptr) {
    const DiskTierStats d = disk_->stats();
    s.disk_blocks = d.blocks;
    s.disk_bytes_used = d.bytes_used;
    s.disk_capacity_bytes = d.capacity_bytes;
    s.disk_writes = d.writes;
    s.disk_write_failures = d.write_failures;
    s.disk_reads = d.reads;
    s.disk_evictions = d.evictions;
    s.disk_corrupt_dropped = d.corrupt_dropped;
    s.disk_loaded_blocks = d.loaded;
  }
  return s;
}

}  // namespace tandem::kvstore
