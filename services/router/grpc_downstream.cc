#include "services/router/grpc_downstream.h"

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <mutex>

#include "services/api/grpc_status.h"

namespace tandem {
namespace {

std::chrono::system_clock::time_point ToSystem(CoreClock::time_point t) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(t - CoreClock::now());
}

void Configure(grpc::ClientContext* c, const CallOptions& o) {
  if (o.deadline) c->set_deadline(ToSystem(*o.deadline));
  if (!o.request_id.empty()) c->AddMetadata("x-request-id", o.request_id);
}

// One unary call: its context and messages live until the completion callback has run
// and the handle is gone, so a Cancel after completion is harmless. The replica tracks
// the context while the call is in flight (cancelled if it is dropped for silence).
template <typename Req, typename Resp>
struct UnaryCall {
  ReplicaPtr replica;
  grpc::ClientContext ctx;
  Req req;
  Resp resp;
};

template <typename Req, typename Resp>
class UnaryHandle final : public PendingCall {
 public:
  explicit UnaryHandle(std::shared_ptr<UnaryCall<Req, Resp>> call) : call_(std::move(call)) {}
  void Cancel() override { call_->ctx.TryCancel(); }

 private:
  std::shared_ptr<UnaryCall<Req, Resp>> call_;
};

template <typename Req, typename Resp, typename StartFn>
std::unique_ptr<PendingCall> StartUnary(const ReplicaPtr& replica, const CallOptions& o, const Req& r,
                                        std::function<void(absl::StatusOr<Resp>)> done, StartFn start) {
  auto call = std::make_shared<UnaryCall<Req, Resp>>();
  call->replica = replica;
  call->req = r;
  Configure(&call->ctx, o);
  replica->Track(&call->ctx);
  start(call.get(), [call, done = std::move(done)](grpc::Status s) {
    call->replica->Untrack(&call->ctx);
    if (s.ok()) done(std::move(call->resp));
    else done(FromGrpcStatus(s));
  });
  return std::make_unique<UnaryHandle<Req, Resp>>(call);
}

// A server stream read into StreamHandlers. The reactor keeps itself alive until gRPC's
// OnDone (self_), so the handle may be dropped at any time.
class StreamReactor final : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  StreamReactor(ReplicaPtr replica, StreamHandlers h) : replica_(std::move(replica)), handlers_(std::move(h)) {}

  void Start(std::shared_ptr<StreamReactor> self) {
    self_ = std::move(self);
    replica_->Track(&ctx_);
    StartCall();
  }
  void Read() { StartRead(&message_); }
  void Cancel() { ctx_.TryCancel(); }
  grpc::ClientContext* context() { return &ctx_; }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended: OnDone follows
    v1::GenerateResponse m = std::move(message_);
    message_.Clear();
    handlers_.on_message(std::move(m));
  }
  void OnDone(const grpc::Status& s) override {
    replica_->Untrack(&ctx_);
    handlers_.on_done(FromGrpcStatus(s));
    std::shared_ptr<StreamReactor> keep = std::move(self_);  // may delete this on return
  }

 private:
  ReplicaPtr replica_;
  StreamHandlers handlers_;
  grpc::ClientContext ctx_;
  v1::GenerateResponse message_;
  std::shared_ptr<StreamReactor> self_;
};

class StreamHandle final : public DownstreamStream {
 public:
  explicit StreamHandle(std::shared_ptr<StreamReactor> r) : reactor_(std::move(r)) {}
  void Read() override { reactor_->Read(); }
  void Cancel() override { reactor_->Cancel(); }

 private:
  std::shared_ptr<StreamReactor> reactor_;
};

class AlarmHandle final : public PendingCall {
 public:
  explicit AlarmHandle(std::unique_ptr<grpc::Alarm> a) : alarm_(std::move(a)) {}
  void Cancel() override { alarm_->Cancel(); }

 private:
  std::unique_ptr<grpc::Alarm> alarm_;  // destroying a set alarm cancels it
};

}  // namespace

std::unique_ptr<PendingCall> GrpcReplicaHandle::Reserve(const CallOptions& o, const v1::ReserveRequest& r,
                                                        std::function<void(absl::StatusOr<v1::ReserveResponse>)> done) {
  Replica* rep = lease_.get().get();
  return StartUnary<v1::ReserveRequest, v1::ReserveResponse>(
      lease_.get(), o, r, std::move(done), [rep](auto* call, auto cb) {
        rep->decode->async()->Reserve(&call->ctx, &call->req, &call->resp, std::move(cb));
      });
}

void GrpcReplicaHandle::Release(const CallOptions& o, const std::string& lease_id, uint64_t ended_writer) {
  struct Call {
    ReplicaPtr replica;
    grpc::ClientContext ctx;
    v1::ReleaseRequest req;
    v1::ReleaseResponse resp;
  };
  auto* call = new Call{lease_.get(), {}, {}, {}};
  call->req.set_request_id(lease_id);
  call->req.set_ended_writer_incarnation(ended_writer);
  // Its own short deadline: a release must go out even when the request's deadline passed.
  call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (!o.request_id.empty()) call->ctx.AddMetadata("x-request-id", o.request_id);
  call->replica->decode->async()->Release(&call->ctx, &call->req, &call->resp, [call](grpc::Status) { delete call; });
}

std::unique_ptr<PendingCall> GrpcReplicaHandle::Prefill(const CallOptions& o, const v1::PrefillRequest& r,
                                                        std::function<void(absl::StatusOr<v1::PrefillResponse>)> done) {
  Replica* rep = lease_.get().get();
  return StartUnary<v1::PrefillRequest, v1::PrefillResponse>(
      lease_.get(), o, r, std::move(done), [rep](auto* call, auto cb) {
        rep->prefill->async()->Prefill(&call->ctx, &call->req, &call->resp, std::move(cb));
      });
}

std::unique_ptr<DownstreamStream> GrpcReplicaHandle::Decode(const CallOptions& o, const v1::DecodeRequest& r,
                                                            StreamHandlers h) {
  auto req = std::make_shared<v1::DecodeRequest>(r);
  // The request message must outlive the call: the handlers own it until on_done.
  StreamHandlers wrapped{.on_message = std::move(h.on_message),
                         .on_done = [req, done = std::move(h.on_done)](absl::Status s) { done(std::move(s)); }};
  auto reactor = std::make_shared<StreamReactor>(lease_.get(), std::move(wrapped));
  Configure(reactor->context(), o);
  lease_->decode->async()->Decode(reactor->context(), req.get(), reactor.get());
  reactor->Start(reactor);
  return std::make_unique<StreamHandle>(reactor);
}

std::unique_ptr<DownstreamStream> GrpcReplicaHandle::Generate(const CallOptions& o, const v1::GenerateRequest& r,
                                                              StreamHandlers h) {
  auto req = std::make_shared<v1::GenerateRequest>(r);
  StreamHandlers wrapped{.on_message = std::move(h.on_message),
                         .on_done = [req, done = std::move(h.on_done)](absl::Status s) { done(std::move(s)); }};
  auto reactor = std::make_shared<StreamReactor>(lease_.get(), std::move(wrapped));
  Configure(reactor->context(), o);
  lease_->generation->async()->Generate(reactor->context(), req.get(), reactor.get());
  reactor->Start(reactor);
  return std::make_unique<StreamHandle>(reactor);
}

int RegistryClusterView::Count(v1::Role role) { return static_cast<int>(registry_->Candidates(role).size()); }

std::shared_ptr<ReplicaHandle> RegistryClusterView::Pick(v1::Role role, std::span<const uint64_t> block_hashes,
                                                         const std::vector<std::string>& exclude) {
  const RoutingPolicy policy = role == v1::ROLE_DECODE ? decode_policy_ : prefill_policy_;
  ReplicaPtr r = registry_->Pick(role, policy, block_hashes, exclude, weights_);
  if (!r) return nullptr;
  return std::make_shared<GrpcReplicaHandle>(std::move(r));
}

std::unique_ptr<PendingCall> GrpcAlarmClock::At(CoreClock::time_point when, std::function<void(bool)> fire) {
  auto alarm = std::make_unique<grpc::Alarm>();
  alarm->Set(ToSystem(when), std::move(fire));
  return std::make_unique<AlarmHandle>(std::move(alarm));
}

}  // namespace tandem
