#include "services/router/metrics_history.h"

#include <algorithm>
#include <cmath>

#include "prometheus/metric_family.h"
#include "services/router/replica_registry.h"

namespace tandem {
namespace {

const prometheus::ClientMetric* FirstMetric(const std::vector<prometheus::MetricFamily>& families,
                                            const std::string& name) {
  for (const prometheus::MetricFamily& f : families) {
    if (f.name == name && !f.metric.empty()) return &f.metric.front();
  }
  return nullptr;
}

HistogramCounts ReadHistogram(const std::vector<prometheus::MetricFamily>& families, const std::string& name) {
  HistogramCounts h;
  const prometheus::ClientMetric* m = FirstMetric(families, name);
  if (m == nullptr) return h;
  for (const prometheus::ClientMetric::Bucket& b : m->histogram.bucket) {
    h.upper_bounds.push_back(b.upper_bound);
    h.cumulative.push_back(static_cast<double>(b.cumulative_count));
  }
  h.count = static_cast<double>(m->histogram.sample_count);
  h.sum = m->histogram.sample_sum;
  return h;
}

double ReadCounter(const std::vector<prometheus::MetricFamily>& families, const std::string& name) {
  const prometheus::ClientMetric* m = FirstMetric(families, name);
  return m == nullptr ? 0 : m->counter.value;
}

nlohmann::json OrNull(std::optional<double> v) {
  return v && std::isfinite(*v) ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

}  // namespace

HistogramCounts Delta(const HistogramCounts& later, const HistogramCounts& earlier) {
  HistogramCounts d;
  if (earlier.upper_bounds.empty()) return later;  // nothing before: everything is new
  if (later.upper_bounds != earlier.upper_bounds) return d;
  d.upper_bounds = later.upper_bounds;
  for (size_t i = 0; i < later.cumulative.size(); ++i) {
    d.cumulative.push_back(std::max(0.0, later.cumulative[i] - earlier.cumulative[i]));
  }
  d.count = std::max(0.0, later.count - earlier.count);
  d.sum = std::max(0.0, later.sum - earlier.sum);
  return d;
}

std::optional<double> HistogramQuantile(double q, const HistogramCounts& h) {
  if (h.cumulative.empty() || h.cumulative.size() != h.upper_bounds.size()) return std::nullopt;
  const double total = h.cumulative.back();
  if (!(total > 0) || q < 0 || q > 1) return std::nullopt;
  const double rank = q * total;
  size_t i = 0;
  while (i < h.cumulative.size() && h.cumulative[i] < rank) ++i;
  if (i >= h.cumulative.size()) i = h.cumulative.size() - 1;
  if (std::isinf(h.upper_bounds[i])) {
    // In the +Inf bucket: the highest finite bound is all that is known.
    return i == 0 ? std::nullopt : std::optional<double>(h.upper_bounds[i - 1]);
  }
  const double lower = i == 0 ? 0.0 : h.upper_bounds[i - 1];
  const double below = i == 0 ? 0.0 : h.cumulative[i - 1];
  const double in_bucket = h.cumulative[i] - below;
  if (!(in_bucket > 0)) return h.upper_bounds[i];
  return lower + (h.upper_bounds[i] - lower) * (rank - below) / in_bucket;
}

MetricsHistory::MetricsHistory(std::shared_ptr<prometheus::Collectable> metrics, ReplicaSource replicas,
                               Options options)
    : metrics_(std::move(metrics)), replicas_(std::move(replicas)), options_(options) {}

MetricsHistory::~MetricsHistory() { Stop(); }

void MetricsHistory::Start() {
  std::lock_guard<std::mutex> lock(thread_mu_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] {
    using namespace std::chrono;
    const auto origin = steady_clock::now();
    auto next = origin;
    std::unique_lock<std::mutex> lock(thread_mu_);
    while (!stopping_) {
      lock.unlock();
      Record(duration<double>(steady_clock::now() - origin).count(),
             duration<double>(system_clock::now().time_since_epoch()).count());
      lock.lock();
      next += options_.interval;
      wake_.wait_until(lock, next, [this] { return stopping_; });
    }
  });
}

void MetricsHistory::Stop() {
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(thread_mu_);
    stopping_ = true;
    t = std::move(thread_);
  }
  wake_.notify_all();
  if (t.joinable()) t.join();
}

void MetricsHistory::Record(double t, double unix_s) {
  Sample s;
  s.t = t;
  s.unix_s = unix_s;
  if (metrics_) {
    const std::vector<prometheus::MetricFamily> families = metrics_->Collect();
    s.ttft = ReadHistogram(families, "tandem_time_to_first_token_seconds");
    s.itl = ReadHistogram(families, "tandem_inter_token_latency_seconds");
    s.tpot = ReadHistogram(families, "tandem_time_per_output_token_seconds");
    s.e2e = ReadHistogram(families, "tandem_e2e_request_latency_seconds");
    s.prompt_tokens = ReadCounter(families, "tandem_prompt_tokens_total");
    s.generation_tokens = ReadCounter(families, "tandem_generation_tokens_total");
    s.cached_tokens = ReadCounter(families, "tandem_prefix_cache_hit_tokens_total");
    if (const prometheus::ClientMetric* m = FirstMetric(families, "tandem_requests_running")) s.running = m->gauge.value;
    for (const prometheus::MetricFamily& f : families) {
      if (f.name != "tandem_requests_total") continue;
      for (const prometheus::ClientMetric& m : f.metric) {
        for (const prometheus::ClientMetric::Label& l : m.label) {
          if (l.name == "outcome") s.requests[l.value] += m.counter.value;
        }
      }
    }
  }
  if (replicas_) s.replicas = replicas_();
  std::lock_guard<std::mutex> lock(mu_);
  samples_.push_back(std::move(s));
  while (samples_.size() > std::max<size_t>(options_.capacity, 2)) samples_.pop_front();
}

const MetricsHistory::Sample& MetricsHistory::At(double t) const {
  // Samples are in time order: the last one at or before t.
  auto it = std::upper_bound(samples_.begin(), samples_.end(), t + 1e-9,
                             [](double v, const Sample& s) { return v < s.t; });
  return it == samples_.begin() ? samples_.front() : *std::prev(it);
}

const MetricsHistory::Sample& MetricsHistory::AtUnix(double unix_s) const {
  auto it = std::upper_bound(samples_.begin(), samples_.end(), unix_s + 1e-9,
                             [](double v, const Sample& s) { return v < s.unix_s; });
  return it == samples_.begin() ? samples_.front() : *std::prev(it);
}

nlohmann::json MetricsHistory::Between(const Sample& from, const Sample& to) {
  const double dt = to.t - from.t;
  nlohmann::json j;
  if (!(dt > 0)) {
    for (const char* k : {"requests_per_s", "failed_per_s", "prompt_tokens_per_s", "generation_tokens_per_s",
                          "cache_hit_ratio", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_mean_s", "itl_p50_s",
                          "itl_p99_s", "tpot_p50_s", "e2e_p50_s", "e2e_p99_s"}) {
      j[k] = nullptr;
    }
    j["span_s"] = 0;
    j["requests"] = 0;
    j["outcomes"] = nlohmann::json::object();
    return j;
  }
  double requests = 0, failed = 0;
  nlohmann::json outcomes = nlohmann::json::object();
  for (const auto& [outcome, value] : to.requests) {
    auto it = from.requests.find(outcome);
    const double n = std::max(0.0, value - (it == from.requests.end() ? 0.0 : it->second));
    requests += n;
    if (outcome != "ok") failed += n;
    outcomes[outcome] = n / dt;
  }
  const double prompt = std::max(0.0, to.prompt_tokens - from.prompt_tokens);
  const double cached = std::max(0.0, to.cached_tokens - from.cached_tokens);
  const HistogramCounts ttft = Delta(to.ttft, from.ttft);
  const HistogramCounts itl = Delta(to.itl, from.itl);
  const HistogramCounts tpot = Delta(to.tpot, from.tpot);
  const HistogramCounts e2e = Delta(to.e2e, from.e2e);
  j["span_s"] = dt;
  j["requests"] = requests;
  j["requests_per_s"] = requests / dt;
  j["failed_per_s"] = failed / dt;
  j["outcomes"] = std::move(outcomes);
  j["prompt_tokens_per_s"] = prompt / dt;
  j["generation_tokens_per_s"] = std::max(0.0, to.generation_tokens - from.generation_tokens) / dt;
  j["cache_hit_ratio"] = prompt > 0 ? nlohmann::json(cached / prompt) : nlohmann::json(nullptr);
  j["ttft_p50_s"] = OrNull(HistogramQuantile(0.50, ttft));
  j["ttft_p90_s"] = OrNull(HistogramQuantile(0.90, ttft));
  j["ttft_p99_s"] = OrNull(HistogramQuantile(0.99, ttft));
  j["ttft_mean_s"] = ttft.count > 0 ? nlohmann::json(ttft.sum / ttft.count) : nlohmann::json(nullptr);
  j["itl_p50_s"] = OrNull(HistogramQuantile(0.50, itl));
  j["itl_p99_s"] = OrNull(HistogramQuantile(0.99, itl));
  j["tpot_p50_s"] = OrNull(HistogramQuantile(0.50, tpot));
  j["e2e_p50_s"] = OrNull(HistogramQuantile(0.50, e2e));
  j["e2e_p99_s"] = OrNull(HistogramQuantile(0.99, e2e));
  return j;
}

nlohmann::json MetricsHistory::ToJson(const Query& query) const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json out;
  out["metrics_enabled"] = metrics_ != nullptr;
  out["interval_s"] = std::chrono::duration<double>(options_.interval).count();
  out["window_s"] = query.window_s;
  out["step_s"] = query.step_s;
  out["samples"] = samples_.size();
  if (samples_.empty()) {
    out["now_unix_s"] = nullptr;
    out["summary"] = nullptr;
    out["series"] = nlohmann::json::object();
    out["replicas"] = nlohmann::json::array();
    return out;
  }
  const Sample& last = samples_.back();
  out["now_unix_s"] = last.unix_s;
  const Sample& from = query.since_unix_s ? AtUnix(*query.since_unix_s) : At(last.t - query.window_s);
  nlohmann::json summary = Between(from, last);
  summary["running"] = last.running;
  out["summary"] = std::move(summary);

  // Chart points: every sample of the last series_s seconds, each over the step_s before it.
  static const char* const kSeries[] = {"ttft_p50_s",          "ttft_p90_s",
                                         "ttft_p99_s",          "itl_p50_s",
                                         "itl_p99_s",           "prompt_tokens_per_s",
                                         "generation_tokens_per_s", "requests_per_s",
                                         "failed_per_s",        "cache_hit_ratio"};
  nlohmann::json series = {{"t", nlohmann::json::array()}, {"running", nlohmann::json::array()}};
  for (const char* k : kSeries) series[k] = nlohmann::json::array();
  std::vector<const Sample*> points;
  for (const Sample& s : samples_) {
    if (s.t >= last.t - query.series_s - 1e-9) points.push_back(&s);
  }
  for (const Sample* p : points) {
    const nlohmann::json v = Between(At(p->t - query.step_s), *p);
    series["t"].push_back(p->unix_s);
    series["running"].push_back(p->running);
    for (const char* k : kSeries) series[k].push_back(v[k]);
  }
  out["series"] = std::move(series);

  // Per replica, aligned with series.t (null where a replica was not registered).
  std::vector<std::string> order;
  std::map<std::string, nlohmann::json> replicas;
  for (size_t i = 0; i < points.size(); ++i) {
    for (const ReplicaLoad& r : points[i]->replicas) {
      auto [it, inserted] = replicas.try_emplace(r.id);
      if (inserted) {
        order.push_back(r.id);
        const nlohmann::json nulls(std::vector<std::nullptr_t>(points.size(), nullptr));
        it->second = {{"id", r.id},     {"role", r.role},       {"running", nulls},
                      {"waiting", nulls}, {"kv_usage", nulls}, {"outstanding", nulls}};
      }
      nlohmann::json& j = it->second;
      j["role"] = r.role;
      j["state"] = r.state;
      j["running"][i] = r.running;
      j["waiting"][i] = r.waiting;
      j["kv_usage"][i] = r.kv_usage;
      j["outstanding"][i] = r.outstanding;
    }
  }
  nlohmann::json list = nlohmann::json::array();
  for (const std::string& id : order) list.push_back(std::move(replicas[id]));
  out["replicas"] = std::move(list);
  return out;
}

MetricsHistory::ReplicaSource RegistryLoads(const ReplicaRegistry* registry) {
  return [registry] {
    v1::ListReplicasResponse list;
    registry->List(&list);
    std::vector<MetricsHistory::ReplicaLoad> out;
    for (const v1::ReplicaInfo& r : list.replicas()) {
      out.push_back({.id = r.replica_id(),
                     .role = r.role() == v1::ROLE_PREFILL   ? "prefill"
                             : r.role() == v1::ROLE_DECODE  ? "decode"
                             : r.role() == v1::ROLE_KVSTORE ? "kvstore"
                                                            : "both",
                     .state = r.state(),
                     .running = r.load().running(),
                     .waiting = r.load().waiting(),
                     .outstanding = static_cast<int>(r.outstanding()),
                     .kv_usage = r.load().kv_usage()});
    }
    return out;
  };
}

}  // namespace tandem
