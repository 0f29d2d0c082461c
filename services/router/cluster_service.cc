#include "services/router/cluster_service.h"

#include "services/api/grpc_status.h"

namespace tandem {

grpc::ServerUnaryReactor* ClusterServiceImpl::Register(grpc::CallbackServerContext* ctx, const v1::RegisterRequest* r,
                                                       v1::RegisterResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  absl::StatusOr<std::string> id = registry_->Register(*r);
  if (id.ok()) {
    response->set_replica_id(*id);
    response->set_heartbeat_interval_ms(registry_->options().heartbeat_interval.count());
    for (v1::KvStoreEndpoint& e : registry_->KvStores()) *response->add_kvstores() = std::move(e);
  }
  reactor->Finish(ToGrpcStatus(id.status()));
  return reactor;
}

grpc::ServerUnaryReactor* ClusterServiceImpl::Heartbeat(grpc::CallbackServerContext* ctx, const v1::HeartbeatRequest* r,
                                                        v1::HeartbeatResponse* response) {
  response->set_known(registry_->Heartbeat(*r));
  for (v1::KvStoreEndpoint& e : registry_->KvStores()) *response->add_kvstores() = std::move(e);
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ClusterServiceImpl::Deregister(grpc::CallbackServerContext* ctx,
                                                         const v1::DeregisterRequest* r, v1::DeregisterResponse*) {
  registry_->Deregister(r->replica_id());
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ClusterServiceImpl::ListReplicas(grpc::CallbackServerContext* ctx,
                                                           const v1::ListReplicasRequest*,
                                                           v1::ListReplicasResponse* response) {
  registry_->List(response);
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem
