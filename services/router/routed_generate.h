// One client Generate call through the router (docs/design.md §3):
//   disaggregated: Decode.Reserve on a decode replica (a lease on KV blocks) -> Prefill on a
//   prefill replica, which writes the KV into those blocks layer by layer and returns the
//   first token (sent to the client at once: that is TTFT) -> Decode on the decode
//   replica, whose tokens are forwarded as they come;
//   aggregated: when only `--role both` workers are up, their Generate is forwarded.
// A full decode replica means trying another, or waiting (never failing a request that
// could wait) until the call's deadline. Cancellation and deadlines propagate downstream;
// an unused lease is released. The reactor owns itself: it is deleted when the client
// call and every downstream call have completed.
#pragma once

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/runtime/sampling_params.h"
#include "engine/tokenizer/tokenizer.h"
#include "services/api/proto_convert.h"
#include "services/router/admission.h"
#include "services/router/replica_registry.h"
#include "services/router/router_metrics.h"
#include "tandem/v1/generation.pb.h"
#include "tandem/v1/internal.pb.h"

namespace tandem {

struct RouterContext {
  ReplicaRegistry* registry = nullptr;
  const Tokenizer* tokenizer = nullptr;
  const ModelConfig* config = nullptr;
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

class RoutedGenerate : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  static RoutedGenerate* Start(const RouterContext& rc, grpc::CallbackServerContext* ctx,
                               const v1::GenerateRequest* request);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  // Reads a downstream stream (Decode, or a both-worker's Generate) into the client.
  class Reader : public grpc::ClientReadReactor<v1::GenerateResponse> {
   public:
    explicit Reader(RoutedGenerate* parent) : parent_(parent) {}
    void OnReadDone(bool ok) override;
    void OnDone(const grpc::Status& s) override;
    v1::GenerateResponse message;

   private:
    RoutedGenerate* parent_;
  };

  RoutedGenerate(const RouterContext& rc, grpc::CallbackServerContext* ctx);
  absl::Status Prepare(const v1::GenerateRequest& r);
  void Route();
  void Reserve();
  void OnReserved(const grpc::Status& s);
  void Prefill();
  void OnPrefilled(const grpc::Status& s);
  void StartDecode();
  void StartAggregated();
  // Reserve again after a pause: `for_room` when decode replicas were full, else when
  // every replica left had failed this request.
  void WaitAndRetry(bool for_room);
  void OnReaderMessage();  // Reader has a message in Reader::message
  void OnReaderDone(const grpc::Status& s);
  // The decode replica failed mid-stream: continue the request on another one, from the
  // tokens already sent (re-prefill of prompt + those tokens). False when it cannot.
  bool Migrate(const grpc::Status& why);
  void ReleaseLease();
  // Takes a place in the router's queue `q` (admission.h); false after failing the
  // request with the refusal. LeaveQueue is idempotent.
  bool EnterQueue(Admission::Queue q);
  void LeaveQueue(Admission::Queue q);

  void Send(v1::GenerateResponse r, bool final);  // queue a write to the client
  void PumpWrites();
  void Fail(const grpc::Status& s);
  void FillFinal(v1::GenerateResponse* r, const v1::Usage* downstream_usage);
  std::unique_ptr<grpc::ClientContext> NewClientContext();
  bool IsActive();  // not finished, not cancelled

  void Ref() { refs_.fetch_add(1); }
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  const RouterContext rc_;
  grpc::CallbackServerContext* const ctx_;
  const std::chrono::steady_clock::time_point arrived_;
  std::chrono::system_clock::time_point deadline_;
  std::atomic<int> refs_{1};  // the server call + each downstream call in flight

  // The request as the replicas get it.
  std::string id_;
  // The id of the current decode lease, under which the reservation, the prefill into it
  // and the decode stream run on the replicas: id_ for the first, then id_#2, id_#3, ...,
  // so that a lease abandoned to its expiry (a prefill replica cut off mid-write) never
  // collides with the next one on the same decode replica.
  std::string lease_id_;
  int leases_ = 0;
  std::vector<int32_t> prompt_;
  std::vector<uint64_t> block_hashes_;  // the prompt's full blocks, for cache-aware routing
  v1::SamplingParams sampling_;
  v1::StopConditions stop_;
  std::string text_;  // aggregated path: the original request
  v1::GenerateRequest original_;

  std::mutex mu_;
  bool finished_ = false;
  bool cancelled_ = false;
  std::deque<std::pair<v1::GenerateResponse, bool>> pending_writes_;
  bool writing_ = false;
  v1::GenerateResponse in_flight_;
  bool reader_waiting_for_write_ = false;
  std::optional<grpc::Status> deferred_finish_;

  ReplicaLease decode_;
  ReplicaLease prefill_;
  std::vector<std::string> tried_decode_;  // failed: excluded for this request
  std::vector<std::string> full_decode_;   // full: excluded until the next wait
  std::vector<std::string> tried_prefill_;
  int prefill_attempts_ = 0;
  std::unique_ptr<grpc::ClientContext> reserve_ctx_, prefill_ctx_, stream_ctx_;
  v1::ReserveRequest reserve_req_;
  v1::ReserveResponse reserve_resp_;
  v1::PrefillRequest prefill_req_;
  v1::PrefillResponse prefill_resp_;
  v1::DecodeRequest decode_req_;
  bool lease_held_ = false;
  bool prefill_in_flight_ = false;
  bool prefill_lost_ = false;
  std::atomic<bool> in_prefill_queue_{false}, in_decode_queue_{false};
  std::unique_ptr<Reader> reader_;
  std::unique_ptr<grpc::Alarm> alarm_;
  std::chrono::steady_clock::time_point first_token_at_;
  bool sent_first_ = false;
  bool final_seen_ = false;
  // For metrics and the completion log line.
  grpc::StatusCode final_code_ = grpc::StatusCode::OK;
  std::string final_message_;
  int completion_tokens_ = 0;
  int cached_tokens_ = 0;
  bool prefill_done_ = false;
  std::vector<int32_t> sent_tokens_;  // every token id written (or queued) to the client
  std::vector<int32_t> resume_;       // sent_tokens_ at the last migration
  int migrations_ = 0;
  std::chrono::steady_clock::time_point last_write_;
};

}  // namespace tandem
