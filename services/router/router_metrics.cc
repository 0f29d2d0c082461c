#include "services/router/router_metrics.h"

#include <map>

#include "prometheus/metric_family.h"
#include "services/api/metric_buckets.h"
#include "services/router/admission.h"
#include "services/router/replica_registry.h"

namespace tandem {
namespace {

const char* Outcome(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK: return "ok";
    case grpc::StatusCode::CANCELLED: return "cancelled";
    case grpc::StatusCode::INVALID_ARGUMENT: return "invalid_argument";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "resource_exhausted";
    case grpc::StatusCode::UNAVAILABLE: return "unavailable";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "deadline_exceeded";
    case grpc::StatusCode::ABORTED: return "aborted";
    default: return "error";
  }
}

prometheus::Histogram& Hist(prometheus::Registry& r, const std::string& name, const std::string& help,
                            const std::string& model, const std::vector<double>& buckets) {
  return prometheus::BuildHistogram()
      .Name(name)
      .Help(help)
      .Labels({{"model", model}, {"role", "router"}})
      .Register(r)
      .Add({}, buckets);
}

prometheus::Counter& Count(prometheus::Registry& r, const std::string& name, const std::string& help,
                           const std::string& model) {
  return prometheus::BuildCounter().Name(name).Help(help).Labels({{"model", model}, {"role", "router"}}).Register(r).Add({});
}

class ReplicaCollector : public prometheus::Collectable {
 public:
  ReplicaCollector(const ReplicaRegistry* r, std::string model) : registry_(r), model_(std::move(model)) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    v1::ListReplicasResponse list;
    registry_->List(&list);
    std::map<std::pair<std::string, std::string>, double> counts;
    for (const char* role : {"prefill", "decode", "both"}) {
      for (const char* state : {"ready", "draining"}) counts[{role, state}] = 0;
    }
    for (const v1::ReplicaInfo& r : list.replicas()) {
      const char* role = r.role() == v1::ROLE_PREFILL ? "prefill" : r.role() == v1::ROLE_DECODE ? "decode" : "both";
      counts[{role, r.state()}] += 1;
    }
    prometheus::MetricFamily f{"tandem_replicas", "Replicas registered with the router, by role and state",
                               prometheus::MetricType::Gauge, {}};
    for (const auto& [key, n] : counts) {
      prometheus::ClientMetric m;
      m.label = {{"model", model_}, {"role", key.first}, {"state", key.second}};
      m.gauge.value = n;
      f.metric.push_back(m);
    }
    return {f};
  }

 private:
  const ReplicaRegistry* registry_;
  std::string model_;
};

}  // namespace

RouterMetrics::RouterMetrics(prometheus::Registry& r, const std::string& model)
    : ttft_(Hist(r, "tandem_time_to_first_token_seconds", "Time from request arrival to the first token sent", model,
                 ClientTtftBuckets())),
      itl_(Hist(r, "tandem_inter_token_latency_seconds", "Time between consecutive streamed chunks of a request",
                model, TokenLatencyBuckets())),
      tpot_(Hist(r, "tandem_time_per_output_token_seconds",
                 "Per request: (last token - first token) / (output tokens - 1)", model, TokenLatencyBuckets())),
      e2e_(Hist(r, "tandem_e2e_request_latency_seconds", "Time from request arrival to its last message", model,
                RequestLatencyBuckets())),
      queue_(Hist(r, "tandem_request_queue_time_seconds", "Time a request waited for a prefill slot", model,
                  TtftBuckets())),
      prefill_(Hist(r, "tandem_request_prefill_time_seconds", "Prefill compute time, from scheduling to first token",
                    model, TtftBuckets())),
      transfer_(Hist(r, "tandem_kv_transfer_duration_seconds", "KV transfer of a request, prefill to decode replica",
                     model, TransferBuckets())),
      requests_(prometheus::BuildCounter()
                    .Name("tandem_requests_total")
                    .Help("Generate requests by outcome (ok, cancelled, invalid_argument, resource_exhausted, "
                          "unavailable, deadline_exceeded, aborted, error)")
                    .Labels({{"model", model}, {"role", "router"}})
                    .Register(r)),
      prompt_tokens_(Count(r, "tandem_prompt_tokens_total", "Prompt tokens of completed requests", model)),
      generation_tokens_(Count(r, "tandem_generation_tokens_total", "Tokens generated and sent", model)),
      cached_tokens_(Count(r, "tandem_prefix_cache_hit_tokens_total",
                           "Prompt tokens whose KV came from a prefix cache instead of being computed", model)),
      running_(prometheus::BuildGauge()
                   .Name("tandem_requests_running")
                   .Help("Generate requests in flight")
                   .Labels({{"model", model}, {"role", "router"}})
                   .Register(r)
                   .Add({})) {
  for (const char* o : {"ok", "cancelled", "invalid_argument", "resource_exhausted", "unavailable",
                        "deadline_exceeded", "aborted", "error"}) {
    requests_.Add({{"outcome", o}});  // every series exists from the start (rate() needs it)
  }
}

void RouterMetrics::RequestFinished(const Finished& f) {
  running_.Decrement();
  requests_.Add({{"outcome", Outcome(f.code)}}).Increment();
  prompt_tokens_.Increment(f.prompt_tokens);
  generation_tokens_.Increment(f.completion_tokens);
  cached_tokens_.Increment(f.cached_prompt_tokens);
  if (f.ttft_s >= 0) ttft_.Observe(f.ttft_s);
  e2e_.Observe(f.e2e_s);
  if (f.ttft_s >= 0 && f.completion_tokens > 1) tpot_.Observe((f.e2e_s - f.ttft_s) / (f.completion_tokens - 1));
  if (f.queue_s >= 0) queue_.Observe(f.queue_s);
  if (f.prefill_s >= 0) prefill_.Observe(f.prefill_s);
  if (f.transfer_s >= 0) transfer_.Observe(f.transfer_s);
}

std::shared_ptr<prometheus::Collectable> ReplicaGaugeCollector(const ReplicaRegistry* registry,
                                                               const std::string& model) {
  return std::make_shared<ReplicaCollector>(registry, model);
}

namespace {

class AdmissionCollector : public prometheus::Collectable {
 public:
  AdmissionCollector(const Admission* a, std::string model) : admission_(a), model_(std::move(model)) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    prometheus::MetricFamily f{"tandem_requests_waiting",
                               "Requests in the router's admission queues: prefill (admitted, no first token yet) "
                               "and decode (waiting for KV room; also counted in prefill)",
                               prometheus::MetricType::Gauge, {}};
    for (const auto& [name, q] : {std::pair{"prefill", AdmissionQueues::Queue::kPrefill},
                                  std::pair{"decode", AdmissionQueues::Queue::kDecode}}) {
      prometheus::ClientMetric m;
      m.label = {{"model", model_}, {"role", "router"}, {"queue", name}};
      m.gauge.value = static_cast<double>(admission_->size(q));
      f.metric.push_back(m);
    }
    return {f};
  }

 private:
  const Admission* admission_;
  std::string model_;
};

}  // namespace

std::shared_ptr<prometheus::Collectable> AdmissionGaugeCollector(const Admission* admission,
                                                                 const std::string& model) {
  return std::make_shared<AdmissionCollector>(admission, model);
}

}  // namespace tandem
