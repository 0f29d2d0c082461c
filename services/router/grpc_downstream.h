// The request core's world (services/api/downstream.h) over gRPC: replicas from the
// router's registry with calls on their stubs, and timers on grpc::Alarm.
#pragma once

#include <memory>

#include "services/api/downstream.h"
#include "services/router/replica_registry.h"
#include "services/router/routing_policy.h"

namespace tandem {

// A replica of the registry; holding it counts as a request in flight there.
class GrpcReplicaHandle final : public ReplicaHandle {
 public:
  explicit GrpcReplicaHandle(ReplicaPtr replica) : lease_(std::move(replica)) {}

  const std::string& id() const override { return lease_->id; }
  bool IsLost() const override { return lease_->IsLost(); }
  int WaitingHere() const override { return lease_->reserve_waiters.load(); }
  void AddWaiting(int delta) override { lease_->reserve_waiters.fetch_add(delta); }
  std::unique_ptr<PendingCall> Reserve(const CallOptions& o, const v1::ReserveRequest& r,
                                       std::function<void(absl::StatusOr<v1::ReserveResponse>)> done) override;
  void Release(const CallOptions& o, const std::string& lease_id, uint64_t ended_writer) override;
  std::unique_ptr<PendingCall> Prefill(const CallOptions& o, const v1::PrefillRequest& r,
                                       std::function<void(absl::StatusOr<v1::PrefillResponse>)> done) override;
  std::unique_ptr<DownstreamStream> Decode(const CallOptions& o, const v1::DecodeRequest& r,
                                           StreamHandlers h) override;
  std::unique_ptr<DownstreamStream> Generate(const CallOptions& o, const v1::GenerateRequest& r,
                                             StreamHandlers h) override;

 private:
  ReplicaLease lease_;
};

// Picks by the router's routing policy for each role.
class RegistryClusterView final : public ClusterView {
 public:
  RegistryClusterView(ReplicaRegistry* registry, RoutingPolicy prefill_policy, RoutingPolicy decode_policy,
                      RoutingWeights weights)
      : registry_(registry), prefill_policy_(prefill_policy), decode_policy_(decode_policy), weights_(weights) {}

  int Count(v1::Role role) override;
  std::shared_ptr<ReplicaHandle> Pick(v1::Role role, std::span<const uint64_t> block_hashes,
                                      const std::vector<std::string>& exclude) override;

 private:
  ReplicaRegistry* registry_;
  RoutingPolicy prefill_policy_, decode_policy_;
  RoutingWeights weights_;
};

// steady_clock, with timers on grpc::Alarm (their callbacks run on gRPC's threads).
class GrpcAlarmClock final : public RequestClock {
 public:
  CoreClock::time_point Now() override { return CoreClock::now(); }
  std::unique_ptr<PendingCall> At(CoreClock::time_point when, std::function<void(bool)> fire) override;
};

}  // namespace tandem
