#include "services/cluster/router_registration.h"

#include <grpcpp/grpcpp.h>

#include "services/api/grpc_status.h"

namespace tandem {

RouterRegistration::RouterRegistration(std::string router_address, v1::RegisterRequest self,
                                       std::function<v1::LoadReport()> load,
                                       std::function<v1::KvCacheEvents(bool full)> kv_events,
                                       const security::ChannelFactory& channel_factory)
    : router_address_(std::move(router_address)),
      self_(std::move(self)),
      load_(std::move(load)),
      kv_events_(std::move(kv_events)) {
  stub_ = v1::Cluster::NewStub(security::OpenChannel(channel_factory, router_address_));
}

RouterRegistration::~RouterRegistration() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  const std::string id = replica_id();
  if (!id.empty()) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::DeregisterRequest req;
    req.set_replica_id(id);
    v1::DeregisterResponse resp;
    stub_->Deregister(&ctx, req, &resp);
  }
}

absl::Status RouterRegistration::RegisterOnce() {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::RegisterRequest req = self_;
  *req.mutable_load() = load_();
  if (kv_events_) *req.mutable_kv_events() = kv_events_(/*full=*/true);
  v1::RegisterResponse resp;
  grpc::Status s = stub_->Register(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  {
    std::lock_guard<std::mutex> lock(mu_);
    replica_id_ = resp.replica_id();
    if (resp.heartbeat_interval_ms() > 0) interval_ = std::chrono::milliseconds(resp.heartbeat_interval_ms());
  }
  if (kvstore_listener_) kvstore_listener_({resp.kvstores().begin(), resp.kvstores().end()});
  return absl::OkStatus();
}

absl::Status RouterRegistration::Start(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  absl::Status last;
  while (std::chrono::steady_clock::now() < deadline) {
    last = RegisterOnce();
    if (last.ok()) break;
    if (last.code() == absl::StatusCode::kFailedPrecondition || last.code() == absl::StatusCode::kInvalidArgument) {
      return last;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (!last.ok()) {
    return absl::DeadlineExceededError("could not register with the router at " + router_address_ + ": " +
                                       std::string(last.message()));
  }
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void RouterRegistration::SetDraining() { draining_ = true; }

std::string RouterRegistration::replica_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return replica_id_;
}

std::chrono::milliseconds RouterRegistration::heartbeat_interval() const {
  std::lock_guard<std::mutex> lock(mu_);
  return interval_;
}

void RouterRegistration::Loop() {
  std::chrono::steady_clock::time_point next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    next = std::chrono::steady_clock::now() + interval_;
  }
  for (;;) {
    std::chrono::milliseconds interval;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_until(lock, next, [this] { return stop_; })) return;
      interval = interval_;
    }
    // Beats keep a fixed cadence from when each was sent: the time an answer took is not
    // added to the gap the router sees. An answer may take two intervals (a loaded host),
    // since a beat that arrives late still proves the replica alive.
    const auto sent = std::chrono::steady_clock::now();
    next = sent + interval;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 2 * interval);
    v1::HeartbeatRequest req;
    req.set_replica_id(replica_id());
    *req.mutable_load() = load_();
    req.set_draining(draining_);
    if (kv_events_) *req.mutable_kv_events() = kv_events_(/*full=*/false);
    v1::HeartbeatResponse resp;
    grpc::Status s = stub_->Heartbeat(&ctx, req, &resp);
    if (s.ok() && resp.known() && kvstore_listener_) {
      kvstore_listener_({resp.kvstores().begin(), resp.kvstores().end()});
    }
    if (s.ok() && !resp.known()) {
      // The router restarted and forgot us: join again (retried at the next beat).
      if (absl::Status r = RegisterOnce(); !r.ok()) continue;
    }
  }
}

}  // namespace tandem
