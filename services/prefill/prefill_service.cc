#include "services/prefill/prefill_service.h"

#include <memory>
#include <mutex>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "services/api/grpc_status.h"
#include "services/api/proto_convert.h"
#include "services/common/logging.h"
#include "engine/util/status_macros.h"
#include "services/common/transfer/remote_memory_descriptor.h"
#include "services/prefill/device_kv_sink.h"
#include "services/prefill/kv_write_deadline.h"
#include "services/prefill/kv_writer_session.h"
#include "services/prefill/prefix_tier.h"
#include "services/prefill/transfer_kv_sink.h"
#include "spdlog/spdlog.h"

namespace tandem {

KvPoolGeometry KvGeometryOf(const v1::KvDestination& d) {
  return {.num_layers = d.num_layers(), .num_blocks = d.num_blocks(), .block_size = d.block_size(),
          .entry_dim = d.entry_dim(), .bytes_per_value = d.bytes_per_value()};
}

KvPool::Geometry StreamGeometryOf(const v1::KvDestination& d) {
  return {.num_layers = d.num_layers(), .block_size = d.block_size(), .num_blocks = d.num_blocks(),
          .num_sequence_slots = d.num_state_slots()};
}

absl::Status CheckDestination(const v1::KvDestination& d, const Engine& engine, int64_t num_tokens) {
  if (d.layout_fingerprint() != engine.layout_fingerprint()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "destination.layout_fingerprint: ", d.layout_fingerprint(), " differs from this replica's ",
        engine.layout_fingerprint(), " (different model or build): no KV is sent"));
  }
  // The descriptor's length bounds every put; the claimed pool must fit in it.
  absl::StatusOr<transfer::RemoteMemoryDescriptor> region =
      transfer::RemoteMemoryDescriptor::Parse(d.memory_descriptor());
  if (!region.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("destination.memory_descriptor: ", region.status().message()));
  }
  const Engine::KvMemory m = engine.kv_memory();
  if (m.entry_dim == 0) {
    const KvPool::Geometry local{.num_layers = static_cast<int32_t>(m.num_layers),
                                 .block_size = static_cast<int32_t>(m.block_size)};
    return CheckKvStreamDestination(
               {.pool = StreamGeometryOf(d),
                .block_ids = std::span<const int32_t>(d.block_ids().data(), d.block_ids().size()),
                .state_slot = d.state_slot(), .region_bytes = region->length},
               engine.kv_layout().streams, local, num_tokens)
        .status();
  }
  return CheckKvDestination({.pool = KvGeometryOf(d), .block_ids = std::span<const int32_t>(d.block_ids().data(), d.block_ids().size()), .region_bytes = region->length},
                            {.num_layers = m.num_layers, .block_size = m.block_size, .entry_dim = m.entry_dim,
                             .bytes_per_value = static_cast<int64_t>(sizeof(float))},
                            num_tokens);
}

namespace {

// Logs each distinct reason the device path was not taken once (it repeats per request).
void NoteDeviceFallback(const absl::Status& why) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  if (seen.insert(std::string(why.message())).second) {
    spdlog::warn("device-to-device KV transfer not possible ({}): using the transfer layer", std::string(why.message()));
  }
}

DeviceKvPool PoolFromProto(const v1::DeviceKvPool& p) {
  return {.host_id = p.host_id(),
          .device_uuid = p.device_uuid(),
          .ipc_handle = p.ipc_handle(),
          .bytes = p.bytes(),
          .num_blocks = p.num_blocks(),
          .bytes_per_value = p.bytes_per_value(),
          .pid = p.pid()};
}

// The sink for a request's KV: device to device when possible (and wanted), else the
// transfer layer.
absl::StatusOr<std::unique_ptr<OutgoingKvSink>> MakeSink(Engine& engine, KvTransport* transport,
                                                         KvTransferMode mode, const v1::KvDestination& d,
                                                         std::chrono::steady_clock::time_point write_deadline,
                                                         const std::shared_ptr<WriteGate>& gate) {
  if (mode != KvTransferMode::kTransfer) {
    absl::Status why;
    if (d.has_device_pool()) {
      absl::StatusOr<std::unique_ptr<PeerKvWriter>> w = engine.backend().OpenPeerKv(
          PoolFromProto(d.device_pool()), std::vector<int32_t>(d.block_ids().begin(), d.block_ids().end()));
      if (w.ok()) return std::make_unique<DeviceKvSink>(std::move(*w), d, write_deadline, gate);
      why = w.status();
    } else {
      why = absl::FailedPreconditionError(
          "the decode replica offers no device KV pool (its model is not on a GPU, or --kv-transfer transfer)");
    }
    if (mode == KvTransferMode::kCudaIpc) {
      return absl::FailedPreconditionError(absl::StrCat("--kv-transfer cuda-ipc: ", why.message()));
    }
    if (d.has_device_pool()) NoteDeviceFallback(why);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<KvWriteSession> session,
                   transport->OpenSession(d.memory_descriptor(), write_deadline));
  return std::make_unique<TransferKvSink>(std::move(session), d, write_deadline, gate);
}

// What a call needs to write as this process.
struct WriterContext {
  KvWriterRegistry* registry;
  std::shared_ptr<KvWriteNotices> notices;
  KvWriterIdentity identity;
};

class PrefillReactor : public grpc::ServerUnaryReactor {
 public:
  PrefillReactor(Engine* engine, KvTransport* transport, KvTransferMode mode,
                 const PrefillServiceImpl::OnTransfer* on_transfer, PrefixStore* prefix_store, WriterContext writer,
                 const v1::PrefillRequest* request, v1::PrefillResponse* response)
      : engine_(engine), mode_(mode), on_transfer_(on_transfer), response_(response), id_(request->request_id()),
        prefix_store_(prefix_store), writer_context_(std::move(writer)), received_(std::chrono::steady_clock::now()) {
    absl::Status st = Start(transport, *request);
    if (!st.ok()) {
      spdlog::info("{}prefill refused: {}", service::RequestLogPrefix(id_), st.ToString());
      FinishAfterWrites(ToGrpcStatus(st));
    }
  }

  void OnCancel() override {
    bool started;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      started = started_;
    }
    if (started) engine_->Cancel(id_);
  }
  void OnDone() override { delete this; }

 private:
  absl::Status Start(KvTransport* transport, const v1::PrefillRequest& r) {
    const int64_t vocab = engine_->config().vocab_size;
    if (r.request_id().empty()) return absl::InvalidArgumentError("request_id: empty");
    if (r.prompt().empty()) return absl::InvalidArgumentError("prompt: empty");
    absl::Status st = CheckDestination(r.destination(), *engine_, r.prompt_size() + r.resume_tokens_size());
    if (!st.ok()) return st;
    absl::StatusOr<SamplingParams> sampling = FromProto(r.sampling(), vocab);
    if (!sampling.ok()) return sampling.status();
    absl::StatusOr<StopParams> stop = FromProto(r.stop(), vocab);
    if (!stop.ok()) return stop.status();
    absl::StatusOr<OutputConstraint> constraint = FromProto(r.constraint());
    if (!constraint.ok()) return constraint.status();
    // Counted from now, when this replica first saw the lease (kv_write_deadline.h).
    absl::StatusOr<std::chrono::steady_clock::time_point> deadline = KvWriteDeadline(r.destination(), received_);
    if (!deadline.ok()) return deadline.status();
    // Announced first, so that the decode replica's answer overlaps everything below; from
    // here every way out ends the session (FinishAfterWrites, or its destructor).
    writer_ = std::make_unique<KvWriterSession>(writer_context_.registry, writer_context_.notices, r.destination(),
                                                writer_context_.identity);
    writer_->Begin(*deadline);
    absl::StatusOr<std::unique_ptr<OutgoingKvSink>> sink =
        MakeSink(*engine_, transport, mode_, r.destination(), *deadline, writer_->gate());
    if (!sink.ok()) return sink.status();
    sink_ = std::move(*sink);
    EngineRequest req{.id = id_, .prompt = std::vector<int32_t>(r.prompt().begin(), r.prompt().end()),
                      .sampling = *sampling, .stop = std::move(*stop), .kv_sink = sink_.get()};
    req.resume_tokens.assign(r.resume_tokens().begin(), r.resume_tokens().end());
    req.constraint = std::move(*constraint);
    if (prefix_store_ != nullptr && prefix_store_->available()) {
      // The kvstore tier first (asynchronously); the request is submitted after.
      tier_ = std::make_unique<PrefixTierSession>(prefix_store_, *engine_, req.prompt);
      tier_->set_request_id(id_);
      pending_ = std::move(req);
      tier_->Fetch([this] { SubmitAfterFetch(); });
      return absl::OkStatus();
    }
    return Submit(std::move(req));
  }

  absl::Status Submit(EngineRequest req) {
    absl::StatusOr<std::shared_ptr<OutputStream>> stream = engine_->Submit(std::move(req));
    if (!stream.ok()) return stream.status();
    bool cancelled;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stream_ = std::move(*stream);
      started_ = true;
      cancelled = cancelled_;
    }
    if (cancelled) engine_->Cancel(id_);
    // The engine pushes exactly one (final) output for a prefill-only request.
    stream_->SetListener([this] { OnOutput(); });
    OnOutput();
    return absl::OkStatus();
  }

  void SubmitAfterFetch() {
    bool cancelled;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled = cancelled_;
    }
    if (cancelled) {
      FinishAfterWrites(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      return;
    }
    spdlog::debug("{}kvstore tier: {} blocks cached here, {} stored in the tier, {} fetched in {:.1f} ms{}",
                  service::RequestLogPrefix(id_), tier_->local_blocks(), tier_->result().stored_prefix,
                  tier_->prefix() ? tier_->prefix()->blocks.size() : 0, tier_->fetch_seconds() * 1e3,
                  tier_->result().available ? "" : " (tier unavailable: computing)");
    EngineRequest req = pending_;
    req.prefix_kv = tier_->prefix();
    req.kv_sink = tier_->Wrap(sink_.get());
    absl::Status st = Submit(std::move(req));
    if (st.code() == absl::StatusCode::kInvalidArgument && tier_->prefix() != nullptr) {
      // A cache problem never fails a request: without the prefix, it is computed.
      spdlog::warn("{}prefix from the kvstore refused ({}); computing it", service::RequestLogPrefix(id_),
                   st.ToString());
      pending_.kv_sink = req.kv_sink;
      st = Submit(std::move(pending_));
    }
    if (!st.ok()) {
      spdlog::info("{}prefill refused: {}", service::RequestLogPrefix(id_), st.ToString());
      FinishAfterWrites(ToGrpcStatus(st));
    }
  }

  // Every way out once the session began: the writes have all completed (the sink
  // flushed) or none was made; the decode replica hears that they ended, then the call
  // answers.
  void FinishAfterWrites(grpc::Status s) {
    if (writer_) writer_->End();
    Finish(std::move(s));
  }

  void OnOutput() {
    std::optional<RequestOutput> out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (got_output_) return;
      out = stream_->TryNext();
      if (!out) return;
      got_output_ = true;
    }
    if (!out->status.ok()) {
      if (out->status.code() == absl::StatusCode::kCancelled) {
        spdlog::debug("{}prefill cancelled", service::RequestLogPrefix(id_));
      } else {
        spdlog::info("{}prefill failed: {}", service::RequestLogPrefix(id_), out->status.ToString());
      }
      // Writes already issued must still complete before the call ends (the sink's
      // staging memory is in use until then, and the writes must have ended before the
      // decode replica is told so).
      sink_->Flush([this, st = out->status](absl::Status) { FinishAfterWrites(ToGrpcStatus(st)); });
      return;
    }
    response_->set_first_token(out->token_ids.empty() ? -1 : out->token_ids[0]);
    response_->set_text(out->text);
    v1::GenerateResponse tmp;
    ToProto(*out, &tmp);
    *response_->mutable_logprobs() = tmp.logprobs();
    const bool finished_by_stop = out->finish_reason != FinishReason::kNone;
    response_->set_finished(finished_by_stop);
    response_->set_finish_reason(ToProto(out->finish_reason));
    if (out->matched_stop) response_->set_matched_stop(*out->matched_stop);
    response_->set_cached_prompt_tokens(out->metrics.cached_prompt_tokens);
    response_->set_queue_ms(out->metrics.queue_s * 1e3);
    response_->set_prefill_ms(out->metrics.prefill_s * 1e3);
    // The decode replica's first draft starts from it (an engine that drafts sets it).
    response_->mutable_mtp_hidden()->Assign(out->last_hidden.begin(), out->last_hidden.end());
    sink_->Flush([this](absl::Status st) {
      const bool device = sink_->path() == v1::KV_PATH_CUDA_IPC;
      if (*on_transfer_) (*on_transfer_)(sink_->transfer_seconds(), sink_->bytes(), st.ok(), device ? "cuda_ipc" : "transfer");
      if (!st.ok()) {
        spdlog::info("{}KV transfer failed: {}", service::RequestLogPrefix(id_), st.ToString());
        FinishAfterWrites(ToGrpcStatus(absl::AbortedError(absl::StrCat("KV transfer failed: ", st.message()))));
        return;
      }
      spdlog::debug("{}prefilled ({} prompt tokens cached): queue {:.1f} ms, prefill {:.1f} ms, KV {} bytes in {:.1f} ms{}",
                    service::RequestLogPrefix(id_), response_->cached_prompt_tokens(), response_->queue_ms(),
                    response_->prefill_ms(), sink_->bytes(), sink_->transfer_seconds() * 1e3,
                    device ? " (GPU to GPU)" : "");
      response_->set_transfer_ms(sink_->transfer_seconds() * 1e3);
      response_->set_kv_bytes(sink_->bytes());
      response_->set_kv_checksum(sink_->checksum());
      response_->set_kv_path(sink_->path());
      response_->set_writer_incarnation(writer_context_.identity.incarnation);
      std::unique_ptr<PrefixTierSession> tier = std::move(tier_);  // `this` may go with Finish
      FinishAfterWrites(grpc::Status::OK);
      // New full blocks to the kvstore tier, in the background, after the response.
      if (tier) tier->Offload();
    });
  }

  Engine* engine_;
  KvTransferMode mode_;
  const PrefillServiceImpl::OnTransfer* on_transfer_;
  v1::PrefillResponse* response_;
  std::string id_;
  std::unique_ptr<OutgoingKvSink> sink_;
  std::shared_ptr<OutputStream> stream_;
  PrefixStore* prefix_store_;
  WriterContext writer_context_;
  std::unique_ptr<KvWriterSession> writer_;  // from Start's announcement on
  const std::chrono::steady_clock::time_point received_;
  std::unique_ptr<PrefixTierSession> tier_;
  EngineRequest pending_;  // while the tier is asked
  std::mutex mu_;
  bool got_output_ = false;
  bool started_ = false;
  bool cancelled_ = false;
};

uint64_t NewIncarnation() {
  std::random_device random;
  uint64_t x = 0;
  while (x == 0) x = (uint64_t{random()} << 32) | random();
  return x;
}

}  // namespace

PrefillServiceImpl::PrefillServiceImpl(Engine* engine, KvTransport* transport, std::shared_ptr<KvWriteNotices> notices,
                                       OnTransfer on_transfer, KvTransferMode mode)
    : engine_(engine),
      transport_(transport),
      notices_(std::move(notices)),
      on_transfer_(std::move(on_transfer)),
      mode_(mode),
      incarnation_(NewIncarnation()) {}

void PrefillServiceImpl::SetAddress(std::string address) {
  std::lock_guard<std::mutex> lock(mu_);
  address_ = std::move(address);
}

grpc::ServerUnaryReactor* PrefillServiceImpl::Prefill(grpc::CallbackServerContext* ctx,
                                                      const v1::PrefillRequest* request,
                                                      v1::PrefillResponse* response) {
  if (!accepting_) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "this prefill replica is shutting down"));
    return reactor;
  }
  WriterContext writer{.registry = &writers_, .notices = notices_, .identity = {.incarnation = incarnation_}};
  {
    std::lock_guard<std::mutex> lock(mu_);
    writer.identity.address = address_;
  }
  return new PrefillReactor(engine_, transport_, mode_, &on_transfer_, prefix_store_, std::move(writer), request,
                            response);
}

grpc::ServerUnaryReactor* PrefillServiceImpl::WriterState(grpc::CallbackServerContext* ctx,
                                                          const v1::WriterStateRequest* request,
                                                          v1::WriterStateResponse* response) {
  response->set_incarnation(incarnation_);
  for (const v1::LeaseRef& l : request->leases()) {
    if (writers_.Holds(l.lease_id(), l.lease_token())) *response->add_writing() = l;
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem
