#include "services/bin/worker_metrics.h"

#include <limits>

#include "prometheus/metric_family.h"
#include "services/api/metric_buckets.h"
#include "services/common/transfer/transfer_engine.h"

namespace tandem {
namespace {

prometheus::Histogram& Hist(prometheus::Registry& r, const std::string& name, const std::string& help,
                            const prometheus::Labels& labels, const std::vector<double>& buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Labels(labels).Register(r).Add({}, buckets);
}

const char* Outcome(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk: return "ok";
    case absl::StatusCode::kCancelled: return "cancelled";
    case absl::StatusCode::kResourceExhausted: return "resource_exhausted";
    case absl::StatusCode::kUnavailable: return "unavailable";
    case absl::StatusCode::kAborted: return "aborted";
    default: return "error";
  }
}

class EngineStatsCollector : public prometheus::Collectable {
 public:
  EngineStatsCollector(const Engine* e, const transfer::TransferEngine* t, std::string model, std::string role)
      : engine_(e), transfer_(t), model_(std::move(model)), role_(std::move(role)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    const EngineStats s = engine_->Stats();
    std::vector<prometheus::MetricFamily> out;
    auto add = [&](const std::string& name, const std::string& help, prometheus::MetricType type, double value,
                   prometheus::ClientMetric::Label extra = {}) {
      prometheus::ClientMetric m;
      m.label = {{"model", model_}, {"role", role_}};
      if (!extra.name.empty()) m.label.push_back(extra);
      if (type == prometheus::MetricType::Counter) m.counter.value = value;
      else m.gauge.value = value;
      for (auto& f : out) {
        if (f.name == name) {
          f.metric.push_back(m);
          return;
        }
      }
      out.push_back({name, help, type, {m}});
    };
    using prometheus::MetricType;
    add("tandem_requests_waiting", "Requests admitted but not yet running", MetricType::Gauge, s.num_waiting);
    add("tandem_requests_running", "Requests in the running batch", MetricType::Gauge, s.num_running);
    add("tandem_kv_cache_usage_ratio", "KV cache blocks in use / total", MetricType::Gauge, s.kv_usage);
    add("tandem_kv_cache_blocks", "KV cache blocks by state", MetricType::Gauge,
        s.kv_blocks_total - s.kv_blocks_in_use, {"state", "free"});
    add("tandem_kv_cache_blocks", "KV cache blocks by state", MetricType::Gauge, s.kv_blocks_in_use, {"state", "used"});
    add("tandem_prompt_tokens_total", "Prompt tokens computed by the model", MetricType::Counter,
        s.prompt_tokens_computed);
    add("tandem_generation_tokens_total", "Tokens generated", MetricType::Counter, s.generated_tokens);
    add("tandem_prefix_cache_queries_total", "Prefix cache lookups", MetricType::Counter, s.prefix_cache_queries);
    add("tandem_prefix_cache_queried_tokens_total", "Prompt tokens (in full blocks) looked up in the prefix cache",
        MetricType::Counter, s.prefix_cache_queried_blocks * 64.0);
    add("tandem_prefix_cache_hit_tokens_total", "Prompt tokens found in the prefix cache", MetricType::Counter,
        s.prefix_cache_hit_blocks * 64.0);
    add("tandem_prefix_cache_evictions_total", "Cached KV blocks evicted", MetricType::Counter,
        s.prefix_cache_evictions);
    add("tandem_prefix_state_snapshots", "Snapshots of per-sequence KV state (DeepSeek-V4) kept for prefix reuse",
        MetricType::Gauge, s.prefix_state_snapshots);
    add("tandem_prefix_state_evictions_total", "Per-sequence KV state snapshots dropped for room",
        MetricType::Counter, s.prefix_state_evictions);
    add("tandem_preemptions_total", "Sequences preempted for KV cache room (recomputed later)", MetricType::Counter,
        s.preemptions);
    add("tandem_engine_steps_total", "Engine steps (batches run)", MetricType::Counter, s.steps);
    add("tandem_kv_leases_expired_total", "Decode reservations that expired unused", MetricType::Counter,
        s.kv_leases_expired);
    add("tandem_kv_writers_refused_total",
        "Decode.BeginWrites refused: the reservation was not live, so that writer wrote nothing into it",
        MetricType::Counter, s.kv_writers_refused);
    add("tandem_kv_quarantined_blocks", "KV blocks of ended reservations held back from reuse (a prefill replica "
        "recorded as their writer may still be writing into them)", MetricType::Gauge, s.kv_blocks_quarantined);
    add("tandem_kv_quarantine_stuck", "Quarantined reservations older than --kv-quarantine-warn-ms (their writer is "
        "neither known to be done nor known to be gone)", MetricType::Gauge, s.kv_quarantine_stuck);
    const char* ends_help =
        "Quarantines ended, by the proof that the writer stopped (writer_ended: its EndWrites or its own answer; "
        "writer_gone: its process is gone; decoded: the Decode or Release after its answered Prefill call), and "
        "expired reservations freed at once because no writer was open (no_writer)";
    add("tandem_kv_quarantine_ends_total", ends_help, MetricType::Counter, s.kv_quarantine_ends_writer_ended,
        {"reason", "writer_ended"});
    add("tandem_kv_quarantine_ends_total", ends_help, MetricType::Counter, s.kv_quarantine_ends_writer_gone,
        {"reason", "writer_gone"});
    add("tandem_kv_quarantine_ends_total", ends_help, MetricType::Counter, s.kv_quarantine_ends_decoded,
        {"reason", "decoded"});
    add("tandem_kv_quarantine_ends_total", ends_help, MetricType::Counter, s.kv_quarantine_ends_no_writer,
        {"reason", "no_writer"});
    add("tandem_decode_reserve_requests_total", "KV reservations asked for (decode replicas: Decode.Reserve calls)",
        MetricType::Counter, s.kv_reserve_requests);
    add("tandem_decode_reserve_waiting", "KV reservations waiting for room in the replica's queue",
        MetricType::Gauge, s.kv_reserve_waiting);
    add("tandem_kv_host_staging_bytes_total",
        "KV bytes copied between the GPU's KV pool and the host pool (export for the transfer layer, imports)",
        MetricType::Counter, static_cast<double>(s.kv_host_staged_bytes));
    if (!s.spec_accepted_by_position.empty()) AddSpeculative(s, out);
    if (transfer_ != nullptr) {
      const transfer::TransferStats t = transfer_->stats();
      add("tandem_kv_transfer_bytes_total", "KV bytes written to peers", MetricType::Counter,
          static_cast<double>(t.bytes_put));
      add("tandem_kv_transfer_batches_total", "KV transfer batches by outcome", MetricType::Counter,
          static_cast<double>(t.batches_ok), {"outcome", "ok"});
      add("tandem_kv_transfer_batches_total", "KV transfer batches by outcome", MetricType::Counter,
          static_cast<double>(t.batches_failed), {"outcome", "failed"});
    }
    return out;
  }

 private:
  // Speculative decoding (--speculative-tokens > 0; its families are absent without it).
  // The accepted length is a histogram, as Prometheus has distributions: one observation
  // per verify step of a sequence, its value the drafts accepted there (0..N, a bucket
  // each), so _count is the verify steps, _sum the accepted drafts (the same as the
  // position counters' total), _sum / _count the mean accepted length and
  // histogram_quantile() its quantiles. A counter with a `length` label would say the same
  // with none of that built in.
  void AddSpeculative(const EngineStats& s, std::vector<prometheus::MetricFamily>& out) const {
    auto metric = [&] {
      prometheus::ClientMetric m;
      m.label = {{"model", model_}, {"role", role_}};
      return m;
    };
    prometheus::ClientMetric drafts = metric();
    drafts.counter.value = static_cast<double>(s.spec_draft_tokens);
    out.push_back({"tandem_spec_draft_tokens_total", "Draft tokens the MTP layer proposed and the model verified",
                   prometheus::MetricType::Counter, {drafts}});
    prometheus::MetricFamily accepted{"tandem_spec_accepted_tokens_total",
                                      "Draft tokens accepted, by position in their step's drafts (0: the first)",
                                      prometheus::MetricType::Counter, {}};
    for (size_t p = 0; p < s.spec_accepted_by_position.size(); ++p) {
      prometheus::ClientMetric m = metric();
      m.label.push_back({"position", std::to_string(p)});
      m.counter.value = static_cast<double>(s.spec_accepted_by_position[p]);
      accepted.metric.push_back(std::move(m));
    }
    out.push_back(std::move(accepted));
    prometheus::ClientMetric length = metric();
    uint64_t cumulative = 0;
    double sum = 0;
    for (size_t a = 0; a < s.spec_accepted_length.size(); ++a) {
      cumulative += static_cast<uint64_t>(s.spec_accepted_length[a]);
      sum += static_cast<double>(a) * static_cast<double>(s.spec_accepted_length[a]);
      length.histogram.bucket.push_back({cumulative, static_cast<double>(a)});
    }
    length.histogram.bucket.push_back({cumulative, std::numeric_limits<double>::infinity()});
    length.histogram.sample_count = cumulative;
    length.histogram.sample_sum = sum;
    out.push_back({"tandem_spec_accepted_length", "Draft tokens accepted per verify step of a sequence",
                   prometheus::MetricType::Histogram, {length}});
  }

  const Engine* engine_;
  const transfer::TransferEngine* transfer_;
  std::string model_, role_;
};

}  // namespace

WorkerMetrics::WorkerMetrics(prometheus::Registry& r, const std::string& model, const std::string& role)
    : queue_(Hist(r, "tandem_request_queue_time_seconds", "Time a request waited before its first step",
                  {{"model", model}, {"role", role}}, TtftBuckets())),
      prefill_(Hist(r, "tandem_request_prefill_time_seconds", "From first scheduled to first token",
                    {{"model", model}, {"role", role}}, TtftBuckets())),
      ttft_(Hist(r, "tandem_time_to_first_token_seconds", "From arrival at this replica to the first token",
                 {{"model", model}, {"role", role}}, TtftBuckets())),
      e2e_(Hist(r, "tandem_e2e_request_latency_seconds", "From arrival at this replica to the end",
                {{"model", model}, {"role", role}}, RequestLatencyBuckets())),
      transfer_(Hist(r, "tandem_kv_transfer_duration_seconds", "KV transfer of one request, first write to complete",
                     {{"model", model}, {"role", role}}, TransferBuckets())),
      requests_(prometheus::BuildCounter()
                    .Name("tandem_requests_total")
                    .Help("Requests this replica ended, by outcome")
                    .Labels({{"model", model}, {"role", role}})
                    .Register(r)),
      transfer_failures_(prometheus::BuildCounter()
                             .Name("tandem_kv_transfer_failures_total")
                             .Help("Requests whose KV transfer failed")
                             .Labels({{"model", model}, {"role", role}})
                             .Register(r)
                             .Add({})),
      transfers_(prometheus::BuildCounter()
                     .Name("tandem_kv_transfer_requests_total")
                     .Help("Requests whose KV this prefill replica sent, by path (transfer: host pools over UCX; "
                           "cuda_ipc: GPU to GPU)")
                     .Labels({{"model", model}, {"role", role}})
                     .Register(r)),
      transfer_bytes_(prometheus::BuildCounter()
                          .Name("tandem_kv_transfer_request_bytes_total")
                          .Help("KV bytes of those requests, by path (bf16 on cuda_ipc, float32 on transfer)")
                          .Labels({{"model", model}, {"role", role}})
                          .Register(r)) {
  for (const char* p : {"transfer", "cuda_ipc"}) {
    transfers_.Add({{"path", p}});
    transfer_bytes_.Add({{"path", p}});
  }
  for (const char* o : {"ok", "cancelled", "resource_exhausted", "unavailable", "aborted", "error"}) {
    requests_.Add({{"outcome", o}});
  }
}

void WorkerMetrics::RequestFinished(const RequestMetrics& m, const absl::Status& status) {
  requests_.Add({{"outcome", Outcome(status)}}).Increment();
  if (!status.ok()) return;
  queue_.Observe(m.queue_s);
  if (m.ttft_s > 0) {
    prefill_.Observe(m.prefill_s);
    ttft_.Observe(m.ttft_s);
  }
  e2e_.Observe(m.e2e_s);
}

void WorkerMetrics::KvTransfer(double seconds, int64_t bytes, bool ok, const std::string& path) {
  if (!ok) {
    transfer_failures_.Increment();
    return;
  }
  transfer_.Observe(seconds);
  transfers_.Add({{"path", path}}).Increment();
  transfer_bytes_.Add({{"path", path}}).Increment(static_cast<double>(bytes));
}

std::shared_ptr<prometheus::Collectable> EngineCollector(const Engine* engine, const transfer::TransferEngine* transfer,
                                                         const std::string& model, const std::string& role) {
  return std::make_shared<EngineStatsCollector>(engine, transfer, model, role);
}

}  // namespace tandem
