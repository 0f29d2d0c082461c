// The router's view of the cluster: replicas that registered, their last load report and
// heartbeat, the requests the router has in flight on each, and a gRPC channel to each.
// Replicas that miss heartbeats are dropped; draining ones get no new work.
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <shared_mutex>
#include <span>
#include <unordered_set>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "services/security/channel_factory.h"
#include "absl/status/statusor.h"
#include "services/router/routing_policy.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/internal.grpc.pb.h"

namespace tandem {

struct Replica {
  std::string id;
  v1::Role role = v1::ROLE_UNSPECIFIED;
  std::string grpc_address;
  std::string admin_address;
  int32_t pid = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Prefill::Stub> prefill;
  std::unique_ptr<v1::Decode::Stub> decode;
  std::unique_ptr<v1::Generation::Stub> generation;
  std::atomic<int32_t> outstanding{0};  // requests the router has in flight here
  std::atomic<int64_t> routed{0};      // requests the router sent it
  std::atomic<int32_t> reserve_waiters{0};  // decode: requests waiting in its queue for KV room
  // Guarded by the registry's mutex:
  v1::LoadReport load;
  std::chrono::steady_clock::time_point last_heartbeat;
  bool draining = false;
  std::string instance_name;  // kvstores: place on the consistent-hash ring

  // The prefix-cache block hashes the replica reported (KV events), under their own
  // lock: prefix scoring reads them without the registry's mutex, so that a pick for a
  // long prompt does not hold up heartbeats, registrations and other picks. Lock order:
  // the registry's mutex, then cache_mu (never the other way).
  mutable std::shared_mutex cache_mu;
  std::unordered_set<uint64_t> cached_blocks;   // guarded by cache_mu
  std::atomic<int64_t> cached_block_count{0};   // its size, for listings

  // Calls in flight to this replica, cancelled when it is dropped for missing heartbeats
  // (a replica cut off the network never answers: its calls would hang until deadlines).
  void Track(grpc::ClientContext* ctx) {
    std::lock_guard<std::mutex> lock(calls_mu);
    if (lost) ctx->TryCancel();
    calls.insert(ctx);
  }
  void Untrack(grpc::ClientContext* ctx) {
    std::lock_guard<std::mutex> lock(calls_mu);
    calls.erase(ctx);
  }
  void MarkLost() {
    std::lock_guard<std::mutex> lock(calls_mu);
    lost = true;
    for (grpc::ClientContext* c : calls) c->TryCancel();
  }
  bool IsLost() {
    std::lock_guard<std::mutex> lock(calls_mu);
    return lost;
  }
  std::mutex calls_mu;
  std::unordered_set<grpc::ClientContext*> calls;
  bool lost = false;
};

using ReplicaPtr = std::shared_ptr<Replica>;

// Holds one unit of a replica's outstanding count while a request uses it.
class ReplicaLease {
 public:
  ReplicaLease() = default;
  explicit ReplicaLease(ReplicaPtr r) : replica_(std::move(r)) {
    if (replica_) replica_->outstanding++;
  }
  ~ReplicaLease() { Reset(); }
  ReplicaLease(ReplicaLease&& o) noexcept : replica_(std::move(o.replica_)) {}
  ReplicaLease& operator=(ReplicaLease&& o) noexcept {
    Reset();
    replica_ = std::move(o.replica_);
    return *this;
  }
  void Reset() {
    if (replica_) replica_->outstanding--;
    replica_.reset();
  }
  Replica* operator->() const { return replica_.get(); }
  const ReplicaPtr& get() const { return replica_; }
  explicit operator bool() const { return replica_ != nullptr; }

 private:
  ReplicaPtr replica_;
};

class ReplicaRegistry {
 public:
  struct Options {
    std::chrono::milliseconds heartbeat_interval{1000};
    int missed_heartbeats_to_drop = 3;
    // The registry's time (tests inject one); empty: std::chrono::steady_clock::now.
    std::function<std::chrono::steady_clock::time_point()> clock;
    uint64_t layout_fingerprint = 0;  // replicas must match (0: accept any)
    std::string model;
    // How channels to replicas are opened (the internal credentials: services/security);
    // empty: plaintext.
    security::ChannelFactory channel_factory;
  };
  explicit ReplicaRegistry(Options options);

  // Errors: FAILED_PRECONDITION (different KV layout: another model or build),
  // INVALID_ARGUMENT (no address or role).
  absl::StatusOr<std::string> Register(const v1::RegisterRequest& r);
  // False if the replica is unknown (it should register again).
  bool Heartbeat(const v1::HeartbeatRequest& r);
  void Deregister(const std::string& id);
  // Drops replicas silent for more than missed_heartbeats_to_drop intervals; returns their
  // ids. Called once per heartbeat interval. A call that comes more than two intervals after
  // the previous one means this process was starved of CPU: the replicas' heartbeats may be
  // waiting unread in its queues, so nobody is dropped until a whole drop window has passed
  // since (a live replica on a loaded host is not mistaken for a dead one).
  std::vector<std::string> DropSilent();

  // Ready replicas able to serve `role` (both-replicas serve every role), in id order.
  std::vector<ReplicaPtr> Candidates(v1::Role role) const;
  // Round-robin choice among candidates not in `exclude`; null when none.
  ReplicaPtr PickRoundRobin(v1::Role role, const std::vector<std::string>& exclude = {});
  // A replica of `role` by `policy` (routing_policy.h) for a request whose prompt's full
  // blocks hash to `block_hashes`; not one in `exclude`. Null when none is available.
  // The candidates, their load and the round-robin turn are taken under the registry's
  // mutex; prefix scoring (kCacheAware) runs after it is released, one replica's cache
  // lock at a time.
  ReplicaPtr Pick(v1::Role role, RoutingPolicy policy, std::span<const uint64_t> block_hashes,
                  const std::vector<std::string>& exclude, const RoutingWeights& weights);
  // Cached leading blocks of `block_hashes` on a replica, as the router knows them (takes
  // the replica's cache lock; call without holding it).
  int64_t PrefixOverlap(const Replica& r, std::span<const uint64_t> block_hashes) const;
  void List(v1::ListReplicasResponse* out) const;
  // The kvstore instances (ROLE_KVSTORE, not draining), for prefill replicas.
  std::vector<v1::KvStoreEndpoint> KvStores() const;
  const Options& options() const { return options_; }

 private:
  Options options_;
  mutable std::mutex mu_;
  std::map<std::string, ReplicaPtr> replicas_;
  uint64_t next_id_ = 1;
  std::map<v1::Role, uint64_t> rr_;
  std::mt19937_64 rng_{0x7a6e};
  std::optional<std::chrono::steady_clock::time_point> last_drop_check_;
  std::chrono::steady_clock::time_point no_drops_until_{};
};

// Applies a replica's prefix-cache events to the router's view of it.
void ApplyKvEvents(const v1::KvCacheEvents& events, std::unordered_set<uint64_t>* cached);

}  // namespace tandem
