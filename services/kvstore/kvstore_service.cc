#include "services/kvstore/kvstore_service.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include <grpcpp/impl/codegen/proto_utils.h>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "services/api/grpc_status.h"
#include "services/common/logging.h"
#include "services/common/transfer/remote_memory_descriptor.h"
#include "services/kvstore/kvstore_metrics.h"
#include "spdlog/spdlog.h"

namespace tandem::kvstore {

KvStoreServiceImpl::KvStoreServiceImpl(BlockStore* store, transfer::TransferEngine* transfer,
                                       std::string region_descriptor, KvStoreServiceOptions options)
    : store_(store),
      transfer_(transfer),
      region_descriptor_(std::move(region_descriptor)),
      options_(std::move(options)) {
  io_thread_ = std::thread([this] { IoLoop(); });
}

KvStoreServiceImpl::~KvStoreServiceImpl() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  io_thread_.join();
}

absl::Status KvStoreServiceImpl::CheckFormat(const v1::KvBlockFormat& f) const {
  if (f.layout_fingerprint() != options_.layout_fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat("format.layout_fingerprint: ", f.layout_fingerprint(),
                                                      " differs from this kvstore's ", options_.layout_fingerprint,
                                                      " (another model or build)"));
  }
  if (f.block_bytes() != store_->block_bytes()) {
    return absl::FailedPreconditionError(absl::StrCat("format.block_bytes: ", f.block_bytes(),
                                                      " differs from this kvstore's ", store_->block_bytes()));
  }
  return absl::OkStatus();
}

absl::Status KvStoreServiceImpl::CheckHashCount(int n) const {
  if (n > options_.max_hashes_per_call) {
    return absl::InvalidArgumentError(absl::StrCat("block_hashes: ", n, " hashes; at most ",
                                                   options_.max_hashes_per_call, " per call"));
  }
  return absl::OkStatus();
}

// The decorator every RPC goes through: decodes the request, times the call, counts its
// outcome, logs it with the caller's request id, encodes the response and finishes the
// reactor exactly once. Owns the request and response messages until then.
template <typename Request, typename Response>
class KvStoreServiceImpl::Call {
 public:
  // When `raw` does not decode, the call is finished at once with INVALID_ARGUMENT naming
  // the message type (decoded() is false): the handler then only returns reactor().
  // (The context's DefaultReactor() may be taken once per call: the call holds it.)
  static std::shared_ptr<Call> Start(const char* rpc, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                     grpc::ByteBuffer* out, KvStoreRpcMetrics* metrics) {
    auto call = std::shared_ptr<Call>(new Call(rpc, ctx, out, metrics));
    grpc::ByteBuffer copy(*raw);  // shares the slices; Deserialize consumes its argument
    call->decoded_ = grpc::SerializationTraits<Request>::Deserialize(&copy, &call->request).ok();
    if (!call->decoded_) {
      call->Finish(absl::InvalidArgumentError(absl::StrCat("request: not a valid ",
                                                           Request::descriptor()->full_name(), " message")));
    }
    return call;
  }
  bool decoded() const { return decoded_; }

  // `detail` describes the result for the log (called only when the line is written).
  template <typename Detail>
  void Finish(const absl::Status& st, Detail detail) {
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start_);
    if (metrics_ != nullptr) metrics_->Observe(rpc_, seconds, std::string(absl::StatusCodeToString(st.code())));
    const spdlog::level::level_enum level = st.ok() ? spdlog::level::debug : spdlog::level::info;
    if (spdlog::default_logger_raw()->should_log(level)) {
      const std::string prefix = request_id_.empty() ? std::string() : service::RequestLogPrefix(request_id_);
      if (st.ok()) {
        spdlog::log(level, "{}kvstore {}: {} in {:.2f} ms", prefix, rpc_, detail(), seconds * 1e3);
      } else {
        spdlog::log(level, "{}kvstore {} failed: {}", prefix, rpc_, st.ToString());
      }
    }
    grpc::Status status = ToGrpcStatus(st);
    if (st.ok()) {
      bool own_buffer = false;
      status = grpc::SerializationTraits<Response>::Serialize(response, out_, &own_buffer);
    }
    reactor_->Finish(status);
  }
  void Finish(const absl::Status& st) {
    Finish(st, [] { return std::string("done"); });
  }

  grpc::ServerUnaryReactor* reactor() const { return reactor_; }

  Request request;
  Response response;

 private:
  Call(const char* rpc, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* out, KvStoreRpcMetrics* metrics)
      : rpc_(rpc), reactor_(ctx->DefaultReactor()), out_(out), metrics_(metrics), start_(absl::Now()) {
    const auto& md = ctx->client_metadata();
    if (auto it = md.find("x-request-id"); it != md.end()) {
      request_id_.assign(it->second.data(), std::min<size_t>(it->second.size(), 128));
    }
  }

  const char* rpc_;
  grpc::ServerUnaryReactor* reactor_;
  grpc::ByteBuffer* out_;
  KvStoreRpcMetrics* metrics_;
  absl::Time start_;
  std::string request_id_;
  bool decoded_ = false;
};

grpc::ServerUnaryReactor* KvStoreServiceImpl::Lookup(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                                     grpc::ByteBuffer* out) {
  auto call = Call<v1::KvLookupRequest, v1::KvLookupResponse>::Start("Lookup", ctx, raw, out, options_.metrics);
  if (!call->decoded()) return call->reactor();
  const v1::KvLookupRequest* r = &call->request;
  v1::KvLookupResponse* response = &call->response;
  absl::Status st = CheckFormat(r->format());
  if (st.ok()) st = CheckHashCount(r->block_hashes_size());
  if (st.ok() && r->each()) {
    int32_t held = 0;
    for (const bool here : store_->Holds(r->format().layout_fingerprint(),
                                         std::span<const uint64_t>(r->block_hashes().data(), r->block_hashes_size()))) {
      response->add_held(here);
      held += here ? 1 : 0;
    }
    response->set_num_cached(held);
  } else if (st.ok()) {
    response->set_num_cached(store_->Lookup(r->format().layout_fingerprint(),
                                            std::span<const uint64_t>(r->block_hashes().data(), r->block_hashes_size())));
  }
  call->Finish(st, [&] { return absl::StrCat(response->num_cached(), " of ", r->block_hashes_size(), " blocks cached"); });
  return call->reactor();
}

grpc::ServerUnaryReactor* KvStoreServiceImpl::Reserve(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                                      grpc::ByteBuffer* out) {
  auto call = Call<v1::KvReserveRequest, v1::KvReserveResponse>::Start("Reserve", ctx, raw, out, options_.metrics);
  if (!call->decoded()) return call->reactor();
  const v1::KvReserveRequest* r = &call->request;
  v1::KvReserveResponse* response = &call->response;
  absl::Status st = CheckFormat(r->format());
  if (st.ok()) st = CheckHashCount(r->block_hashes_size());
  int reserved = 0;
  if (st.ok()) {
    BlockStore::Reservation res = store_->Reserve(
        r->format().layout_fingerprint(), std::span<const uint64_t>(r->block_hashes().data(), r->block_hashes_size()));
    response->set_reservation_id(res.id);
    if (!res.id.empty()) response->set_memory_descriptor(region_descriptor_);
    for (int64_t o : res.offsets) {
      response->add_offsets(o);
      reserved += o >= 0 ? 1 : 0;
    }
    response->set_lease_ms(options_.lease_ms);
  }
  call->Finish(st, [&] {
    return absl::StrCat(reserved, " of ", r->block_hashes_size(), " blocks reserved",
                        response->reservation_id().empty() ? "" : " (reservation ", response->reservation_id(),
                        response->reservation_id().empty() ? "" : ")");
  });
  return call->reactor();
}

grpc::ServerUnaryReactor* KvStoreServiceImpl::Commit(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                                     grpc::ByteBuffer* out) {
  auto call = Call<v1::KvCommitRequest, v1::KvCommitResponse>::Start("Commit", ctx, raw, out, options_.metrics);
  if (!call->decoded()) return call->reactor();
  const v1::KvCommitRequest* r = &call->request;
  v1::KvCommitResponse* response = &call->response;
  if (absl::Status st = CheckHashCount(r->block_hashes_size()); !st.ok()) {
    call->Finish(st);
    return call->reactor();
  }
  absl::StatusOr<BlockStore::CommitResult> res =
      store_->Commit(r->reservation_id(), std::span<const uint64_t>(r->block_hashes().data(), r->block_hashes_size()),
                     std::span<const uint64_t>(r->checksums().data(), r->checksums_size()));
  if (res.ok()) {
    response->set_committed(res->committed);
    response->set_rejected(res->rejected);
  }
  call->Finish(res.status(), [&] {
    return absl::StrCat("reservation ", r->reservation_id(), ": ", response->committed(), " blocks committed, ",
                        response->rejected(), " rejected");
  });
  return call->reactor();
}

grpc::ServerUnaryReactor* KvStoreServiceImpl::Get(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                                  grpc::ByteBuffer* out) {
  std::shared_ptr<GetCall> call = GetCall::Start("Get", ctx, raw, out, options_.metrics);
  if (!call->decoded()) return call->reactor();
  const v1::KvGetRequest* r = &call->request;
  absl::Status st = CheckFormat(r->format());
  if (st.ok()) st = CheckHashCount(r->block_hashes_size());
  if (st.ok() && r->offsets_size() != r->block_hashes_size()) {
    st = absl::InvalidArgumentError("offsets: one per block hash expected");
  }
  if (!st.ok()) {
    call->Finish(st);
    return call->reactor();
  }
  absl::Time deadline = absl::Now() + options_.get_timeout;
  if (const auto call_deadline = ctx->deadline(); call_deadline < std::chrono::system_clock::now() + std::chrono::hours(1)) {
    deadline = std::min(deadline, absl::FromChrono(call_deadline));  // no deadline: "infinite future"
  }
  grpc::ServerUnaryReactor* reactor = call->reactor();
  bool queued = false;
  size_t waiting = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    waiting = io_queue_.size();
    if (waiting < static_cast<size_t>(std::max(options_.max_queued_gets, 0))) {
      gets_in_flight_++;
      io_queue_.push_back([this, call, deadline] { RunGet(call, deadline); });
      queued = true;
    }
  }
  if (!queued) {
    call->Finish(absl::ResourceExhaustedError(
        absl::StrCat("kvstore busy: ", waiting, " gets are waiting for its I/O thread (the limit)")));
    return reactor;
  }
  cv_.notify_all();
  return reactor;
}

void KvStoreServiceImpl::RunGet(std::shared_ptr<GetCall> call, absl::Time deadline) {
  const v1::KvGetRequest* r = &call->request;
  v1::KvGetResponse* response = &call->response;
  if (absl::Now() >= deadline) {
    call->Finish(absl::DeadlineExceededError("KV get: its deadline passed while it waited for the I/O thread"));
    GetDone();
    return;
  }
  absl::StatusOr<transfer::RemoteMemoryDescriptor> dest = transfer::RemoteMemoryDescriptor::Parse(r->destination());
  if (!dest.ok()) {
    call->Finish(absl::InvalidArgumentError(absl::StrCat("destination: ", dest.status().message())));
    GetDone();
    return;
  }
  std::shared_ptr<BlockStore::ReadHandle> handle = store_->Read(
      r->format().layout_fingerprint(), std::span<const uint64_t>(r->block_hashes().data(), r->block_hashes_size()));
  const auto& blocks = handle->blocks();
  if (blocks.empty()) {
    response->set_num_delivered(0);
    call->Finish(absl::OkStatus(), [&] { return absl::StrCat("0 of ", r->block_hashes_size(), " blocks delivered"); });
    GetDone();
    return;
  }
  std::unique_ptr<transfer::TransferBatch> batch = transfer_->NewBatch(*dest);
  for (size_t i = 0; i < blocks.size(); ++i) {
    absl::Status st = batch->Put(blocks[i].data, static_cast<size_t>(store_->block_bytes()), r->offsets(static_cast<int>(i)));
    if (!st.ok()) {
      call->Finish(absl::InvalidArgumentError(absl::StrCat("offsets[", i, "]: ", st.message())));
      GetDone();
      return;
    }
  }
  // The handle keeps the source slots pinned until the puts are remotely complete.
  batch->Flush(deadline - absl::Now(), [this, call, handle](absl::Status st) {
    const v1::KvGetRequest* r = &call->request;
    v1::KvGetResponse* response = &call->response;
    if (st.ok()) {
      response->set_num_delivered(static_cast<int32_t>(handle->blocks().size()));
      for (const BlockStore::ReadBlock& b : handle->blocks()) response->add_checksums(b.checksum);
    }
    call->Finish(st.ok() ? st : absl::UnavailableError(absl::StrCat("KV get failed: ", st.message())), [&] {
      return absl::StrCat(response->num_delivered(), " of ", r->block_hashes_size(), " blocks delivered (",
                          static_cast<int64_t>(response->num_delivered()) * store_->block_bytes(), " bytes)");
    });
    GetDone();
  });
}

void KvStoreServiceImpl::SetInstanceName(std::string name) {
  std::lock_guard<std::mutex> lock(mu_);
  options_.instance_name = std::move(name);
}

void KvStoreServiceImpl::GetDone() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    gets_in_flight_--;
  }
  cv_.notify_all();
}

bool KvStoreServiceImpl::Drain(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [this] { return gets_in_flight_ == 0; });
}

void KvStoreServiceImpl::IoLoop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !io_queue_.empty(); });
      if (io_queue_.empty()) return;
      task = std::move(io_queue_.front());
      io_queue_.pop_front();
    }
    task();
  }
}

grpc::ServerUnaryReactor* KvStoreServiceImpl::Stats(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                                    grpc::ByteBuffer* out) {
  auto call = Call<v1::KvStatsRequest, v1::KvStatsResponse>::Start("Stats", ctx, raw, out, options_.metrics);
  if (!call->decoded()) return call->reactor();
  ToProto(store_->stats(), &call->response);
  {
    std::lock_guard<std::mutex> lock(mu_);
    call->response.set_instance_name(options_.instance_name);
  }
  call->Finish(absl::OkStatus());
  return call->reactor();
}

void ToProto(const KvStoreStats& s, v1::KvStatsResponse* out) {
  out->set_lookups(s.lookups);
  out->set_lookup_blocks(s.lookup_blocks);
  out->set_lookup_hit_blocks(s.lookup_hit_blocks);
  out->set_get_blocks(s.get_blocks);
  out->set_get_bytes(s.get_bytes);
  out->set_get_misses(s.get_misses);
  out->set_hit_tokens(s.hit_tokens);
  out->set_reserved_blocks(s.reserved_blocks);
  out->set_dedup_blocks(s.dedup_blocks);
  out->set_no_room_blocks(s.no_room_blocks);
  out->set_committed_blocks(s.committed_blocks);
  out->set_put_bytes(s.put_bytes);
  out->set_rejected_blocks(s.rejected_blocks);
  out->set_expired_reservations(s.expired_reservations);
  out->set_dram_evictions(s.dram_evictions);
  out->set_dram_blocks(s.dram_blocks);
  out->set_dram_bytes_used(s.dram_bytes_used);
  out->set_dram_capacity_bytes(s.dram_capacity_bytes);
  out->set_disk_blocks(s.disk_blocks);
  out->set_disk_bytes_used(s.disk_bytes_used);
  out->set_disk_capacity_bytes(s.disk_capacity_bytes);
  out->set_disk_writes(s.disk_writes);
  out->set_disk_write_failures(s.disk_write_failures);
  out->set_disk_reads(s.disk_reads);
  out->set_disk_evictions(s.disk_evictions);
  out->set_disk_corrupt_dropped(s.disk_corrupt_dropped);
  out->set_disk_loaded_blocks(s.disk_loaded_blocks);
}

nlohmann::json StatsJson(const KvStoreStats& s, const std::string& instance_name) {
  return {{"instance_name", instance_name},
          {"lookups", s.lookups},
          {"lookup_blocks", s.lookup_blocks},
          {"lookup_hit_blocks", s.lookup_hit_blocks},
          {"get_blocks", s.get_blocks},
          {"get_bytes", s.get_bytes},
          {"get_misses", s.get_misses},
          {"hit_tokens", s.hit_tokens},
          {"reserved_blocks", s.reserved_blocks},
          {"dedup_blocks", s.dedup_blocks},
          {"no_room_blocks", s.no_room_blocks},
          {"committed_blocks", s.committed_blocks},
          {"put_bytes", s.put_bytes},
          {"rejected_blocks", s.rejected_blocks},
          {"expired_reservations", s.expired_reservations},
          {"dram_evictions", s.dram_evictions},
          {"dram_blocks", s.dram_blocks},
          {"dram_bytes_used", s.dram_bytes_used},
          {"dram_capacity_bytes", s.dram_capacity_bytes},
          {"disk_blocks", s.disk_blocks},
          {"disk_bytes_used", s.disk_bytes_used},
          {"disk_capacity_bytes", s.disk_capacity_bytes},
          {"disk_writes", s.disk_writes},
          {"disk_write_failures", s.disk_write_failures},
          {"disk_reads", s.disk_reads},
          {"disk_evictions", s.disk_evictions},
          {"disk_corrupt_dropped", s.disk_corrupt_dropped},
          {"disk_loaded_blocks", s.disk_loaded_blocks}};
}

}  // namespace tandem::kvstore
