// One generation request's life in the router, independent of the transport it came in
// on (design.md §3): validate and tokenize, route, reserve KV on a decode replica (a
// lease), prefill into it on a prefill replica (the first token: TTFT), decode there and
// forward the tokens; retry a failed prefill, wait for KV room when every decode replica
// is full, migrate to another decode replica when one fails mid-stream. With only
// `--role both` workers, forward the request to one of them (aggregated).
//
// The request is a state machine (request_state.h). Every event (a downstream call
// completing, a timer, the client going away, the sink draining) is posted to the
// request's serial executor, so handlers run one at a time and never race; each handler
// holds a reference, so no event finds the request freed. The client's answer goes to a
// ResponseSink (response_sink.h); replicas, timers and queues are interfaces
// (downstream.h).
//
// KV leases: released exactly once when unused, never while a prefill may still write
// into them (a cancelled or cut-off prefill leaves its lease to the replica's expiry);
// consumed by the Decode call.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/model_info.h"
#include "engine/tokenizer/tokenizer.h"
#include "services/api/downstream.h"
#include "services/api/proto_convert.h"
#include "services/api/request_state.h"
#include "services/api/response_sink.h"
#include "services/api/serial_executor.h"
#include "tandem/v1/generation.pb.h"
#include "tandem/v1/internal.pb.h"

namespace tandem {

// How a request ended, for metrics and the log (RequestCoreContext::on_finished).
struct RequestSummary {
  std::string request_id;  // empty when the request was invalid
  absl::Status status;
  int prompt_tokens = 0;
  int completion_tokens = 0;  // tokens the client received
  int cached_prompt_tokens = 0;
  double ttft_s = -1;  // < 0: no token was sent
  double e2e_s = 0;
  double queue_s = -1, prefill_s = -1, transfer_s = -1;  // < 0: no prefill reported them
  int migrations = 0;
};

struct RequestCoreContext {
  ClusterView* cluster = nullptr;
  RequestClock* clock = nullptr;
  const Tokenizer* tokenizer = nullptr;
  // The model's chat templates; null for a model without one (chat prompts then get the
  // DeepSeek-V3 format, proto_convert.h).
  const ModelChatTemplates* chat_templates = nullptr;
  const ModelInfo* config = nullptr;
  std::string model_name;
  uint64_t layout_fingerprint = 0;
  // How long a request may wait for KV room when the client set no deadline.
  std::chrono::milliseconds max_queue_wait{30000};
  AdmissionQueues* admission = nullptr;  // null: unbounded
  int64_t max_prompt_bytes = kDefaultMaxPromptBytes;  // larger prompts: INVALID_ARGUMENT, untokenized
  // Once per request, when the client's outcome is decided.
  std::function<void(const RequestSummary&)> on_finished;
};

class RequestCore : public std::enable_shared_from_this<RequestCore> {
 public:
  // Limits of retrying (per request).
  static constexpr int kMaxPrefillAttempts = 3;
  static constexpr int kMaxMigrations = 3;
  // Pause before reserving again when every decode replica had failed, or a wait for room
  // at one ended without room (or found its queue full).
  static constexpr std::chrono::milliseconds kRetryInterval{20};

  // A request for `sink`, which must stay valid until its final Write or Fail.
  // `deadline`: the client's, on ctx.clock's time line. Nothing happens before Start.
  static std::shared_ptr<RequestCore> Create(const RequestCoreContext& ctx,
                                             std::optional<CoreClock::time_point> deadline, ResponseSink* sink);
  // Validates `request` and starts it: the sink gets Begin (or, for an invalid request,
  // Fail) before Start returns. Once.
  void Start(const v1::GenerateRequest& request);

  // Transport events; any thread.
  void OnSinkReady();                          // after Write returned false: room again
  void OnClientGone(const absl::Status& why);  // cancelled, disconnected, a write failed

  // For tests and logs: the state after the handlers run so far.
  RequestState state() const;
  const std::string& id() const { return id_; }

  RequestCore(const RequestCoreContext& ctx, std::optional<CoreClock::time_point> deadline, ResponseSink* sink);

 private:
  // The decode lease the request holds (reserved, not yet released or consumed).
  struct Lease {
    std::shared_ptr<ReplicaHandle> replica;
    std::string id;
    v1::KvDestination destination;
    bool prefill_writing = false;  // a Prefill into it has not ended
  };

  void Post(std::function<void()> handler);
  void Transition(RequestState to);
  absl::Status Prepare(const v1::GenerateRequest& r);
  CallOptions Options() const;
  CoreClock::time_point QueueLimit() const;

  void Route();
  // Picks a decode replica and reserves there: at once (RESOURCE_EXHAUSTED: the next
  // replica), or, when the replicas are full, waiting in one replica's queue.
  void Reserve();
  void WaitAtReplica();
  void StartReserve(std::shared_ptr<ReplicaHandle> d, bool wait);
  void OnReserved(const std::shared_ptr<ReplicaHandle>& d, const std::string& lease_id, bool waited,
                  absl::StatusOr<v1::ReserveResponse> r);
  void WaitAndRetry(bool for_room);
  void OnWaitOver(bool fired);
  void Prefill();
  void OnPrefilled(const std::shared_ptr<ReplicaHandle>& p, absl::StatusOr<v1::PrefillResponse> r);
  void StartDecode();
  void StartAggregated();
  StreamHandlers Handlers();
  void OnStreamMessage(v1::GenerateResponse msg);
  void OnStreamDone(absl::Status s);
  // The decode replica failed mid-stream: continue on another from the tokens sent.
  bool Migrate(const absl::Status& why);
  void OnDeadline(bool fired);

  // Releases the lease (once no Prefill call into it is in flight). `ended_writer`: the
  // incarnation of the prefill replica whose call into it answered (its writes are done;
  // 0: none known). Without it the decode replica frees the blocks only when no writer
  // it recorded may still write, and otherwise keeps them quarantined until that writer
  // is known to have stopped (engine/runtime/kv_leases.h).
  void ReleaseLease(uint64_t ended_writer = 0);
  bool EnterQueue(AdmissionQueues::Queue q);
  void LeaveQueue(AdmissionQueues::Queue q);

  // Client side. Emit returns whether the sink takes more.
  bool Emit(v1::GenerateResponse msg);
  void FinishOk(v1::GenerateResponse final_msg, const v1::Usage* downstream_usage);
  void Fail(const absl::Status& s, std::optional<std::chrono::milliseconds> retry_after = std::nullopt);
  void EnterFinishing(const absl::Status& s);
  void CallStarted() { ++outstanding_; }
  void CallEnded();
  void MaybeDone();

  const RequestCoreContext ctx_;
  const CoreClock::time_point arrived_;
  const std::optional<CoreClock::time_point> deadline_;
  ResponseSink* sink_;  // null after the final Write or Fail
  SerialExecutor executor_;

  // Everything below is touched only by handlers on executor_ (and Start before them).
  RequestState state_ = RequestState::kQueued;
  std::atomic<RequestState> visible_state_{RequestState::kQueued};
  int outstanding_ = 0;  // downstream calls, streams and timers not yet completed

  std::string id_;
  std::vector<int32_t> prompt_;
  std::vector<uint64_t> block_hashes_;
  v1::SamplingParams sampling_;
  v1::StopConditions stop_;
  v1::GenerateRequest original_;  // aggregated path: forwarded as it came (with the id)

  // Lease ids: id_, then id_#2, id_#3, ..., so an abandoned lease (still held by the
  // replica until it expires) never collides with the next one.
  int leases_ = 0;
  std::optional<Lease> lease_;
  bool disaggregated_ = false;
  std::shared_ptr<ReplicaHandle> decode_;   // the replica reserved at / streaming from
  std::shared_ptr<ReplicaHandle> prefill_;  // the replica prefilling
  std::vector<std::string> tried_decode_;   // failed this request: excluded
  std::vector<std::string> full_decode_;    // full: excluded until the next wait
  // Larger than their whole KV pool (OUT_OF_RANGE): never again for this request.
  std::vector<std::string> too_small_decode_;
  std::string too_small_message_;  // the last such replica's words, for the failure
  std::vector<std::string> tried_prefill_;
  int prefill_attempts_ = 0;
  int migrations_ = 0;
  std::unique_ptr<PendingCall> reserve_call_, prefill_call_, wait_timer_, deadline_timer_;
  std::unique_ptr<DownstreamStream> stream_;
  bool reading_ = false;     // a Read is outstanding on stream_
  bool sink_full_ = false;   // waiting for OnSinkReady before reading on
  bool in_prefill_queue_ = false, in_decode_queue_ = false;

  v1::PrefillResponse prefill_resp_;  // the last successful prefill's
  bool prefilled_ = false;
  int cached_tokens_ = 0;  // as the final message reports them
  bool sent_first_ = false;
  CoreClock::time_point first_token_at_;
  std::vector<int32_t> sent_tokens_;  // every token id written to the sink
  std::vector<int32_t> resume_;       // sent_tokens_ at the last migration
};

}  // namespace tandem
