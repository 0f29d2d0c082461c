// The router's recent history, for its /dashboard page (docs/design.md §9): every `interval`
// it reads the router's own Prometheus metrics (the counters and histograms /metrics
// serves, so the page and Prometheus agree) and each replica's last load report from the
// membership, and keeps the last `capacity` samples. From two samples it computes what the
// page shows: TTFT and inter-token latency percentiles from the histograms' bucket deltas
// (interpolated within a bucket, as Prometheus' histogram_quantile does), token and
// request rates, the prefix-cache hit ratio. Nothing runs on the request path: one
// Collect() per interval.
//
//   MetricsHistory history(registry, RegistryLoads(&replicas), {});
//   history.Start();                        // samples on its own thread until Stop()
//   nlohmann::json j = history.ToJson({.window_s = 30});
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"
#include "prometheus/collectable.h"

namespace tandem {

class ReplicaRegistry;

// A histogram's cumulative bucket counts (the last bound is +Inf).
struct HistogramCounts {
  std::vector<double> upper_bounds;
  std::vector<double> cumulative;
  double count = 0, sum = 0;
};

// `later - earlier`, bucket by bucket (empty if the buckets differ).
HistogramCounts Delta(const HistogramCounts& later, const HistogramCounts& earlier);

// The q-quantile (0 <= q <= 1) of the observations counted in `h`, interpolated linearly
// within its bucket like Prometheus' histogram_quantile (the first bucket's lower bound is
// 0; a quantile in the +Inf bucket is the highest finite bound). nullopt when empty.
std::optional<double> HistogramQuantile(double q, const HistogramCounts& h);

class MetricsHistory {
 public:
  struct ReplicaLoad {
    std::string id, role, state;
    int running = 0, waiting = 0, outstanding = 0;
    double kv_usage = 0;
  };
  using ReplicaSource = std::function<std::vector<ReplicaLoad>()>;

  struct Options {
    std::chrono::milliseconds interval{1000};
    size_t capacity = 900;  // samples kept (15 minutes at 1 s)
  };

  // `metrics`: the router's registry (RouterMetrics' families); `replicas` (may be
  // empty) is read at each sample.
  MetricsHistory(std::shared_ptr<prometheus::Collectable> metrics, ReplicaSource replicas, Options options);
  ~MetricsHistory();  // Stop()
  MetricsHistory(const MetricsHistory&) = delete;
  MetricsHistory& operator=(const MetricsHistory&) = delete;

  // Samples now and then every interval on a background thread, until Stop().
  void Start();
  void Stop();

  // Takes one sample stamped `t` (seconds on any monotonic clock) and `unix_s` (wall
  // clock, the page's time axis). Start()'s thread calls it; tests call it directly.
  void Record(double t, double unix_s);

  struct Query {
    double window_s = 30;   // the summary: over the last window_s seconds ...
    std::optional<double> since_unix_s;  // ... or since this wall-clock time (a run's start)
    double series_s = 300;  // the charts: points of the last series_s seconds ...
    double step_s = 10;     // ... each point over the step_s seconds before it
  };
  // {"metrics_enabled", "window_s", "summary": {...}, "series": {"t": [...], ...},
  //  "replicas": [{"id", "role", "running": [...], "waiting": [...], "kv_usage": [...]}]}
  // A window starts at the last sample at or before its start (so it spans up to one
  // interval more; "span_s" says how long exactly) and ends at the last sample. Values
  // that cannot be computed (no requests in the window) are null.
  nlohmann::json ToJson(const Query& query) const;

 private:
  struct Sample {
    double t = 0, unix_s = 0;
    HistogramCounts ttft, itl, tpot, e2e;
    double prompt_tokens = 0, generation_tokens = 0, cached_tokens = 0, running = 0;
    std::map<std::string, double> requests;  // by outcome
    std::vector<ReplicaLoad> replicas;
  };
  // The sample at or before `t` (the oldest if none is).
  const Sample& At(double t) const;
  // The sample at or before wall-clock time `unix_s` (the oldest if none is).
  const Sample& AtUnix(double unix_s) const;
  static nlohmann::json Between(const Sample& from, const Sample& to);

  const std::shared_ptr<prometheus::Collectable> metrics_;
  const ReplicaSource replicas_;
  const Options options_;

  mutable std::mutex mu_;
  std::deque<Sample> samples_;

  std::mutex thread_mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

// Each replica's last load report, from the router's membership.
MetricsHistory::ReplicaSource RegistryLoads(const ReplicaRegistry* registry);

}  // namespace tandem
