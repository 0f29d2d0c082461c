#include "services/decode/decode_service.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/api/grpc_status.h"
#include "services/api/proto_convert.h"
#include "services/worker/kv_checksum.h"

namespace tandem {
namespace {

// Decode.Reserve's reactor: answered from the engine thread. A call cancelled while its
// reservation waits for room withdraws it from the engine's wait queue.
class ReserveReactor final : public grpc::ServerUnaryReactor {
 public:
  ReserveReactor(Engine* engine, std::string id) : engine_(engine), id_(std::move(id)) {}
  // From now until Disarm, a cancel withdraws the reservation from the engine.
  void Arm() { armed_ = true; }
  void Disarm() { armed_ = false; }
  void OnCancel() override {
    if (armed_.exchange(false)) engine_->Cancel(id_);
  }
  void OnDone() override { delete this; }

 private:
  Engine* engine_;
  std::string id_;
  std::atomic<bool> armed_{false};
};

// Channels to writers: a short reconnect backoff, so that a writer's new process is
// heard soon after it listens.
grpc::ChannelArguments WriterChannelArgs() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return args;
}

constexpr size_t kMaxWriterChannels = 256;

// DecodeRequest.mtp_hidden, checked before any KV is read: a drafting replica needs the
// prefill replica's hidden state (`hidden_size` values, all finite); one that does not
// draft ignores it, but never takes a non-finite one. INVALID_ARGUMENT naming the field.
absl::Status CheckMtpHidden(const v1::DecodeRequest& r, bool needed, int64_t hidden_size) {
  if (needed && r.mtp_hidden_size() != hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mtp_hidden: ", r.mtp_hidden_size(), " values, but this decode replica drafts (--speculative-tokens) and "
        "needs the prompt's last hidden state from the prefill replica (", hidden_size,
        " values): is the prefill replica running without --speculative-tokens?"));
  }
  for (int i = 0; i < r.mtp_hidden_size(); ++i) {
    if (!std::isfinite(r.mtp_hidden(i))) {
      return absl::InvalidArgumentError(absl::StrCat("mtp_hidden: value ", i, " is not finite (", r.mtp_hidden(i), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

DecodeServiceImpl::DecodeServiceImpl(Engine* engine, std::string pool_descriptor, Options o)
    : engine_(engine),
      pool_descriptor_(std::move(pool_descriptor)),
      lease_ms_(o.lease_ms),
      needs_mtp_hidden_(o.needs_mtp_hidden),
      device_pool_(std::move(o.device_pool)),
      writer_channels_(o.channel_factory, kMaxWriterChannels, WriterChannelArgs()),
      writer_state_(&writer_channels_, o.writer_call_timeout, o.writer_connect_timeout),
      prober_(&writer_state_,
              [engine](const std::string& id, uint64_t token, uint64_t incarnation, KvWriterProof proof) {
                engine->KvWriterStopped(id, token, incarnation, proof);
              },
              o.prober) {
  engine_->SetKvQuarantineListener(&prober_);
}

DecodeServiceImpl::~DecodeServiceImpl() { engine_->SetKvQuarantineListener(nullptr); }

void DecodeServiceImpl::SetAddress(std::string address) {
  std::lock_guard<std::mutex> lock(mu_);
  address_ = std::move(address);
}

std::optional<DecodeServiceImpl::Reservation> DecodeServiceImpl::Take(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reservations_.find(id);
  if (it == reservations_.end()) return std::nullopt;
  Reservation r = std::move(it->second);
  reservations_.erase(it);
  return r;
}

void DecodeServiceImpl::Remember(const std::string& id, const KvLeases::Reservation& r) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  // Forget reservations the engine has long since expired.
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    if (now - it->second.made > std::chrono::milliseconds(4 * lease_ms_)) it = reservations_.erase(it);
    else ++it;
  }
  reservations_[id] = {r.blocks, r.num_tokens, now, r.state_slot};
}

absl::StatusOr<std::vector<KvExtent>> DecodeServiceImpl::ExtentsOf(const Reservation& r) const {
  const Engine::KvMemory m = engine_->kv_memory();
  const KvPool::Geometry g{.num_layers = static_cast<int32_t>(m.num_layers),
                           .block_size = static_cast<int32_t>(m.block_size), .num_blocks = m.num_blocks,
                           .num_sequence_slots = m.num_state_slots};
  return KvPool::SequenceExtents(engine_->kv_layout().streams, g, r.blocks, r.state_slot, r.num_tokens);
}

void DecodeServiceImpl::FillDestination(const std::string& id, const KvLeases::Reservation& r,
                                        v1::KvDestination* d) {
  const Engine::KvMemory m = engine_->kv_memory();
  d->set_layout_fingerprint(engine_->layout_fingerprint());
  d->set_memory_descriptor(pool_descriptor_);
  d->set_num_blocks(m.num_blocks);
  d->set_block_size(static_cast<int32_t>(m.block_size));
  d->set_entry_dim(static_cast<int32_t>(m.entry_dim));
  d->set_num_layers(static_cast<int32_t>(m.num_layers));
  d->set_bytes_per_value(sizeof(float));
  d->set_num_state_slots(m.num_state_slots);
  d->set_state_slot(r.state_slot);
  for (int32_t b : r.blocks) d->add_block_ids(b);
  d->set_lease_id(id);
  d->set_lease_ms(lease_ms_);
  d->set_lease_token(r.token);
  {
    std::lock_guard<std::mutex> lock(mu_);
    d->set_decode_address(address_);
  }
  if (device_pool_) *d->mutable_device_pool() = *device_pool_;
}

grpc::ServerUnaryReactor* DecodeServiceImpl::Reserve(grpc::CallbackServerContext* ctx, const v1::ReserveRequest* r,
                                                     v1::ReserveResponse* response) {
  auto* reactor = new ReserveReactor(engine_, r->request_id());
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
  if (r->wait_ms() < 0) {
    reactor->Finish(ToGrpcStatus(absl::InvalidArgumentError("wait_ms: must not be negative")));
    return reactor;
  }
  const double wait_s = static_cast<double>(std::min<int64_t>(r->wait_ms(), kMaxReserveWaitMs)) / 1e3;
  if (r->has_constraint()) {
    // Compiled while the prefill runs; a bad one is refused by the Decode call, not here.
    if (absl::StatusOr<OutputConstraint> c = FromProto(r->constraint()); c.ok() && c->active()) {
      engine_->PrecompileConstraint(*std::move(c));
    }
  }
  reactor->Arm();
  // `ctx`, `r` and `response` stay valid until Finish.
  engine_->ReserveKvAsync(r->request_id(), r->num_tokens(), wait_s,
                          [this, reactor, ctx, r, response](absl::StatusOr<KvLeases::Reservation> blocks) {
                            // The engine thread: record and answer, nothing more.
                            reactor->Disarm();
                            if (!blocks.ok()) {
                              reactor->Finish(ToGrpcStatus(blocks.status()));
                              return;
                            }
                            if (ctx->IsCancelled()) {
                              // The router gave up waiting: nobody will use or release this
                              // (nor write into it: no writer could have its destination).
                              engine_->Cancel(r->request_id());
                              reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
                              return;
                            }
                            Remember(r->request_id(), *blocks);
                            FillDestination(r->request_id(), *blocks, response->mutable_destination());
                            reactor->Finish(grpc::Status::OK);
                          });
  return reactor;
}

grpc::ServerUnaryReactor* DecodeServiceImpl::Release(grpc::CallbackServerContext* ctx, const v1::ReleaseRequest* r,
                                                     v1::ReleaseResponse*) {
  Take(r->request_id());
  // The writer whose prefill answered is done; the reservation is freed unless another
  // writer may still write into it (then quarantined until proof).
  if (r->ended_writer_incarnation() != 0) engine_->ReleaseKv(r->request_id(), r->ended_writer_incarnation());
  engine_->Cancel(r->request_id());  // ends the engine's reservation (or withdraws a waiting one)
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<v1::GenerateResponse>* DecodeServiceImpl::Decode(grpc::CallbackServerContext*,
                                                                          const v1::DecodeRequest* r) {
  std::optional<Reservation> res = Take(r->request_id());
  // The router sends Decode only once the prefill call answered, after that writer's
  // writes completed: r->writer_incarnation() is done, whatever happens to this call.
  auto fail = [&](const absl::Status& s) {
    engine_->ReleaseKv(r->request_id(), r->writer_incarnation());
    return EngineStreamReactor::Failed(ToGrpcStatus(s));
  };
  if (!res) {
    // An expired lease of this id, quarantined in the engine, is freed unless another
    // writer may still write into it.
    engine_->ReleaseKv(r->request_id(), r->writer_incarnation());
    return EngineStreamReactor::Failed(ToGrpcStatus(absl::FailedPreconditionError(
        absl::StrCat("no KV reservation for request '", r->request_id(), "' (expired or never made)"))));
  }
  if (absl::Status st = CheckMtpHidden(*r, needs_mtp_hidden_, engine_->config().mtp_hidden_size()); !st.ok()) {
    return fail(st);
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
  int64_t expected_bytes = static_cast<int64_t>(res->num_tokens) * m.num_layers * m.entry_dim * bytes_per_value;
  std::vector<KvExtent> extents;  // layouts that are not one latent stream: what was written
  if (m.entry_dim == 0) {
    absl::StatusOr<std::vector<KvExtent>> e = ExtentsOf(*res);
    if (!e.ok()) return fail(e.status());
    extents = *std::move(e);
    expected_bytes = static_cast<int64_t>(KvExtentsBytes(extents));
  }
  if (r->kv_bytes() != expected_bytes) {
    return fail(absl::AbortedError(absl::StrCat("KV transfer incomplete: ", r->kv_bytes(), " bytes reported, ",
                                                expected_bytes, " expected")));
  }
  // The checksum reads every byte of the reservation: not on this thread. The request is
  // copied: the call may end (cancelled) before the worker gets to it.
  EngineStreamReactor::Handle handle;
  EngineStreamReactor* reactor = EngineStreamReactor::Pending(engine_, r->request_id(), &handle);
  auto request = std::make_shared<const v1::DecodeRequest>(*r);
  checksum_worker_.Post(
      [this, request, res = std::move(*res), extents = std::move(extents), device, handle]() mutable {
        CheckAndSubmit(std::move(request), std::move(res), extents, device, std::move(handle));
      });
  return reactor;
}

void DecodeServiceImpl::CheckAndSubmit(std::shared_ptr<const v1::DecodeRequest> r, Reservation res,
                                       std::span<const KvExtent> extents, bool device,
                                       EngineStreamReactor::Handle handle) {
  const std::string& id = r->request_id();
  auto fail = [&](const absl::Status& s) {
    engine_->ReleaseKv(id, r->writer_incarnation());
    EngineStreamReactor::Fail(handle, ToGrpcStatus(s));
  };
  const int64_t vocab = engine_->config().vocab_size;
  const Engine::KvMemory m = engine_->kv_memory();
  uint64_t sum = 0;
  if (device) {
    absl::StatusOr<uint64_t> s = m.entry_dim == 0 ? engine_->backend().DeviceRangesChecksum(extents)
                                                  : engine_->backend().DeviceKvChecksum(res.blocks, res.num_tokens);
    if (!s.ok()) return fail(s.status());
    sum = *s;
  } else if (m.entry_dim == 0) {
    sum = ExtentsChecksum(reinterpret_cast<const std::byte*>(m.base), m.num_layers, extents);
  } else {
    sum = PoolChecksum(m.base, m.num_layers, m.num_blocks, m.block_size, m.entry_dim, res.blocks, res.num_tokens);
  }
  if (sum != r->kv_checksum()) {
    return fail(absl::AbortedError(
        absl::StrFormat("KV arrived corrupted: checksum %016x, the sender's %016x", sum, r->kv_checksum())));
  }
  absl::StatusOr<SamplingParams> sampling = FromProto(r->sampling(), vocab);
  if (!sampling.ok()) return fail(sampling.status());
  absl::StatusOr<StopParams> stop = FromProto(r->stop(), vocab);
  if (!stop.ok()) return fail(stop.status());
  absl::StatusOr<OutputConstraint> constraint = FromProto(r->constraint());
  if (!constraint.ok()) return fail(constraint.status());
  EngineRequest req{.id = id, .prompt = std::vector<int32_t>(r->prompt().begin(), r->prompt().end()),
                    .sampling = *sampling, .stop = std::move(*stop)};
  req.resume_tokens.assign(r->resume_tokens().begin(), r->resume_tokens().end());
  req.kv_writer = r->writer_incarnation();
  req.constraint = std::move(*constraint);
  req.mtp_hidden.assign(r->mtp_hidden().begin(), r->mtp_hidden().end());
  engine_->SubmitImportedAsync(
      std::move(req), r->first_token(), /*emit_first_token=*/false,
      device ? Engine::ImportedKv::kDevicePool : Engine::ImportedKv::kHostPool,
      [this, id, handle](absl::StatusOr<std::shared_ptr<OutputStream>> stream) {
        // The engine thread (or this one, for a request refused at once). The engine took
        // the writer's proof (EngineRequest::kv_writer) either way.
        if (!stream.ok()) {
          engine_->Cancel(id);
          EngineStreamReactor::Fail(handle, ToGrpcStatus(stream.status()));
          return;
        }
        EngineStreamReactor::Attach(handle, std::move(*stream));
      });
}

grpc::ServerUnaryReactor* DecodeServiceImpl::BeginWrites(grpc::CallbackServerContext* ctx,
                                                         const v1::BeginWritesRequest* r, v1::BeginWritesResponse*) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (r->lease().lease_id().empty() || r->writer_address().empty() || r->writer_incarnation() == 0) {
    reactor->Finish(ToGrpcStatus(
        absl::InvalidArgumentError("lease.lease_id, writer_address and writer_incarnation are required")));
    return reactor;
  }
  // Answered at once, once the writer is recorded (or refused): the writer writes only
  // after this answer.
  engine_->BeginKvWrites(r->lease().lease_id(), r->lease().lease_token(),
                         {.address = r->writer_address(), .incarnation = r->writer_incarnation()},
                         [reactor](absl::Status s) { reactor->Finish(ToGrpcStatus(s)); });
  return reactor;
}

grpc::ServerUnaryReactor* DecodeServiceImpl::EndWrites(grpc::CallbackServerContext* ctx, const v1::EndWritesRequest* r,
                                                       v1::EndWritesResponse*) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (!r->lease().lease_id().empty() && r->writer_incarnation() != 0) {
    engine_->EndKvWrites(r->lease().lease_id(), r->lease().lease_token(), r->writer_incarnation());
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem
