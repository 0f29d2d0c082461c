#include "services/decode/grpc_writer_state_client.h"

#include <memory>

#include "services/api/grpc_status.h"
#include "services/common/tcp_probe.h"
#include "tandem/v1/internal.grpc.pb.h"

namespace tandem {

void GrpcWriterStateClient::Ask(const std::string& address, const v1::WriterStateRequest& request,
                                std::function<void(absl::StatusOr<v1::WriterStateResponse>)> done) {
  struct Call {
    std::unique_ptr<v1::Prefill::Stub> stub;
    grpc::ClientContext ctx;
    v1::WriterStateRequest request;
    v1::WriterStateResponse response;
  };
  auto call = std::make_shared<Call>();
  call->stub = v1::Prefill::NewStub(channels_->Get(address));
  call->request = request;
  call->ctx.set_deadline(std::chrono::system_clock::now() + call_timeout_);
  Call* c = call.get();
  c->stub->async()->WriterState(&c->ctx, &c->request, &c->response,
                                [call, done = std::move(done)](grpc::Status s) {
                                  if (s.ok()) done(std::move(call->response));
                                  else done(FromGrpcStatus(s));
                                });
}

bool GrpcWriterStateClient::NothingListens(const std::string& address) {
  return service::ProbeTcp(address, connect_timeout_) == service::TcpProbeResult::kRefused;
}

}  // namespace tandem
