// What the router's metrics cost in CPU time, measured without the noise of a whole
// cluster (bench/metrics_overhead.sh measures throughput with them on and off, and the
// router's CPU time per request): Google Benchmark of
//  - one request's observations: RequestStarted, one inter-token latency per streamed
//    chunk after the first, RequestFinished (TTFT, TPOT, e2e, queue, prefill, transfer
//    histograms; outcome and token counters);
//  - one scrape of /metrics: Collect and serialize the router's registry (Prometheus does
//    this once per scrape interval);
//  - one sample of the dashboard's history (MetricsHistory::Record, once a second).
// bench/metrics_overhead.sh turns these into microseconds per request at the throughput
// it measured and compares them with the router's CPU time per request.
#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>

#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "services/router/metrics_history.h"
#include "services/router/router_metrics.h"

namespace tandem {
namespace {

void ObserveRequest(RouterMetrics& m, int tokens, int i) {
  m.RequestStarted();
  for (int t = 1; t < tokens; ++t) m.InterTokenLatency(0.004 + 0.0001 * ((i + t) % 50));
  m.RequestFinished({.code = grpc::StatusCode::OK,
                     .prompt_tokens = 64,
                     .completion_tokens = tokens,
                     .cached_prompt_tokens = 0,
                     .ttft_s = 0.02 + 0.001 * (i % 100),
                     .e2e_s = 0.1 + 0.001 * (i % 100),
                     .queue_s = 0.001,
                     .prefill_s = 0.01,
                     .transfer_s = 0.002});
}

// One request of state.range(0) output tokens.
void BM_RequestObservations(benchmark::State& state) {
  prometheus::Registry registry;
  RouterMetrics m(registry, "tiny");
  const int tokens = static_cast<int>(state.range(0));
  int i = 0;
  for (auto _ : state) ObserveRequest(m, tokens, i++);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RequestObservations)->Arg(16)->Arg(256);

void BM_Scrape(benchmark::State& state) {
  auto registry = std::make_shared<prometheus::Registry>();
  RouterMetrics m(*registry, "tiny");
  for (int i = 0; i < 1000; ++i) ObserveRequest(m, 16, i);
  const prometheus::TextSerializer serializer;
  size_t bytes = 0;
  for (auto _ : state) {
    const std::string text = serializer.Serialize(registry->Collect());
    bytes = text.size();
    benchmark::DoNotOptimize(text.data());
  }
  state.counters["bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_Scrape);

void BM_HistorySample(benchmark::State& state) {
  auto registry = std::make_shared<prometheus::Registry>();
  RouterMetrics m(*registry, "tiny");
  for (int i = 0; i < 1000; ++i) ObserveRequest(m, 16, i);
  MetricsHistory history(registry, {}, MetricsHistory::Options{});
  double t = 0;
  for (auto _ : state) {
    history.Record(t, 1.8e9 + t);
    t += 1;
  }
}
BENCHMARK(BM_HistorySample);

}  // namespace
}  // namespace tandem

BENCHMARK_MAIN();
