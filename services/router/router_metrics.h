// The router's Prometheus metrics, created on an injected registry (no globals): the
// client-visible latencies (TTFT, inter-token, time per output token, end to end), the
// prefill side's queue / prefill / KV transfer times as reported per request, requests by
// outcome, token counters, requests in flight, and replicas per role and state (read from
// the membership at scrape time).
#pragma once

#include <memory>
#include <string>

#include <grpcpp/support/status.h>

#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tandem {

class ReplicaRegistry;

class RouterMetrics {
 public:
  RouterMetrics(prometheus::Registry& registry, const std::string& model);

  void RequestStarted() { running_.Increment(); }
  // At the end of every Generate call.
  struct Finished {
    grpc::StatusCode code = grpc::StatusCode::OK;
    int prompt_tokens = 0;
    int completion_tokens = 0;
    int cached_prompt_tokens = 0;
    double ttft_s = -1;  // < 0: no token was sent
    double e2e_s = 0;
    double queue_s = -1, prefill_s = -1, transfer_s = -1;  // < 0: not reported
  };
  void RequestFinished(const Finished& f);
  void InterTokenLatency(double seconds) { itl_.Observe(seconds); }

 private:
  prometheus::Histogram& ttft_;
  prometheus::Histogram& itl_;
  prometheus::Histogram& tpot_;
  prometheus::Histogram& e2e_;
  prometheus::Histogram& queue_;
  prometheus::Histogram& prefill_;
  prometheus::Histogram& transfer_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& generation_tokens_;
  prometheus::Counter& cached_tokens_;
  prometheus::Gauge& running_;
};

// tandem_replicas{role,state}: the membership, counted when scraped.
std::shared_ptr<prometheus::Collectable> ReplicaGaugeCollector(const ReplicaRegistry* registry,
                                                               const std::string& model);

// tandem_requests_waiting{role="router",queue}: requests holding a place in admission's
// prefill queue (admitted, no first token yet) and decode queue (waiting for KV room; such
// a request counts in both), read when scraped. An endpoint picker's queued-requests gauge.
class Admission;
std::shared_ptr<prometheus::Collectable> AdmissionGaugeCollector(const Admission* admission,
                                                                 const std::string& model);

}  // namespace tandem
