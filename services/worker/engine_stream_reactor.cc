#include "services/worker/engine_stream_reactor.h"

#include <condition_variable>
#include <thread>
#include <vector>

#include "services/api/grpc_status.h"
#include "services/api/proto_convert.h"
#include "services/common/logging.h"
#include "spdlog/spdlog.h"

namespace tandem {

// Pumps reactors off the engine thread: the engine's push into an output stream only queues
// the stream here (a lock and a notify), and this thread converts the output to its proto
// and starts the gRPC write. Done on the engine thread, that work (~12 us a stream) came
// between two GPU steps for every stream of the batch (0.8 ms at 64 streams on the H200).
class PumpQueue {
 public:
  static PumpQueue& Get() {
    static PumpQueue* q = new PumpQueue();  // lives until exit: reactors may pump until then
    return *q;
  }
  void Post(std::weak_ptr<EngineStreamReactor::Shared> s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(s));
    }
    cv_.notify_one();
  }

 private:
  PumpQueue() { std::thread([this] { Loop(); }).detach(); }
  void Loop() {
    std::vector<std::weak_ptr<EngineStreamReactor::Shared>> batch;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !queue_.empty(); });
        batch.swap(queue_);
      }
      for (std::weak_ptr<EngineStreamReactor::Shared>& w : batch) {
        std::shared_ptr<EngineStreamReactor::Shared> s = w.lock();
        if (!s) continue;
        s->queued = false;  // a push from now on queues the stream again
        std::lock_guard<std::mutex> lock(s->mu);
        if (s->reactor != nullptr) s->reactor->Pump();
      }
      batch.clear();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::weak_ptr<EngineStreamReactor::Shared>> queue_;
};

namespace {

// One line per request as it ends, tagged with the request id the router assigned
// (service::RequestLogPrefix), so a request can be followed across processes' logs.
void LogFinished(const std::string& id, const RequestOutput& out) {
  const RequestMetrics& m = out.metrics;
  if (!out.status.ok()) {
    if (out.status.code() == absl::StatusCode::kCancelled) {
      spdlog::debug("{}cancelled: {}", service::RequestLogPrefix(id), std::string(out.status.message()));
    } else {
      spdlog::info("{}failed ({}): {}", service::RequestLogPrefix(id), absl::StatusCodeToString(out.status.code()),
                   std::string(out.status.message()));
    }
    return;
  }
  spdlog::debug("{}done ({}): {} prompt tokens ({} cached) + {} generated, queue {:.1f} ms, {:.1f} ms total",
                service::RequestLogPrefix(id), out.finish_reason == FinishReason::kStop ? "stop" : "length",
                m.prompt_tokens, m.cached_prompt_tokens, m.completion_tokens, m.queue_s * 1e3, m.e2e_s * 1e3);
}

}  // namespace

EngineStreamReactor* EngineStreamReactor::Failed(const grpc::Status& error) {
  auto* r = new EngineStreamReactor();
  r->finished_ = true;
  r->Finish(error);
  return r;
}

EngineStreamReactor* EngineStreamReactor::Start(Engine* engine, std::string request_id,
                                                std::shared_ptr<OutputStream> stream) {
  auto* r = new EngineStreamReactor();
  r->engine_ = engine;
  r->request_id_ = std::move(request_id);
  r->stream_ = std::move(stream);
  r->shared_ = std::make_shared<Shared>();
  r->shared_->reactor = r;
  r->Listen();
  return r;
}

void EngineStreamReactor::Listen() {
  std::weak_ptr<Shared> weak = shared_;
  stream_->SetListener([weak] {
    std::shared_ptr<Shared> s = weak.lock();
    if (s && !s->queued.exchange(true)) PumpQueue::Get().Post(weak);
  });
  Pump();  // outputs may have arrived before the listener was set
}

EngineStreamReactor* EngineStreamReactor::Pending(Engine* engine, std::string request_id, Handle* handle) {
  auto* r = new EngineStreamReactor();
  r->engine_ = engine;
  r->request_id_ = std::move(request_id);
  r->shared_ = std::make_shared<Shared>();
  r->shared_->reactor = r;
  r->shared_->engine = engine;
  r->shared_->request_id = r->request_id_;
  *handle = r->shared_;
  return r;
}

void EngineStreamReactor::Attach(const Handle& h, std::shared_ptr<OutputStream> stream) {
  std::lock_guard<std::mutex> lock(h->mu);
  EngineStreamReactor* r = h->reactor;
  if (r == nullptr) {
    h->engine->Cancel(h->request_id);  // the call ended while the request was admitted
    return;
  }
  {
    std::lock_guard<std::mutex> rlock(r->mu_);
    if (r->finished_) {
      // Cancelled before the request reached the engine (OnCancel's Cancel came first).
      h->engine->Cancel(h->request_id);
      return;
    }
    r->stream_ = std::move(stream);
  }
  r->Listen();
}

void EngineStreamReactor::Fail(const Handle& h, const grpc::Status& error) {
  std::lock_guard<std::mutex> lock(h->mu);
  EngineStreamReactor* r = h->reactor;
  if (r == nullptr) return;
  {
    std::lock_guard<std::mutex> rlock(r->mu_);
    if (r->finished_) return;  // cancelled meanwhile
    r->finished_ = true;
  }
  r->Finish(error);
}

void EngineStreamReactor::Pump() {
  // Decide under the lock; call into gRPC outside it (its callbacks may run on any thread).
  grpc::Status finish_with;
  bool finish = false, write = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (writing_ || final_written_ || finished_ || !stream_) return;
    std::optional<RequestOutput> out = stream_->TryNext();
    if (!out) return;
    if (out->finished) LogFinished(request_id_, *out);
    if (out->finished && !out->status.ok()) {
      // An error ends the call; outputs before it were already sent.
      finished_ = finish = true;
      finish_with = ToGrpcStatus(out->status);
    } else {
      response_.Clear();
      ToProto(*out, &response_);
      if (first_) {
        response_.set_request_id(request_id_);
        first_ = false;
      }
      writing_ = write = true;
      final_written_ = out->finished;
    }
  }
  if (finish) Finish(finish_with);
  if (write) StartWrite(&response_);
}

void EngineStreamReactor::OnWriteDone(bool ok) {
  bool finish = false;
  grpc::Status status = grpc::Status::OK;
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok && !finished_) {
      // The client went away: stop the engine work.
      finished_ = finish = true;
      engine_->Cancel(request_id_);
      status = grpc::Status(grpc::StatusCode::CANCELLED, "client stream closed");
      spdlog::debug("{}client stream closed before the end", service::RequestLogPrefix(request_id_));
    } else if (ok && final_written_ && !finished_) {
      finished_ = finish = true;
    }
  }
  if (finish) {
    Finish(status);
    return;
  }
  if (ok) Pump();
}

void EngineStreamReactor::OnCancel() {
  if (engine_ != nullptr) engine_->Cancel(request_id_);
  bool finish = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!finished_ && !writing_) finished_ = finish = true;
  }
  // With a write in flight, OnWriteDone(false) finishes the call.
  if (finish) Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
}

void EngineStreamReactor::OnDone() {
  if (shared_) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->reactor = nullptr;
  }
  delete this;
}

}  // namespace tandem
