#include "services/decode/decode_service.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/api/grpc_status.h"
#include "services/api/proto_convert.h"
#include "services/worker/engine_stream_reactor.h"
#include "services/worker/kv_checksum.h"

namespace tandem {

DecodeServiceImpl::DecodeServiceImpl(Engine* engine, std::string pool_descriptor, int64_t lease_ms,
                                     std::optional<v1::DeviceKvPool> device_pool)
    : engine_(engine), pool_descriptor_(std::move(pool_descriptor)), lease_ms_(lease_ms),
      device_pool_(std::move(device_pool)) {}

std::optional<DecodeServiceImpl::Reservation> DecodeServiceImpl::Take(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reservations_.find(id);
  if (it == reservations_.end()) return std::nullopt;
  Reservation r = std::move(it->second);
  reservations_.erase(it);
  return r;
}

grpc::ServerUnaryReactor* DecodeServiceImpl::Reserve(grpc::CallbackServerContext* ctx, const v1::ReserveRequest* r,
                                                     v1::ReserveResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  if (r->layout_fingerprint() != engine_->layout_fingerprint()) {
    reactor->Finish(ToGrpcStatus(absl::FailedPreconditionError(
        absl::StrCat("layout_fingerprint: ", r->layout_fingerprint(), " differs from this replica's ",
                     engine_->layout_fingerprint()))));
    return reactor;
  }
  if (r->request_id().empty() || r->num_tokens() <= 0) {
    reactor->Finish(ToGrpcStatus(absl::InvalidArgumentError("request_id and a positive num_tokens are required")));
    return reactor;
  }
  absl::StatusOr<std::vector<int32_t>> blocks = engine_->ReserveKv(r->request_id(), r->num_tokens());
  if (!blocks.ok()) {
    reactor->Finish(ToGrpcStatus(blocks.status()));
    return reactor;
  }
  if (ctx->IsCancelled()) {
    // The router gave up waiting: nobody will use or release this reservation.
    engine_->Cancel(r->request_id());
    reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
    return reactor;
  }
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Forget reservations the engine has long since expired.
    for (auto it = reservations_.begin(); it != reservations_.end();) {
      if (now - it->second.made > std::chrono::milliseconds(4 * lease_ms_)) it = reservations_.erase(it);
      else ++it;
    }
    reservations_[r->request_id()] = {*blocks, r->num_tokens(), now};
  }
  const Engine::KvMemory m = engine_->kv_memory();
  v1::KvDestination* d = response->mutable_destination();
  d->set_layout_fingerprint(engine_->layout_fingerprint());
  d->set_memory_descriptor(pool_descriptor_);
  d->set_num_blocks(m.num_blocks);
  d->set_block_size(static_cast<int32_t>(m.block_size));
  d->set_entry_dim(static_cast<int32_t>(m.entry_dim));
  d->set_num_layers(static_cast<int32_t>(m.num_layers));
  d->set_bytes_per_value(sizeof(float));
  for (int32_t b : *blocks) d->add_block_ids(b);
  d->set_lease_id(r->request_id());
  d->set_lease_ms(lease_ms_);
  if (device_pool_) *d->mutable_device_pool() = *device_pool_;
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* DecodeServiceImpl::Release(grpc::CallbackServerContext* ctx, const v1::ReleaseRequest* r,
                                                     v1::ReleaseResponse*) {
  Take(r->request_id());
  engine_->Cancel(r->request_id());  // frees the engine's reservation
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<v1::GenerateResponse>* DecodeServiceImpl::Decode(grpc::CallbackServerContext*,
                                                                          const v1::DecodeRequest* r) {
  const int64_t vocab = engine_->config().vocab_size;
  std::optional<Reservation> res = Take(r->request_id());
  auto fail = [&](const absl::Status& s) {
    engine_->Cancel(r->request_id());
    return EngineStreamReactor::Failed(ToGrpcStatus(s));
  };
  if (!res) {
    // The router sends Decode only after the prefill call completed, so no writer is left:
    // an expired lease of this id, quarantined in the engine, can be freed now.
    engine_->ReleaseKv(r->request_id());
    return EngineStreamReactor::Failed(ToGrpcStatus(absl::FailedPreconditionError(
        absl::StrCat("no KV reservation for request '", r->request_id(), "' (expired or never made)"))));
  }
  if (r->prompt_size() + r->resume_tokens_size() != res->num_tokens) {
    return fail(absl::InvalidArgumentError(absl::StrCat("prompt + resume_tokens: ",
                                                        r->prompt_size() + r->resume_tokens_size(), " tokens but ",
                                                        res->num_tokens, " were reserved")));
  }
  // What arrived must be exactly what the prefill replica sent, in the pool it went to.
  const bool device = r->kv_path() == v1::KV_PATH_CUDA_IPC;
  if (device && !device_pool_) {
    return fail(absl::FailedPreconditionError("kv_path: CUDA IPC, but this replica offers no device KV pool"));
  }
  if (r->kv_path() != v1::KV_PATH_TRANSFER && !device) {
    return fail(absl::InvalidArgumentError(absl::StrCat("kv_path: unknown value ", r->kv_path())));
  }
  const Engine::KvMemory m = engine_->kv_memory();
  const int64_t bytes_per_value = device ? device_pool_->bytes_per_value() : 4;
  const int64_t expected_bytes = static_cast<int64_t>(res->num_tokens) * m.num_layers * m.entry_dim * bytes_per_value;
  if (r->kv_bytes() != expected_bytes) {
    return fail(absl::AbortedError(absl::StrCat("KV transfer incomplete: ", r->kv_bytes(), " bytes reported, ",
                                                expected_bytes, " expected")));
  }
  uint64_t sum = 0;
  if (device) {
    absl::StatusOr<uint64_t> s = engine_->backend().DeviceKvChecksum(res->blocks, res->num_tokens);
    if (!s.ok()) return fail(s.status());
    sum = *s;
  } else {
    sum = PoolChecksum(m.base, m.num_layers, m.num_blocks, m.block_size, m.entry_dim, res->blocks, res->num_tokens);
  }
  if (sum != r->kv_checksum()) {
    return fail(absl::AbortedError(absl::StrFormat("KV arrived corrupted: checksum %016x, the sender's %016x", sum,
                                                   r->kv_checksum())));
  }
  absl::StatusOr<SamplingParams> sampling = FromProto(r->sampling(), vocab);
  if (!sampling.ok()) return fail(sampling.status());
  absl::StatusOr<StopParams> stop = FromProto(r->stop(), vocab);
  if (!stop.ok()) return fail(stop.status());
  EngineRequest req{.id = r->request_id(), .prompt = std::vector<int32_t>(r->prompt().begin(), r->prompt().end()),
                    .sampling = *sampling, .stop = std::move(*stop)};
  req.resume_tokens.assign(r->resume_tokens().begin(), r->resume_tokens().end());
  absl::StatusOr<std::shared_ptr<OutputStream>> stream =
      engine_->SubmitImported(std::move(req), r->first_token(), /*emit_first_token=*/false,
                              device ? Engine::ImportedKv::kDevicePool : Engine::ImportedKv::kHostPool);
  if (!stream.ok()) return fail(stream.status());
  return EngineStreamReactor::Start(engine_, r->request_id(), std::move(*stream));
}

}  // namespace tandem
