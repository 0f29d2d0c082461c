#include "services/router/routed_generate.h"

#include "absl/strings/str_cat.h"
#include "engine/model/latent_kv_cache.h"
#include "engine/runtime/block_hash.h"
#include "services/api/generation_helpers.h"
#include "services/api/grpc_status.h"
#include "services/api/proto_convert.h"
#include "services/common/logging.h"
#include "spdlog/spdlog.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxPrefillAttempts = 3;
constexpr int kMaxMigrations = 3;
constexpr auto kQueueRetryInterval = std::chrono::milliseconds(20);

double MsSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

bool IsFinal(const v1::GenerateResponse& r) {
  return r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED || r.has_usage();
}

// Fire-and-forget release of a decode reservation (the replica also expires it).
void SendRelease(const ReplicaPtr& replica, const std::string& id) {
  struct Call {
    ReplicaPtr replica;
    grpc::ClientContext ctx;
    v1::ReleaseRequest req;
    v1::ReleaseResponse resp;
  };
  auto* call = new Call{replica, {}, {}, {}};
  call->req.set_request_id(id);
  call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  replica->decode->async()->Release(&call->ctx, &call->req, &call->resp, [call](grpc::Status) { delete call; });
}

}  // namespace

RoutedGenerate::RoutedGenerate(const RouterContext& rc, grpc::CallbackServerContext* ctx)
    : rc_(rc), ctx_(ctx), arrived_(Clock::now()), deadline_(ctx->deadline()) {}

RoutedGenerate* RoutedGenerate::Start(const RouterContext& rc, grpc::CallbackServerContext* ctx,
                                      const v1::GenerateRequest* request) {
  auto* r = new RoutedGenerate(rc, ctx);
  if (rc.metrics != nullptr) rc.metrics->RequestStarted();
  absl::Status st = r->Prepare(*request);
  if (!st.ok()) {
    r->Fail(ToGrpcStatus(st));
    return r;
  }
  ctx->AddInitialMetadata("x-request-id", r->id_);
  r->Route();
  return r;
}

absl::Status RoutedGenerate::Prepare(const v1::GenerateRequest& r) {
  const int64_t vocab = rc_.config->vocab_size;
  if (absl::Status s = CheckModelName(r.model(), rc_.model_name); !s.ok()) return s;
  absl::StatusOr<std::string> id = RequestIdOrNew(r.request_id());
  if (!id.ok()) return id.status();
  absl::StatusOr<std::vector<int32_t>> prompt = PromptTokens(r, *rc_.tokenizer, vocab, rc_.max_prompt_bytes);
  if (!prompt.ok()) return prompt.status();
  absl::StatusOr<SamplingParams> sampling = FromProto(r.sampling(), vocab);
  if (!sampling.ok()) return sampling.status();
  absl::StatusOr<StopParams> stop = FromProto(r.stop(), vocab);
  if (!stop.ok()) return stop.status();
  if (absl::Status s = CheckLength(prompt->size(), *stop, rc_.config->max_position_embeddings); !s.ok()) return s;
  id_ = *id;
  prompt_ = std::move(*prompt);
  block_hashes_ = HashFullBlocks(prompt_, static_cast<int32_t>(kKvBlockSize), rc_.layout_fingerprint);
  ToProto(*sampling, &sampling_);
  ToProto(*stop, &stop_);
  original_ = r;
  original_.set_request_id(id_);
  return absl::OkStatus();
}

std::unique_ptr<grpc::ClientContext> RoutedGenerate::NewClientContext() {
  auto c = std::make_unique<grpc::ClientContext>();
  if (deadline_ != std::chrono::system_clock::time_point::max()) c->set_deadline(deadline_);
  c->AddMetadata("x-request-id", id_);
  return c;
}

bool RoutedGenerate::IsActive() {
  std::lock_guard<std::mutex> lock(mu_);
  return !finished_ && !cancelled_;
}

void RoutedGenerate::Route() {
  if (!rc_.registry->Candidates(v1::ROLE_DECODE).empty() && !rc_.registry->Candidates(v1::ROLE_PREFILL).empty()) {
    if (!EnterQueue(Admission::Queue::kPrefill)) return;
    Reserve();
  } else if (!rc_.registry->Candidates(v1::ROLE_BOTH).empty()) {
    if (!EnterQueue(Admission::Queue::kPrefill)) return;
    StartAggregated();
  } else {
    Fail(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "no replicas: need prefill and decode replicas, or --role both workers, registered"));
  }
}

void RoutedGenerate::Reserve() {
  std::vector<std::string> exclude = tried_decode_;
  exclude.insert(exclude.end(), full_decode_.begin(), full_decode_.end());
  ReplicaPtr d = rc_.registry->Pick(v1::ROLE_DECODE, rc_.decode_policy, block_hashes_, exclude, rc_.weights);
  if (!d) {
    if (!full_decode_.empty()) {
      WaitAndRetry(/*for_room=*/true);  // the decode replicas that answered are full right now: wait for room
    } else if (!tried_decode_.empty()) {
      WaitAndRetry(/*for_room=*/false);  // every replica left failed this request: a replacement may register
    } else {
      Fail(grpc::Status(grpc::StatusCode::UNAVAILABLE, "no decode replica is available"));
    }
    return;
  }
  decode_ = ReplicaLease(d);
  lease_id_ = ++leases_ == 1 ? id_ : absl::StrCat(id_, "#", leases_);
  reserve_req_.set_request_id(lease_id_);
  reserve_req_.set_num_tokens(static_cast<int32_t>(prompt_.size() + resume_.size()));
  reserve_req_.set_layout_fingerprint(rc_.layout_fingerprint);
  reserve_resp_.Clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || cancelled_) return;
    reserve_ctx_ = NewClientContext();
  }
  Ref();
  d->decode->async()->Reserve(reserve_ctx_.get(), &reserve_req_, &reserve_resp_, [this](grpc::Status s) {
    OnReserved(s);
    Unref();
  });
}

void RoutedGenerate::OnReserved(const grpc::Status& s) {
  if (s.ok()) {
    lease_held_ = true;
    LeaveQueue(Admission::Queue::kDecode);
  }
  if (!IsActive()) {
    ReleaseLease();
    return;
  }
  if (s.ok()) {
    Prefill();
    return;
  }
  if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
    full_decode_.push_back(decode_->id);
    decode_.Reset();
    Reserve();
    return;
  }
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    tried_decode_.push_back(decode_->id);  // gone: not again for this request
    decode_.Reset();
    Reserve();
    return;
  }
  Fail(s);
}

void RoutedGenerate::WaitAndRetry(bool for_room) {
  const auto now = std::chrono::system_clock::now();
  const auto limit = deadline_ != std::chrono::system_clock::time_point::max()
                         ? deadline_
                         : now + rc_.max_queue_wait - std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                                          Clock::now() - arrived_);
  if (now + kQueueRetryInterval >= limit) {
    Fail(for_room ? grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                 "no decode replica had KV cache room for the request in time; retry later")
                  : grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "no decode replica is available: those left failed this request"));
    return;
  }
  if (!in_decode_queue_ && !EnterQueue(Admission::Queue::kDecode)) return;
  full_decode_.clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || cancelled_) return;
    alarm_ = std::make_unique<grpc::Alarm>();
  }
  Ref();
  alarm_->Set(now + kQueueRetryInterval, [this](bool ok) {
    if (ok && IsActive()) Reserve();
    Unref();
  });
}

void RoutedGenerate::Prefill() {
  ReplicaPtr p = rc_.registry->Pick(v1::ROLE_PREFILL, rc_.prefill_policy, block_hashes_, tried_prefill_, rc_.weights);
  if (!p) {
    ReleaseLease();
    Fail(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      tried_prefill_.empty() ? "no prefill replica is available" : "prefill failed on every replica"));
    return;
  }
  ++prefill_attempts_;
  prefill_ = ReplicaLease(p);
  prefill_req_.Clear();
  prefill_req_.set_request_id(lease_id_);
  for (int32_t t : prompt_) prefill_req_.add_prompt(t);
  *prefill_req_.mutable_sampling() = sampling_;
  *prefill_req_.mutable_stop() = stop_;
  *prefill_req_.mutable_destination() = reserve_resp_.destination();
  for (int32_t t : resume_) prefill_req_.add_resume_tokens(t);
  prefill_resp_.Clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || cancelled_) return;
    prefill_ctx_ = NewClientContext();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    prefill_in_flight_ = true;
  }
  Ref();
  p->Track(prefill_ctx_.get());
  p->prefill->async()->Prefill(prefill_ctx_.get(), &prefill_req_, &prefill_resp_, [this, p](grpc::Status s) {
    p->Untrack(prefill_ctx_.get());
    if (s.error_code() == grpc::StatusCode::CANCELLED && p->IsLost()) {
      s = grpc::Status(grpc::StatusCode::UNAVAILABLE, "prefill replica " + p->id + " stopped heartbeating");
      prefill_lost_ = true;
    }
    OnPrefilled(s);
    Unref();
  });
}

void RoutedGenerate::OnPrefilled(const grpc::Status& s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    prefill_in_flight_ = false;
    // Cancelled here, the prefill replica may still be finishing writes into the
    // reserved blocks: leave them to the lease's expiry rather than free them under it.
    if (s.error_code() == grpc::StatusCode::CANCELLED) lease_held_ = false;
  }
  if (!IsActive()) {
    ReleaseLease();
    return;
  }
  if (!s.ok()) {
    const bool retry = prefill_attempts_ < kMaxPrefillAttempts;
    if (retry && s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      tried_prefill_.push_back(prefill_->id);
      prefill_.Reset();
      if (prefill_lost_) {
        // Cut off, not dead: it may still write into the reservation when it comes back.
        // Abandon that lease (it expires) and take a fresh one.
        prefill_lost_ = false;
        lease_held_ = false;
        decode_.Reset();
        Reserve();
        return;
      }
      // The prefill replica is gone: the same reservation serves another one.
      Prefill();
      return;
    }
    if (retry && s.error_code() == grpc::StatusCode::ABORTED) {
      // The transfer failed: start over with a fresh lease (possibly on the same replica).
      ReleaseLease();
      decode_.Reset();
      Reserve();
      return;
    }
    ReleaseLease();
    Fail(s.error_code() == grpc::StatusCode::ABORTED
             ? grpc::Status(grpc::StatusCode::ABORTED,
                            absl::StrCat("KV transfer failed ", prefill_attempts_, " times: ", s.error_message()))
             : s);
    return;
  }
  prefill_.Reset();
  prefill_done_ = true;
  LeaveQueue(Admission::Queue::kPrefill);
  const bool migrated = migrations_ > 0;
  if (!migrated) first_token_at_ = Clock::now();
  v1::GenerateResponse first;
  if (!migrated) first.set_request_id(id_);
  if (prefill_resp_.first_token() >= 0) first.add_token_ids(prefill_resp_.first_token());
  first.set_text(prefill_resp_.text());
  *first.mutable_logprobs() = prefill_resp_.logprobs();
  if (prefill_resp_.finished()) {
    first.set_finish_reason(prefill_resp_.finish_reason());
    first.set_matched_stop(prefill_resp_.matched_stop());
    v1::Usage usage;
    usage.set_completion_tokens(1);
    FillFinal(&first, &usage);
    ReleaseLease();
    Send(std::move(first), /*final=*/true);
    return;
  }
  Send(std::move(first), /*final=*/false);
  StartDecode();
}

void RoutedGenerate::StartDecode() {
  decode_req_.Clear();
  decode_req_.set_request_id(lease_id_);
  for (int32_t t : prompt_) decode_req_.add_prompt(t);
  decode_req_.set_first_token(prefill_resp_.first_token());
  *decode_req_.mutable_sampling() = sampling_;
  *decode_req_.mutable_stop() = stop_;
  decode_req_.set_kv_bytes(prefill_resp_.kv_bytes());
  decode_req_.set_kv_checksum(prefill_resp_.kv_checksum());
  decode_req_.set_kv_path(prefill_resp_.kv_path());
  for (int32_t t : resume_) decode_req_.add_resume_tokens(t);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || cancelled_) return;
    stream_ctx_ = NewClientContext();
    reader_ = std::make_unique<Reader>(this);
    lease_held_ = false;  // the Decode call consumes it
  }
  Ref();
  decode_->Track(stream_ctx_.get());
  decode_->decode->async()->Decode(stream_ctx_.get(), &decode_req_, reader_.get());
  reader_->StartRead(&reader_->message);
  reader_->StartCall();
}

void RoutedGenerate::StartAggregated() {
  ReplicaPtr w = rc_.registry->Pick(v1::ROLE_BOTH, rc_.prefill_policy, block_hashes_, {}, rc_.weights);
  if (!w) {
    Fail(grpc::Status(grpc::StatusCode::UNAVAILABLE, "no worker is available"));
    return;
  }
  decode_ = ReplicaLease(w);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || cancelled_) return;
    stream_ctx_ = NewClientContext();
    reader_ = std::make_unique<Reader>(this);
  }
  Ref();
  w->Track(stream_ctx_.get());
  w->generation->async()->Generate(stream_ctx_.get(), &original_, reader_.get());
  reader_->StartRead(&reader_->message);
  reader_->StartCall();
}

void RoutedGenerate::Reader::OnReadDone(bool ok) {
  if (ok) parent_->OnReaderMessage();
}

void RoutedGenerate::Reader::OnDone(const grpc::Status& s) {
  RoutedGenerate* p = parent_;
  p->OnReaderDone(s);
  p->Unref();
}

void RoutedGenerate::OnReaderMessage() {
  v1::GenerateResponse msg = std::move(reader_->message);
  reader_->message.Clear();
  const bool final = IsFinal(msg);
  if (!sent_first_) {
    // Aggregated path: the worker's first message is the first token.
    first_token_at_ = Clock::now();
    LeaveQueue(Admission::Queue::kPrefill);
  }
  if (final) {
    const v1::Usage usage = msg.usage();
    FillFinal(&msg, &usage);
    std::lock_guard<std::mutex> lock(mu_);
    final_seen_ = true;
  }
  if (sent_first_) msg.clear_request_id();
  bool read_more = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!final) {
      // Keep reading while the client keeps up; otherwise resume after a write completes.
      if (pending_writes_.size() < 4) read_more = true;
      else reader_waiting_for_write_ = true;
    }
  }
  Send(std::move(msg), final);
  if (read_more) reader_->StartRead(&reader_->message);
}

void RoutedGenerate::OnReaderDone(const grpc::Status& status) {
  grpc::Status s = status;
  if (decode_) {
    decode_->Untrack(stream_ctx_.get());
    if (s.error_code() == grpc::StatusCode::CANCELLED && decode_->IsLost() && IsActive()) {
      s = grpc::Status(grpc::StatusCode::UNAVAILABLE, "replica " + decode_->id + " stopped heartbeating");
    }
  }
  if (!s.ok()) {
    if (!Migrate(s)) {
      decode_.Reset();
      Fail(s);
    }
    return;
  }
  decode_.Reset();
  bool final_seen;
  {
    std::lock_guard<std::mutex> lock(mu_);
    final_seen = final_seen_;
  }
  if (!final_seen) Fail(grpc::Status(grpc::StatusCode::INTERNAL, "the replica's stream ended without a final message"));
}

bool RoutedGenerate::Migrate(const grpc::Status& why) {
  const grpc::StatusCode c = why.error_code();
  const bool retryable = c == grpc::StatusCode::UNAVAILABLE || c == grpc::StatusCode::ABORTED ||
                         c == grpc::StatusCode::FAILED_PRECONDITION || c == grpc::StatusCode::INTERNAL ||
                         c == grpc::StatusCode::UNKNOWN;
  if (!retryable || !reserve_resp_.has_destination() || migrations_ >= kMaxMigrations || !IsActive()) return false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (final_seen_) return false;
    resume_ = sent_tokens_;
    ++migrations_;
  }
  spdlog::warn("{}decode replica {} failed ({}); migrating after {} tokens", service::RequestLogPrefix(id_),
               decode_ ? decode_->id : std::string("?"), why.error_message(), resume_.size());
  // Only a replica that is gone is not asked again; one that lost the lease (it expired
  // while the re-prefill queued) or the KV (a failed transfer) may take the request again.
  if (decode_ && (c == grpc::StatusCode::UNAVAILABLE || decode_->IsLost())) tried_decode_.push_back(decode_->id);
  decode_.Reset();
  lease_held_ = false;
  prefill_attempts_ = 0;
  tried_prefill_.clear();
  Reserve();
  return true;
}

void RoutedGenerate::FillFinal(v1::GenerateResponse* r, const v1::Usage* downstream_usage) {
  const bool disaggregated = reserve_resp_.has_destination();
  v1::Usage* u = r->mutable_usage();
  u->set_prompt_tokens(static_cast<int32_t>(prompt_.size()));
  u->set_completion_tokens(downstream_usage != nullptr ? downstream_usage->completion_tokens() : 1);
  u->set_cached_prompt_tokens(disaggregated ? prefill_resp_.cached_prompt_tokens()
                                            : (downstream_usage ? downstream_usage->cached_prompt_tokens() : 0));
  completion_tokens_ = u->completion_tokens();
  cached_tokens_ = u->cached_prompt_tokens();
  v1::Timing* t = r->mutable_timing();
  if (disaggregated) {
    t->set_queue_ms(prefill_resp_.queue_ms());
    t->set_prefill_ms(prefill_resp_.prefill_ms());
    t->set_transfer_ms(prefill_resp_.transfer_ms());
  }
  t->set_ttft_ms(std::chrono::duration<double, std::milli>(first_token_at_ - arrived_).count());
  t->set_e2e_ms(MsSince(arrived_));
}

void RoutedGenerate::Send(v1::GenerateResponse r, bool final) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    sent_first_ = true;
    sent_tokens_.insert(sent_tokens_.end(), r.token_ids().begin(), r.token_ids().end());
    pending_writes_.emplace_back(std::move(r), final);
  }
  PumpWrites();
}

void RoutedGenerate::PumpWrites() {
  bool final = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (writing_ || finished_ || pending_writes_.empty()) return;
    in_flight_ = std::move(pending_writes_.front().first);
    final = pending_writes_.front().second;
    pending_writes_.pop_front();
    writing_ = true;
    if (final) finished_ = true;
  }
  if (rc_.metrics != nullptr && in_flight_.token_ids_size() > 0) {
    const auto now = Clock::now();
    if (last_write_ != Clock::time_point()) {
      rc_.metrics->InterTokenLatency(std::chrono::duration<double>(now - last_write_).count());
    }
    last_write_ = now;
  }
  if (final) StartWriteAndFinish(&in_flight_, grpc::WriteOptions(), grpc::Status::OK);
  else StartWrite(&in_flight_);
}

void RoutedGenerate::OnWriteDone(bool ok) {
  bool resume_read = false, fail = false;
  std::optional<grpc::Status> deferred;
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    deferred.swap(deferred_finish_);
    if (!deferred && finished_) return;  // StartWriteAndFinish: nothing follows
    if (!ok) {
      fail = true;
    } else if (reader_waiting_for_write_ && pending_writes_.size() < 4) {
      reader_waiting_for_write_ = false;
      resume_read = true;
    }
  }
  if (deferred) {
    Finish(*deferred);  // Fail() ran while this write was in flight
    return;
  }
  if (fail) {
    Fail(grpc::Status(grpc::StatusCode::CANCELLED, "client stream closed"));
    return;
  }
  if (resume_read) reader_->StartRead(&reader_->message);
  PumpWrites();
}

void RoutedGenerate::Fail(const grpc::Status& s) {
  bool finish_now = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
    final_code_ = s.error_code();
    final_message_ = s.error_message();
    pending_writes_.clear();
    for (auto* c : {reserve_ctx_.get(), prefill_ctx_.get(), stream_ctx_.get()}) {
      if (c != nullptr) c->TryCancel();
    }
    if (alarm_) alarm_->Cancel();
    // Finish must not overlap a write: with one in flight, OnWriteDone finishes.
    if (writing_) deferred_finish_ = s;
    else finish_now = true;
  }
  ReleaseLease();
  LeaveQueue(Admission::Queue::kPrefill);
  LeaveQueue(Admission::Queue::kDecode);
  if (finish_now) Finish(s);
}

void RoutedGenerate::OnCancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
  }
  Fail(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
}

bool RoutedGenerate::EnterQueue(Admission::Queue q) {
  if (rc_.admission == nullptr) return true;
  if (!rc_.admission->TryEnter(q)) {
    ctx_->AddTrailingMetadata(Admission::kRetryPushbackKey, std::to_string(rc_.admission->retry_after().count()));
    Fail(rc_.admission->Refusal(q));
    return false;
  }
  (q == Admission::Queue::kPrefill ? in_prefill_queue_ : in_decode_queue_) = true;
  return true;
}

void RoutedGenerate::LeaveQueue(Admission::Queue q) {
  if ((q == Admission::Queue::kPrefill ? in_prefill_queue_ : in_decode_queue_).exchange(false)) {
    rc_.admission->Leave(q);
  }
}

void RoutedGenerate::ReleaseLease() {
  ReplicaPtr d;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Never while a prefill may be writing into the blocks (see OnPrefilled).
    if (!lease_held_ || !decode_ || prefill_in_flight_) return;
    lease_held_ = false;
    d = decode_.get();
  }
  SendRelease(d, lease_id_);
}

void RoutedGenerate::OnDone() {
  const double e2e = std::chrono::duration<double>(Clock::now() - arrived_).count();
  const double ttft = sent_first_ ? std::chrono::duration<double>(first_token_at_ - arrived_).count() : -1;
  const bool prefilled = prefill_done_;
  if (rc_.metrics != nullptr) {
    rc_.metrics->RequestFinished({.code = final_code_,
                                  .prompt_tokens = static_cast<int>(prompt_.size()),
                                  .completion_tokens = completion_tokens_,
                                  .cached_prompt_tokens = cached_tokens_,
                                  .ttft_s = ttft,
                                  .e2e_s = e2e,
                                  .queue_s = prefilled ? prefill_resp_.queue_ms() / 1e3 : -1,
                                  .prefill_s = prefilled ? prefill_resp_.prefill_ms() / 1e3 : -1,
                                  .transfer_s = prefilled ? prefill_resp_.transfer_ms() / 1e3 : -1});
  }
  if (final_code_ == grpc::StatusCode::OK) {
    spdlog::debug("{}done: {} prompt + {} generated tokens ({} cached), TTFT {:.1f} ms, {:.1f} ms total",
                  service::RequestLogPrefix(id_), prompt_.size(), completion_tokens_, cached_tokens_, ttft * 1e3,
                  e2e * 1e3);
  } else if (!id_.empty()) {
    spdlog::info("{}failed ({}): {}", service::RequestLogPrefix(id_), static_cast<int>(final_code_), final_message_);
  }
  Unref();
}

}  // namespace tandem
