// The prefill replicas' client of the kvstore tier (PrefixStore over tandem.v1.KvStore):
// shards every request over the instances by consistent hashing of the block hash
// (hash_ring.h), asks them in parallel, and moves block bytes over the transfer layer.
//
// Fetch: Lookup on every instance owning a hash of the chain -> the longest prefix held
// by all of them together (the first hash missing on any instance ends it); with a
// per-sequence state (options.state_bytes), a Lookup of each candidate end's first state
// chunk picks the furthest end whose state is stored; then Get of the blocks
// [first_block, min(prefix, end_block)) (and that state's chunks) from their owners,
// which put them into
// this client's staging region (transfer-layer memory, allocated once: UCX writes it
// directly on one host); each block's XXH3 is checked against the store's before the
// engine sees it. One deadline covers both steps; an instance that fails or is late cuts
// the prefix where its first block is. The staging slots of a fetch go back to the pool
// when the engine has copied them in (PrefixKv::owner); after a failed Get they are held
// back a while longer (late writes may still land).
//
// A request's hashes go to an instance in calls of at most max_hashes_per_call
// (kvstore_limits.h, what the instances accept); a Get an instance refuses as busy
// (RESOURCE_EXHAUSTED: too many gets queued there) cuts the prefix like any failure, so
// the prefill computes the rest, but its staging slots come back at once (nothing was
// written).
//
// Offload: Reserve on the owners (they skip blocks they have or that another writer is
// putting: deduplication), put the reserved blocks into their slots, then Commit with the
// blocks' checksums (or an empty Commit after a failed put, freeing the slots).
//
// Membership: SetInstances replaces the set (from the router's heartbeat answers, or a
// static --kvstore list); requests already running keep the set they started with.
// Thread-safe. The transfer engine must outlive the client; the destructor waits for
// every operation in flight (each is bounded by its deadline).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "services/security/channel_factory.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/common/transfer/transfer_engine.h"
#include "services/kvstore/hash_ring.h"
#include "services/kvstore/kvstore_limits.h"
#include "services/kvstore/prefix_store.h"
#include "tandem/v1/kvstore.grpc.pb.h"

namespace tandem::kvstore {

struct KvStoreClientOptions {
  uint64_t layout_fingerprint = 0;
  int64_t block_bytes = 0;    // num_layers x block_size x entry_dim x 4
  int32_t block_tokens = 64;
  // Bytes of the per-sequence state a prefix needs where it ends (KvPool::StateImage: a
  // layout with rings and states, DeepSeek-V4); 0 for none (one latent stream). Such a
  // state is stored as ceil(state_bytes / block_bytes) blocks named by StateChunkHash
  // (block_hash.h): an offload lists them after the blocks; a fetch brings the blocks up
  // to the furthest stored state it can use, and that state, or nothing.
  int64_t state_bytes = 0;
  size_t staging_bytes = size_t{256} << 20;  // receive region for fetched blocks
  absl::Duration fetch_timeout = absl::Milliseconds(2000);  // lookup + get, per request
  absl::Duration offload_timeout = absl::Seconds(10);       // reserve + put + commit
  int64_t max_offload_bytes = int64_t{512} << 20;           // in flight; beyond: dropped
  absl::Duration quarantine = absl::Seconds(10);            // staging held after a failed get
  int vnodes = 128;
  int max_hashes_per_call = kMaxHashesPerCall;  // longer requests go in several calls
  // How channels to the instances are opened (their credentials: services/security);
  // empty: plaintext.
  security::ChannelFactory channel_factory;
};

// Plain counters (the worker's /stats shows them).
struct KvStoreClientStats {
  int64_t fetches = 0;               // Fetch calls with instances known
  int64_t fetch_errors = 0;          // lookups or gets that failed or timed out
  int64_t lookup_blocks = 0;         // hashes asked about
  int64_t lookup_hit_blocks = 0;     // the stored prefixes' blocks
  int64_t fetched_blocks = 0;        // blocks landed and verified
  int64_t fetched_bytes = 0;
  int64_t checksum_mismatches = 0;
  int64_t staging_exhausted = 0;     // fetches cut short by a full staging region
  int64_t offloads = 0;              // Offload calls sent
  int64_t offload_dropped = 0;       // not sent: too much in flight, or no instance
  int64_t offload_blocks = 0;        // blocks written and committed
  int64_t offload_bytes = 0;
  int64_t offload_dedup_blocks = 0;  // skipped: stored already, in flight elsewhere, or no room
  int64_t offload_errors = 0;        // reserve/put/commit failures
};

class KvStoreClient final : public PrefixStore {
 public:
  struct Instance {
    std::string name;     // place on the ring
    std::string address;  // gRPC
  };

  // Allocates the staging region from `transfer`. Errors: INVALID_ARGUMENT (bad options),
  // the transfer layer's.
  static absl::StatusOr<std::unique_ptr<KvStoreClient>> Create(transfer::TransferEngine* transfer,
                                                               KvStoreClientOptions options);
  ~KvStoreClient() override;

  void SetInstances(std::vector<Instance> instances);
  std::vector<Instance> instances() const;

  void Fetch(FetchRequest request, std::function<void(FetchResult)> done) override;
  void Offload(OffloadRequest request) override;
  bool available() const override;

  KvStoreClientStats stats() const;

 private:
  struct Snapshot;
  struct FetchOp;
  struct OffloadOp;
  class StagingPool;

  KvStoreClient(transfer::TransferEngine* transfer, KvStoreClientOptions options);
  std::shared_ptr<const Snapshot> snapshot() const;
  v1::KvBlockFormat Format() const;
  void AfterLookup(std::shared_ptr<FetchOp> op);
  // With state_bytes: which candidate prefix ends have their state stored.
  void LookUpStates(std::shared_ptr<FetchOp> op, int32_t from, int32_t to);
  void StartGet(std::shared_ptr<FetchOp> op);
  void AfterGet(std::shared_ptr<FetchOp> op);
  int32_t state_chunks() const {
    return static_cast<int32_t>((options_.state_bytes + options_.block_bytes - 1) / options_.block_bytes);
  }
  void FinishFetch(std::shared_ptr<FetchOp> op);  // calls done with op->result
  void OffloadShardDone(const std::shared_ptr<OffloadOp>& op);
  void OpStarted();
  void OpDone();
  template <typename F>
  void Count(F f) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    f(stats_);
  }

  transfer::TransferEngine* transfer_;
  KvStoreClientOptions options_;
  std::unique_ptr<transfer::MemoryRegion> staging_region_;
  std::string staging_descriptor_;
  std::shared_ptr<StagingPool> staging_;

  mutable std::mutex mu_;
  std::shared_ptr<const Snapshot> snapshot_;
  std::map<std::string, std::shared_ptr<v1::KvStore::Stub>> stubs_;  // by address

  std::mutex ops_mu_;
  std::condition_variable ops_cv_;
  int64_t ops_in_flight_ = 0;
  std::atomic<int64_t> offload_bytes_in_flight_{0};

  mutable std::mutex stats_mu_;
  KvStoreClientStats stats_;
};

}  // namespace tandem::kvstore
