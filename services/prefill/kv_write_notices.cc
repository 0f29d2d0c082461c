#include "services/prefill/kv_write_notices.h"

#include "services/api/grpc_status.h"
#include "tandem/v1/internal.grpc.pb.h"

namespace tandem {
namespace {

template <typename Req, typename Resp>
struct Call {
  std::unique_ptr<v1::Decode::Stub> stub;
  grpc::ClientContext ctx;
  Req request;
  Resp response;
};

std::chrono::system_clock::time_point ToSystem(std::chrono::steady_clock::time_point t) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(t - std::chrono::steady_clock::now());
}

}  // namespace

void GrpcKvWriteNotices::BeginWrites(const std::string& decode_address, const v1::BeginWritesRequest& request,
                                     std::chrono::steady_clock::time_point deadline,
                                     std::function<void(absl::Status)> done) {
  auto call = std::make_shared<Call<v1::BeginWritesRequest, v1::BeginWritesResponse>>();
  call->stub = v1::Decode::NewStub(channels_.Get(decode_address));
  call->request = request;
  call->ctx.set_deadline(ToSystem(deadline));
  auto* c = call.get();
  c->stub->async()->BeginWrites(&c->ctx, &c->request, &c->response, [call, done = std::move(done)](grpc::Status s) {
    done(FromGrpcStatus(s));
  });
}

void GrpcKvWriteNotices::EndWrites(const std::string& decode_address, const v1::EndWritesRequest& request) {
  auto call = std::make_shared<Call<v1::EndWritesRequest, v1::EndWritesResponse>>();
  call->stub = v1::Decode::NewStub(channels_.Get(decode_address));
  call->request = request;
  call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto* c = call.get();
  c->stub->async()->EndWrites(&c->ctx, &c->request, &c->response, [call](grpc::Status) {});
}

}  // namespace tandem
