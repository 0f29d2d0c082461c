#include "services/api/request_core.h"

#include "absl/strings/str_cat.h"
#include "engine/model/latent_kv_cache.h"
#include "engine/runtime/block_hash.h"
#include "kernels/common/check.h"
#include "services/api/generation_helpers.h"
#include "services/api/proto_convert.h"
#include "services/common/logging.h"
#include "spdlog/spdlog.h"

namespace tandem {
namespace {

using Queue = AdmissionQueues::Queue;

double SecondsBetween(CoreClock::time_point a, CoreClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

bool IsFinal(const v1::GenerateResponse& r) {
  return r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED || r.has_usage();
}

// A call that ended this way may still be running on the replica (we stopped waiting,
// it did not necessarily stop working).
bool MayStillRun(const absl::Status& s) {
  return absl::IsCancelled(s) || absl::IsDeadlineExceeded(s);
}

}  // namespace

RequestCore::RequestCore(const RequestCoreContext& ctx, std::optional<CoreClock::time_point> deadline,
                         ResponseSink* sink)
    : ctx_(ctx), arrived_(ctx.clock->Now()), deadline_(deadline), sink_(sink) {}

std::shared_ptr<RequestCore> RequestCore::Create(const RequestCoreContext& ctx,
                                                 std::optional<CoreClock::time_point> deadline, ResponseSink* sink) {
  return std::make_shared<RequestCore>(ctx, deadline, sink);
}

void RequestCore::Start(const v1::GenerateRequest& request) {
  Post([this, r = request] {
    TANDEM_CHECK(state_ == RequestState::kQueued && id_.empty()) << "RequestCore::Start twice";
    if (absl::Status st = Prepare(r); !st.ok()) {
      Fail(st);
      return;
    }
    sink_->Begin(id_);
    if (deadline_) {
      CallStarted();
      deadline_timer_ = ctx_.clock->At(*deadline_, [self = shared_from_this()](bool fired) {
        self->Post([c = self.get(), fired] { c->OnDeadline(fired); });
      });
    }
    Route();
  });
}

void RequestCore::Post(std::function<void()> handler) {
  std::shared_ptr<RequestCore> self = shared_from_this();  // alive across the drain
  if (executor_.Enqueue(std::move(handler))) executor_.Drain();
}

void RequestCore::OnSinkReady() {
  Post([this] {
    if (!sink_full_) return;
    sink_full_ = false;
    if (state_ == RequestState::kDecoding && stream_ && !reading_) {
      reading_ = true;
      stream_->Read();
    }
  });
}

void RequestCore::OnClientGone(const absl::Status& why) {
  Post([this, why] { Fail(why); });
}

RequestState RequestCore::state() const { return visible_state_.load(); }

void RequestCore::Transition(RequestState to) {
  CheckTransition(state_, to);
  state_ = to;
  visible_state_.store(to);
}

absl::Status RequestCore::Prepare(const v1::GenerateRequest& r) {
  const int64_t vocab = ctx_.config->vocab_size;
  if (absl::Status s = CheckModelName(r.model(), ctx_.model_name); !s.ok()) return s;
  absl::StatusOr<std::string> id = RequestIdOrNew(r.request_id());
  if (!id.ok()) return id.status();
  absl::StatusOr<std::vector<int32_t>> prompt =
      PromptTokens(r, *ctx_.tokenizer, vocab, ctx_.max_prompt_bytes, ctx_.chat_templates);
  if (!prompt.ok()) return prompt.status();
  absl::StatusOr<SamplingParams> sampling = FromProto(r.sampling(), vocab);
  if (!sampling.ok()) return sampling.status();
  absl::StatusOr<StopParams> stop = FromProto(r.stop(), vocab);
  if (!stop.ok()) return stop.status();
  // Only its shape here: the workers compile it (and refuse what does not compile).
  if (absl::StatusOr<OutputConstraint> c = FromProto(r.constraint()); !c.ok()) return c.status();
  if (absl::Status s = CheckLength(prompt->size(), *stop, ctx_.config->max_position_embeddings); !s.ok()) return s;
  id_ = *id;
  prompt_ = std::move(*prompt);
  block_hashes_ = HashFullBlocks(prompt_, static_cast<int32_t>(kKvBlockSize), ctx_.layout_fingerprint);
  ToProto(*sampling, &sampling_);
  ToProto(*stop, &stop_);
  original_ = r;
  original_.set_request_id(id_);
  return absl::OkStatus();
}

CallOptions RequestCore::Options() const { return {.request_id = id_, .deadline = deadline_}; }

CoreClock::time_point RequestCore::QueueLimit() const {
  return deadline_ ? *deadline_ : arrived_ + ctx_.max_queue_wait;
}

void RequestCore::Route() {
  if (ctx_.cluster->Count(v1::ROLE_DECODE) > 0 && ctx_.cluster->Count(v1::ROLE_PREFILL) > 0) {
    if (!EnterQueue(Queue::kPrefill)) return;
    disaggregated_ = true;
    Reserve();
  } else if (ctx_.cluster->Count(v1::ROLE_BOTH) > 0) {
    if (!EnterQueue(Queue::kPrefill)) return;
    StartAggregated();
  } else {
    Fail(absl::UnavailableError(
        "no replicas: need prefill and decode replicas, or --role both workers, registered"));
  }
}

// ---- Reserve: a KV lease on a decode replica ----

void RequestCore::Reserve() {
  std::vector<std::string> exclude = tried_decode_;
  exclude.insert(exclude.end(), full_decode_.begin(), full_decode_.end());
  exclude.insert(exclude.end(), too_small_decode_.begin(), too_small_decode_.end());
  std::shared_ptr<ReplicaHandle> d = ctx_.cluster->Pick(v1::ROLE_DECODE, block_hashes_, exclude);
  if (!d) {
    if (!too_small_decode_.empty() && full_decode_.empty() && tried_decode_.empty()) {
      // Every decode replica said the request can never fit: waiting cannot help.
      Fail(absl::ResourceExhaustedError(absl::StrCat("the prompt (", prompt_.size() + resume_.size(),
                                                     " tokens) exceeds the KV capacity of every decode replica (",
                                                     too_small_message_, ")")));
    } else if (!full_decode_.empty()) {
      WaitAtReplica();  // those that answered are full right now
    } else if (!tried_decode_.empty()) {
      WaitAndRetry(/*for_room=*/false);  // every one left failed this request: a replacement may register
    } else {
      Fail(absl::UnavailableError("no decode replica is available"));
    }
    return;
  }
  // Requests already wait there: it is full, and the replica serves them first anyway.
  const bool full = d->WaitingHere() > 0;
  StartReserve(std::move(d), /*wait=*/full);
}

void RequestCore::WaitAtReplica() {
  // Wait for room in the queue of the replica the policy likes best now (with the KV-aware
  // policy: the one with the most free KV, so the first to fit), rather than polling them
  // all: one Reserve per wait. Another pick when that wait ends without room.
  std::vector<std::string> exclude = tried_decode_;
  exclude.insert(exclude.end(), too_small_decode_.begin(), too_small_decode_.end());
  std::shared_ptr<ReplicaHandle> d = ctx_.cluster->Pick(v1::ROLE_DECODE, block_hashes_, exclude);
  if (!d) {
    WaitAndRetry(/*for_room=*/true);
    return;
  }
  StartReserve(std::move(d), /*wait=*/true);
}

void RequestCore::StartReserve(std::shared_ptr<ReplicaHandle> d, bool wait) {
  int64_t wait_ms = 0;
  if (wait) {
    wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(QueueLimit() - ctx_.clock->Now()).count();
    if (wait_ms < kRetryInterval.count()) {
      Fail(absl::ResourceExhaustedError("no decode replica had KV cache room for the request in time; retry later"));
      return;
    }
    if (!in_decode_queue_ && !EnterQueue(Queue::kDecode)) return;
    Transition(RequestState::kWaitingForRoom);
    d->AddWaiting(1);
  } else {
    Transition(RequestState::kReserving);
  }
  decode_ = d;
  const std::string lease_id = ++leases_ == 1 ? id_ : absl::StrCat(id_, "#", leases_);
  v1::ReserveRequest req;
  req.set_request_id(lease_id);
  req.set_num_tokens(static_cast<int32_t>(prompt_.size() + resume_.size()));
  req.set_layout_fingerprint(ctx_.layout_fingerprint);
  req.set_wait_ms(wait_ms);
  if (original_.has_constraint()) *req.mutable_constraint() = original_.constraint();
  CallStarted();
  reserve_call_ = d->Reserve(Options(), req, [self = shared_from_this(), d, lease_id, wait](auto r) {
    self->Post([c = self.get(), d, lease_id, wait, r = std::move(r)]() mutable {
      c->OnReserved(d, lease_id, wait, std::move(r));
    });
  });
}

void RequestCore::OnReserved(const std::shared_ptr<ReplicaHandle>& d, const std::string& lease_id, bool waited,
                             absl::StatusOr<v1::ReserveResponse> r) {
  CallEnded();
  if (waited) d->AddWaiting(-1);
  if (IsTerminal(state_)) {
    // The request ended while the reservation was in flight: nobody will use it. A
    // cancelled Reserve may have reserved all the same.
    if (r.ok() || MayStillRun(r.status())) d->Release(Options(), lease_id, 0);
    MaybeDone();
    return;
  }
  TANDEM_CHECK(state_ == (waited ? RequestState::kWaitingForRoom : RequestState::kReserving)) << ToString(state_);
  reserve_call_.reset();
  if (r.ok()) {
    LeaveQueue(Queue::kDecode);
    lease_ = Lease{.replica = d, .id = lease_id, .destination = r->destination()};
    Prefill();
    return;
  }
  absl::Status s = r.status();
  // A replica dropped for missing heartbeats has its calls cancelled by the router: that
  // CANCELLED is the replica's failure, not the client's (a cut network link), so the
  // request goes on elsewhere.
  if (MayStillRun(s) && d->IsLost()) {
    s = absl::UnavailableError(absl::StrCat("decode replica ", d->id(), " stopped heartbeating"));
  }
  if (absl::IsResourceExhausted(s)) {
    decode_.reset();
    if (waited) {
      // The wait ran out (or the replica's queue was full, or it does not queue): pause,
      // then look at every replica again.
      WaitAndRetry(/*for_room=*/true);
      return;
    }
    full_decode_.push_back(d->id());
    Reserve();
    return;
  }
  if (absl::IsOutOfRange(s)) {
    // Larger than the replica's whole KV pool: never there, for this request (another
    // replica may be larger).
    too_small_decode_.push_back(d->id());
    too_small_message_ = std::string(s.message());
    decode_.reset();
    Reserve();
    return;
  }
  if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) {
    if (absl::IsDeadlineExceeded(s)) d->Release(Options(), lease_id, 0);  // it may have reserved
    tried_decode_.push_back(d->id());  // gone: not again for this request
    decode_.reset();
    Reserve();
    return;
  }
  decode_.reset();
  Fail(s);
}

void RequestCore::WaitAndRetry(bool for_room) {
  const CoreClock::time_point now = ctx_.clock->Now();
  if (now + kRetryInterval >= QueueLimit()) {
    Fail(for_room ? absl::ResourceExhaustedError(
                        "no decode replica had KV cache room for the request in time; retry later")
                  : absl::UnavailableError("no decode replica is available: those left failed this request"));
    return;
  }
  if (!in_decode_queue_ && !EnterQueue(Queue::kDecode)) return;
  Transition(RequestState::kWaitingForRoom);
  full_decode_.clear();
  CallStarted();
  wait_timer_ = ctx_.clock->At(now + kRetryInterval, [self = shared_from_this()](bool fired) {
    self->Post([c = self.get(), fired] { c->OnWaitOver(fired); });
  });
}

void RequestCore::OnWaitOver(bool fired) {
  CallEnded();
  if (IsTerminal(state_)) {
    MaybeDone();
    return;
  }
  TANDEM_CHECK(state_ == RequestState::kWaitingForRoom) << ToString(state_);
  (void)fired;  // only Fail cancels the timer, and it leaves a terminal state
  Reserve();
}

// ---- Prefill into the lease ----

void RequestCore::Prefill() {
  std::shared_ptr<ReplicaHandle> p = ctx_.cluster->Pick(v1::ROLE_PREFILL, block_hashes_, tried_prefill_);
  if (!p) {
    Fail(absl::UnavailableError(tried_prefill_.empty() ? "no prefill replica is available"
                                                       : "prefill failed on every replica"));
    return;
  }
  TANDEM_CHECK(lease_.has_value() && !lease_->prefill_writing);
  Transition(RequestState::kPrefilling);
  ++prefill_attempts_;
  prefill_ = p;
  v1::PrefillRequest req;
  req.set_request_id(lease_->id);
  for (int32_t t : prompt_) req.add_prompt(t);
  *req.mutable_sampling() = sampling_;
  *req.mutable_stop() = stop_;
  *req.mutable_destination() = lease_->destination;
  for (int32_t t : resume_) req.add_resume_tokens(t);
  if (original_.has_constraint()) *req.mutable_constraint() = original_.constraint();
  lease_->prefill_writing = true;
  CallStarted();
  prefill_call_ = p->Prefill(Options(), req, [self = shared_from_this(), p](auto r) {
    self->Post([c = self.get(), p, r = std::move(r)]() mutable { c->OnPrefilled(p, std::move(r)); });
  });
}

void RequestCore::OnPrefilled(const std::shared_ptr<ReplicaHandle>& p, absl::StatusOr<v1::PrefillResponse> r) {
  CallEnded();
  TANDEM_CHECK(lease_.has_value() && lease_->prefill_writing) << "a prefill ended without its lease";
  lease_->prefill_writing = false;
  absl::Status s = r.status();
  const bool lost = MayStillRun(s) && p->IsLost();
  if (lost) s = absl::UnavailableError(absl::StrCat("prefill replica ", p->id(), " stopped heartbeating"));
  // Whatever the answer, the lease is not written into again by this request: a retry
  // takes a fresh one. Its release carries proof only when the prefill answered OK (its
  // writes all completed first); cancelled, timed out, cut off or dead, the writer may
  // still be writing, and the decode replica keeps the blocks quarantined until it knows
  // better (kv_leases.h). The release is sent now unless the prefill's KV is used (decode)
  // or the request keeps the lease for its Decode call.
  if (!r.ok()) ReleaseLease();
  if (IsTerminal(state_)) {
    ReleaseLease(r.ok() ? r->writer_incarnation() : 0);  // the Fail that ended the request had to leave it to us
    prefill_.reset();
    MaybeDone();
    return;
  }
  TANDEM_CHECK(state_ == RequestState::kPrefilling) << ToString(state_);
  prefill_call_.reset();
  if (!s.ok()) {
    const bool retry = prefill_attempts_ < kMaxPrefillAttempts;
    if (retry && (absl::IsUnavailable(s) || absl::IsAborted(s))) {
      // The replica is gone or cut off (another one, on a fresh lease: the cut-off one may
      // still write into the old lease), or the transfer failed (a fresh lease, possibly
      // on the same replicas).
      if (absl::IsUnavailable(s)) tried_prefill_.push_back(p->id());
      prefill_.reset();
      decode_.reset();
      Reserve();
      return;
    }
    prefill_.reset();
    Fail(absl::IsAborted(s) ? absl::AbortedError(absl::StrCat("KV transfer failed ", prefill_attempts_,
                                                              " times: ", s.message()))
                            : s);
    return;
  }
  prefill_.reset();
  prefill_resp_ = std::move(*r);
  prefilled_ = true;
  LeaveQueue(Queue::kPrefill);
  v1::GenerateResponse first;
  if (!sent_first_) first.set_request_id(id_);
  if (prefill_resp_.first_token() >= 0) first.add_token_ids(prefill_resp_.first_token());
  first.set_text(prefill_resp_.text());
  *first.mutable_logprobs() = prefill_resp_.logprobs();
  if (prefill_resp_.finished()) {
    first.set_finish_reason(prefill_resp_.finish_reason());
    first.set_matched_stop(prefill_resp_.matched_stop());
    ReleaseLease(prefill_resp_.writer_incarnation());
    FinishOk(std::move(first), nullptr);
    return;
  }
  const bool more = Emit(std::move(first));
  if (!more) sink_full_ = true;
  StartDecode();
}

// ---- Decode streams ----

StreamHandlers RequestCore::Handlers() {
  std::shared_ptr<RequestCore> self = shared_from_this();
  return {.on_message = [self](v1::GenerateResponse m) {
            self->Post([c = self.get(), m = std::move(m)]() mutable { c->OnStreamMessage(std::move(m)); });
          },
          .on_done = [self](absl::Status s) {
            self->Post([c = self.get(), s = std::move(s)] { c->OnStreamDone(s); });
          }};
}

void RequestCore::StartDecode() {
  TANDEM_CHECK(lease_.has_value() && !lease_->prefill_writing);
  v1::DecodeRequest req;
  req.set_request_id(lease_->id);
  for (int32_t t : prompt_) req.add_prompt(t);
  req.set_first_token(prefill_resp_.first_token());
  *req.mutable_sampling() = sampling_;
  *req.mutable_stop() = stop_;
  req.set_kv_bytes(prefill_resp_.kv_bytes());
  req.set_kv_checksum(prefill_resp_.kv_checksum());
  req.set_kv_path(prefill_resp_.kv_path());
  req.set_writer_incarnation(prefill_resp_.writer_incarnation());
  // The prompt's (after a migration: prompt + resume tokens') last hidden state, which a
  // drafting decode replica starts from.
  *req.mutable_mtp_hidden() = prefill_resp_.mtp_hidden();
  for (int32_t t : resume_) req.add_resume_tokens(t);
  if (original_.has_constraint()) *req.mutable_constraint() = original_.constraint();
  lease_.reset();  // the Decode call consumes it (the replica frees it when the stream ends)
  Transition(RequestState::kDecoding);
  CallStarted();
  stream_ = decode_->Decode(Options(), req, Handlers());
  if (!sink_full_) {
    reading_ = true;
    stream_->Read();
  }
}

void RequestCore::StartAggregated() {
  std::shared_ptr<ReplicaHandle> w = ctx_.cluster->Pick(v1::ROLE_BOTH, block_hashes_, {});
  if (!w) {
    Fail(absl::UnavailableError("no worker is available"));
    return;
  }
  Transition(RequestState::kDecoding);
  decode_ = w;
  CallStarted();
  stream_ = w->Generate(Options(), original_, Handlers());
  reading_ = true;
  stream_->Read();
}

void RequestCore::OnStreamMessage(v1::GenerateResponse msg) {
  reading_ = false;
  if (IsTerminal(state_)) return;  // cancelled: on_done follows
  TANDEM_CHECK(state_ == RequestState::kDecoding) << ToString(state_);
  if (!sent_first_) LeaveQueue(Queue::kPrefill);  // aggregated: the worker's first message is the first token
  if (IsFinal(msg)) {
    const v1::Usage usage = msg.usage();
    FinishOk(std::move(msg), &usage);
    // Read on so that the stream's end is seen (on_done) without waiting for a cancel.
    reading_ = true;
    stream_->Read();
    return;
  }
  if (Emit(std::move(msg))) {
    reading_ = true;
    stream_->Read();
  } else {
    sink_full_ = true;
  }
}

void RequestCore::OnStreamDone(absl::Status s) {
  CallEnded();
  reading_ = false;
  if (IsTerminal(state_)) {
    decode_.reset();
    MaybeDone();
    return;
  }
  TANDEM_CHECK(state_ == RequestState::kDecoding) << ToString(state_);
  stream_.reset();
  if (MayStillRun(s) && decode_->IsLost()) {
    s = absl::UnavailableError(absl::StrCat("replica ", decode_->id(), " stopped heartbeating"));
  }
  if (s.ok()) s = absl::InternalError("the replica's stream ended without a final message");
  if (!Migrate(s)) {
    decode_.reset();
    Fail(s);
  }
}

bool RequestCore::Migrate(const absl::Status& why) {
  const bool retryable = absl::IsUnavailable(why) || absl::IsAborted(why) || absl::IsFailedPrecondition(why) ||
                         absl::IsInternal(why) || absl::IsUnknown(why);
  if (!retryable || !disaggregated_ || migrations_ >= kMaxMigrations) return false;
  resume_ = sent_tokens_;
  ++migrations_;
  spdlog::warn("{}decode replica {} failed ({}); migrating after {} tokens", service::RequestLogPrefix(id_),
               decode_->id(), std::string(why.message()), resume_.size());
  // Only a replica that is gone is not asked again; one that lost the lease (it expired
  // while the re-prefill queued) or the KV (a failed transfer) may take the request again.
  if (absl::IsUnavailable(why) || decode_->IsLost()) tried_decode_.push_back(decode_->id());
  decode_.reset();
  prefill_attempts_ = 0;
  tried_prefill_.clear();
  Reserve();
  return true;
}

void RequestCore::OnDeadline(bool fired) {
  CallEnded();
  if (fired && !IsTerminal(state_)) {
    Fail(absl::DeadlineExceededError("the request's deadline passed"));
    return;
  }
  MaybeDone();
}

// ---- Leases and queues ----

void RequestCore::ReleaseLease(uint64_t ended_writer) {
  if (!lease_ || lease_->prefill_writing) return;  // OnPrefilled releases it
  lease_->replica->Release(Options(), lease_->id, ended_writer);
  lease_.reset();
}

bool RequestCore::EnterQueue(Queue q) {
  if (ctx_.admission == nullptr) return true;
  if (!ctx_.admission->TryEnter(q)) {
    Fail(ctx_.admission->Refusal(q), ctx_.admission->retry_after());
    return false;
  }
  (q == Queue::kPrefill ? in_prefill_queue_ : in_decode_queue_) = true;
  return true;
}

void RequestCore::LeaveQueue(Queue q) {
  bool& in = q == Queue::kPrefill ? in_prefill_queue_ : in_decode_queue_;
  if (!in) return;
  in = false;
  ctx_.admission->Leave(q);
}

// ---- The client's side ----

bool RequestCore::Emit(v1::GenerateResponse msg) {
  TANDEM_CHECK(sink_ != nullptr);
  if (!sent_first_) {
    sent_first_ = true;
    first_token_at_ = ctx_.clock->Now();
  } else {
    msg.clear_request_id();
  }
  sent_tokens_.insert(sent_tokens_.end(), msg.token_ids().begin(), msg.token_ids().end());
  return sink_->Write(std::move(msg), /*final=*/false);
}

void RequestCore::FinishOk(v1::GenerateResponse msg, const v1::Usage* downstream_usage) {
  if (!sent_first_) {
    sent_first_ = true;
    first_token_at_ = ctx_.clock->Now();
  } else {
    msg.clear_request_id();
  }
  sent_tokens_.insert(sent_tokens_.end(), msg.token_ids().begin(), msg.token_ids().end());
  v1::Usage* u = msg.mutable_usage();
  u->set_prompt_tokens(static_cast<int32_t>(prompt_.size()));
  // What the client received, resumed tokens included: after a migration the decode
  // replica only counts its own.
  u->set_completion_tokens(static_cast<int32_t>(sent_tokens_.size()));
  u->set_cached_prompt_tokens(disaggregated_ ? prefill_resp_.cached_prompt_tokens()
                                             : (downstream_usage ? downstream_usage->cached_prompt_tokens() : 0));
  cached_tokens_ = u->cached_prompt_tokens();
  // draft_tokens and accepted_draft_tokens stay as the replica that decoded counted them
  // (after a migration, the last decode replica: the failed one never reported its own);
  // none when the prefill replica's first token ended the request.
  v1::Timing* t = msg.mutable_timing();
  if (disaggregated_) {
    t->set_queue_ms(prefill_resp_.queue_ms());
    t->set_prefill_ms(prefill_resp_.prefill_ms());
    t->set_transfer_ms(prefill_resp_.transfer_ms());
  }
  t->set_ttft_ms(SecondsBetween(arrived_, first_token_at_) * 1e3);
  t->set_e2e_ms(SecondsBetween(arrived_, ctx_.clock->Now()) * 1e3);
  EnterFinishing(absl::OkStatus());
  ResponseSink* sink = sink_;
  sink_ = nullptr;
  sink->Write(std::move(msg), /*final=*/true);
  MaybeDone();
}

void RequestCore::Fail(const absl::Status& s, std::optional<std::chrono::milliseconds> retry_after) {
  if (IsTerminal(state_)) return;
  TANDEM_CHECK(!s.ok());
  EnterFinishing(s);
  ResponseSink* sink = sink_;
  sink_ = nullptr;
  sink->Fail(s, retry_after);
  MaybeDone();
}

void RequestCore::EnterFinishing(const absl::Status& s) {
  Transition(RequestState::kFinishing);
  for (PendingCall* c : {reserve_call_.get(), prefill_call_.get(), wait_timer_.get(), deadline_timer_.get()}) {
    if (c != nullptr) c->Cancel();
  }
  // A stream that delivered its final message ends by itself.
  if (stream_ && !s.ok()) stream_->Cancel();
  ReleaseLease();
  LeaveQueue(Queue::kPrefill);
  LeaveQueue(Queue::kDecode);
  if (ctx_.on_finished) {
    const CoreClock::time_point now = ctx_.clock->Now();
    RequestSummary sum{.request_id = id_,
                       .status = s,
                       .prompt_tokens = static_cast<int>(prompt_.size()),
                       .completion_tokens = static_cast<int>(sent_tokens_.size()),
                       .cached_prompt_tokens = cached_tokens_,
                       .ttft_s = sent_first_ ? SecondsBetween(arrived_, first_token_at_) : -1,
                       .e2e_s = SecondsBetween(arrived_, now),
                       .migrations = migrations_};
    if (prefilled_) {
      sum.queue_s = prefill_resp_.queue_ms() / 1e3;
      sum.prefill_s = prefill_resp_.prefill_ms() / 1e3;
      sum.transfer_s = prefill_resp_.transfer_ms() / 1e3;
    }
    ctx_.on_finished(sum);
  }
}

void RequestCore::CallEnded() {
  TANDEM_CHECK_GE(outstanding_, 1) << "a completion with no call in flight";
  --outstanding_;
}

void RequestCore::MaybeDone() {
  if (state_ != RequestState::kFinishing || outstanding_ > 0) return;
  TANDEM_CHECK(!lease_.has_value()) << "request " << id_ << " done with its lease " << lease_->id << " held";
  Transition(RequestState::kDone);
  // Drop the handles (and their replicas' outstanding counts) now, not with the last
  // reference.
  reserve_call_.reset();
  prefill_call_.reset();
  wait_timer_.reset();
  deadline_timer_.reset();
  stream_.reset();
  decode_.reset();
  prefill_.reset();
}

}  // namespace tandem
