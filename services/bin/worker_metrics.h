// A worker's Prometheus metrics on an injected registry: per-request latencies and
// outcomes observed as the engine finishes requests (queue, prefill, TTFT, end to end as
// the worker sees them), KV transfer durations on prefill replicas, and, read from the
// engine and the transfer layer when scraped: waiting/running requests, KV cache usage,
// token and prefix-cache counters, transfer bytes and failures.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "engine/runtime/engine.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tandem {

namespace transfer {
class TransferEngine;
}

class WorkerMetrics {
 public:
  WorkerMetrics(prometheus::Registry& registry, const std::string& model, const std::string& role);
  // EngineOptions::on_request_finished.
  void RequestFinished(const RequestMetrics& m, const absl::Status& status);
  // Prefill replicas: one request's KV transfer; `path` "transfer" or "cuda_ipc".
  void KvTransfer(double seconds, int64_t bytes, bool ok, const std::string& path);

 private:
  prometheus::Histogram& queue_;
  prometheus::Histogram& prefill_;
  prometheus::Histogram& ttft_;
  prometheus::Histogram& e2e_;
  prometheus::Histogram& transfer_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Counter& transfer_failures_;
  prometheus::Family<prometheus::Counter>& transfers_;
  prometheus::Family<prometheus::Counter>& transfer_bytes_;
};

// Gauges and counters read from Engine::Stats() (and the transfer layer, when given) at
// scrape time: nothing on the hot path.
std::shared_ptr<prometheus::Collectable> EngineCollector(const Engine* engine, const transfer::TransferEngine* transfer,
                                                         const std::string& model, const std::string& role);

}  // namespace tandem
