#include "services/router/grpc_generate_reactor.h"

#include "services/api/grpc_status.h"
#include "services/common/logging.h"
#include "services/router/grpc_downstream.h"
#include "spdlog/spdlog.h"

namespace tandem {

RouterCore::RouterCore(const RouterContext& rc)
    : cluster_(std::make_unique<RegistryClusterView>(rc.registry, rc.prefill_policy, rc.decode_policy, rc.weights)),
      clock_(std::make_unique<GrpcAlarmClock>()),
      metrics_(rc.metrics) {
  core_ = RequestCoreContext{.cluster = cluster_.get(),
                             .clock = clock_.get(),
                             .tokenizer = rc.tokenizer,
                             .chat_templates = rc.chat_templates,
                             .config = rc.config,
                             .model_name = rc.model_name,
                             .layout_fingerprint = rc.layout_fingerprint,
                             .max_queue_wait = rc.max_queue_wait,
                             .admission = rc.admission,
                             .max_prompt_bytes = rc.max_prompt_bytes};
  RouterMetrics* metrics = rc.metrics;
  core_.on_finished = [metrics](const RequestSummary& s) {
    if (metrics != nullptr) {
      metrics->RequestFinished({.code = static_cast<grpc::StatusCode>(s.status.code()),
                                .prompt_tokens = s.prompt_tokens,
                                .completion_tokens = s.completion_tokens,
                                .cached_prompt_tokens = s.cached_prompt_tokens,
                                .ttft_s = s.ttft_s,
                                .e2e_s = s.e2e_s,
                                .queue_s = s.queue_s,
                                .prefill_s = s.prefill_s,
                                .transfer_s = s.transfer_s});
    }
    if (s.status.ok()) {
      spdlog::debug("{}done: {} prompt + {} generated tokens ({} cached), TTFT {:.1f} ms, {:.1f} ms total",
                    service::RequestLogPrefix(s.request_id), s.prompt_tokens, s.completion_tokens,
                    s.cached_prompt_tokens, s.ttft_s * 1e3, s.e2e_s * 1e3);
    } else if (!s.request_id.empty()) {
      spdlog::info("{}failed ({}): {}", service::RequestLogPrefix(s.request_id), static_cast<int>(s.status.code()),
                   std::string(s.status.message()));
    }
  };
}

GrpcGenerateReactor* GrpcGenerateReactor::Start(const RouterCore& core, grpc::CallbackServerContext* ctx,
                                                const v1::GenerateRequest* request) {
  auto* r = new GrpcGenerateReactor(ctx, core.metrics());
  if (r->metrics_ != nullptr) r->metrics_->RequestStarted();
  std::optional<CoreClock::time_point> deadline;
  if (ctx->deadline() != std::chrono::system_clock::time_point::max()) {
    deadline = CoreClock::now() + std::chrono::duration_cast<CoreClock::duration>(ctx->deadline() -
                                                                                  std::chrono::system_clock::now());
  }
  // Set before the core starts: its first write may complete (OnWriteDone) at once.
  r->core_ = RequestCore::Create(core.context(), deadline, r);
  std::shared_ptr<RequestCore> c = r->core_;
  c->Start(*request);
  return r;
}

void GrpcGenerateReactor::Begin(const std::string& request_id) {
  // Before the first write (the core calls Begin first, on its executor).
  ctx_->AddInitialMetadata("x-request-id", request_id);
}

bool GrpcGenerateReactor::Write(v1::GenerateResponse message, bool final) {
  Next next;
  bool more;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || finish_) return false;  // the client is gone; the core will hear it
    queue_.push_back(std::move(message));
    final_queued_ = final;
    more = queue_.size() < kMaxQueued;
    if (!more) told_full_ = true;
    next = NextLocked();
  }
  Run(next);
  return more;
}

void GrpcGenerateReactor::Fail(const absl::Status& status, std::optional<std::chrono::milliseconds> retry_after) {
  Next next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    queue_.clear();
    final_queued_ = false;
    if (retry_after) {
      ctx_->AddTrailingMetadata(Admission::kRetryPushbackKey, std::to_string(retry_after->count()));
    }
    finish_ = ToGrpcStatus(status);
    next = NextLocked();
  }
  Run(next);
}

GrpcGenerateReactor::Next GrpcGenerateReactor::NextLocked() {
  if (writing_ || finished_) return Next::kNothing;
  if (!queue_.empty()) {
    in_flight_ = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    if (metrics_ != nullptr && in_flight_.token_ids_size() > 0) {
      const auto now = std::chrono::steady_clock::now();
      if (last_write_ != std::chrono::steady_clock::time_point()) {
        metrics_->InterTokenLatency(std::chrono::duration<double>(now - last_write_).count());
      }
      last_write_ = now;
    }
    if (queue_.empty() && final_queued_) {
      finished_ = true;
      return Next::kWriteAndFinish;
    }
    return Next::kWrite;
  }
  if (finish_) {
    finished_ = true;
    return Next::kFinish;
  }
  return Next::kNothing;
}

void GrpcGenerateReactor::Run(Next next) {
  switch (next) {
    case Next::kNothing:
      return;
    case Next::kWrite:
      StartWrite(&in_flight_);
      return;
    case Next::kWriteAndFinish:
      StartWriteAndFinish(&in_flight_, grpc::WriteOptions(), grpc::Status::OK);
      return;
    case Next::kFinish: {
      grpc::Status s = *finish_;  // OnDone may delete this once Finish is called
      Finish(s);
      return;
    }
  }
}

void GrpcGenerateReactor::OnWriteDone(bool ok) {
  Next next = Next::kNothing;
  bool gone = false, ready = false;
  std::shared_ptr<RequestCore> core;
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (finished_ && !finish_) return;  // StartWriteAndFinish: nothing follows
    core = core_;
    if (!ok) {
      // The client stream closed: the core fails the request (and then Fail finishes).
      queue_.clear();
      final_queued_ = false;
      gone = !finish_;
    } else if (told_full_ && queue_.size() < kMaxQueued) {
      told_full_ = false;
      ready = true;
    }
    next = NextLocked();
  }
  if (gone) core->OnClientGone(absl::CancelledError("client stream closed"));
  if (ready) core->OnSinkReady();
  Run(next);
}

void GrpcGenerateReactor::OnCancel() {
  std::shared_ptr<RequestCore> core;
  {
    std::lock_guard<std::mutex> lock(mu_);
    core = core_;
  }
  if (core) core->OnClientGone(absl::CancelledError("cancelled by the client"));
}

void GrpcGenerateReactor::OnDone() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    core_.reset();
  }
  delete this;
}

}  // namespace tandem
