// tandem.v1.Cluster on the router: registration, heartbeats with load reports,
// deregistration, and the cluster listing `tandem status` prints.
#pragma once

#include "services/router/replica_registry.h"
#include "tandem/v1/internal.grpc.pb.h"

namespace tandem {

class ClusterServiceImpl final : public v1::Cluster::CallbackService {
 public:
  explicit ClusterServiceImpl(ReplicaRegistry* registry) : registry_(registry) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx, const v1::RegisterRequest* request,
                                     v1::RegisterResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx, const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* Deregister(grpc::CallbackServerContext* ctx, const v1::DeregisterRequest* request,
                                       v1::DeregisterResponse* response) override;
  grpc::ServerUnaryReactor* ListReplicas(grpc::CallbackServerContext* ctx, const v1::ListReplicasRequest* request,
                                         v1::ListReplicasResponse* response) override;

 private:
  ReplicaRegistry* registry_;
};

}  // namespace tandem
