// The router's tandem.v1.Generation/Generate over gRPC: a ServerWriteReactor that is
// the request core's ResponseSink (services/api/request_core.h does the routing,
// reserving, prefilling, decoding, retrying and migrating). It writes one message at a
// time (the rest queue; the core stops reading downstream while 4 wait), never overlaps
// Finish with a write, forwards cancellation to the core, and deletes itself in OnDone.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>

#include "services/api/proto_convert.h"
#include "services/api/request_core.h"
#include "services/router/admission.h"
#include "services/router/replica_registry.h"
#include "services/router/router_metrics.h"
#include "tandem/v1/generation.pb.h"

namespace tandem {

struct RouterContext {
  ReplicaRegistry* registry = nullptr;
  const Tokenizer* tokenizer = nullptr;
  const ModelChatTemplates* chat_templates = nullptr;  // null: the model has none
  const ModelInfo* config = nullptr;
  std::string model_name;
  uint64_t layout_fingerprint = 0;
  // How long a request may wait for KV room on a decode replica when the client set no
  // deadline.
  std::chrono::milliseconds max_queue_wait{30000};
  RoutingPolicy prefill_policy = RoutingPolicy::kCacheAware;  // also for --role both workers
  RoutingPolicy decode_policy = RoutingPolicy::kKvAware;
  RoutingWeights weights;
  RouterMetrics* metrics = nullptr;  // null: metrics off
  Admission* admission = nullptr;    // null: unbounded
  int64_t max_prompt_bytes = kDefaultMaxPromptBytes;  // larger prompts: INVALID_ARGUMENT, untokenized
};

// The core's context for a router (one per service): the registry as a ClusterView,
// gRPC alarms as the clock, metrics and the completion log line as on_finished.
class RouterCore {
 public:
  explicit RouterCore(const RouterContext& rc);
  const RequestCoreContext& context() const { return core_; }
  RouterMetrics* metrics() const { return metrics_; }

 private:
  std::unique_ptr<ClusterView> cluster_;
  std::unique_ptr<RequestClock> clock_;
  RouterMetrics* metrics_;
  RequestCoreContext core_;
};

class GrpcGenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse>, public ResponseSink {
 public:
  static GrpcGenerateReactor* Start(const RouterCore& core, grpc::CallbackServerContext* ctx,
                                    const v1::GenerateRequest* request);

  // ResponseSink (called on the core's executor).
  void Begin(const std::string& request_id) override;
  bool Write(v1::GenerateResponse message, bool final) override;
  void Fail(const absl::Status& status, std::optional<std::chrono::milliseconds> retry_after) override;

  // grpc::ServerWriteReactor
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  static constexpr size_t kMaxQueued = 4;

  GrpcGenerateReactor(grpc::CallbackServerContext* ctx, RouterMetrics* metrics) : ctx_(ctx), metrics_(metrics) {}
  // Starts the next write (or the deferred Finish) if none is in flight; under mu_.
  // Returns what to do once the lock is dropped.
  enum class Next { kNothing, kWrite, kWriteAndFinish, kFinish };
  Next NextLocked();
  void Run(Next next);  // the last thing a caller does with `this`

  grpc::CallbackServerContext* const ctx_;
  RouterMetrics* const metrics_;
  std::shared_ptr<RequestCore> core_;  // set before any event can arrive; reset in OnDone

  std::mutex mu_;
  std::deque<v1::GenerateResponse> queue_;
  bool final_queued_ = false;          // the last queue_ entry is the final message
  std::optional<grpc::Status> finish_;  // Fail's status, once the queue is out
  bool writing_ = false;
  bool finished_ = false;               // Finish (or StartWriteAndFinish) was called
  bool told_full_ = false;              // Write returned false: OnSinkReady owed
  v1::GenerateResponse in_flight_;
  std::chrono::steady_clock::time_point last_write_;
};

}  // namespace tandem
