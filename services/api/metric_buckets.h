// Histogram buckets fit for LLM serving latencies, in seconds (close to vLLM's), shared
// by every service so dashboards can aggregate across them.
#pragma once

#include <vector>

namespace tandem {

// Time to first token, queue and prefill time.
inline std::vector<double> TtftBuckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}
// The router's client-facing time to first token: TtftBuckets plus points in between, so
// that neighbouring bounds differ by at most 20 % (mostly 10-17 %) from 5 ms to 2 s. A p99
// SLO read with histogram_quantile is interpolated within one bucket, so its error is
// bounded by the bucket's width; with TtftBuckets alone (e.g. 20-40 ms, 100-250 ms) it can
// be 50 % or more.
inline std::vector<double> ClientTtftBuckets() {
  return {
    0.001, 0.0025, 0.005, 0.006, 0.007, 0.008, 0.009, 0.01, 0.0115, 0.013, 0.015, 0.0175, 0.02, 0.0225, 0.025,
    0.0275, 0.03, 0.035, 0.04, 0.045, 0.05, 0.055, 0.06, 0.07, 0.08, 0.09, 0.1, 0.115, 0.13, 0.15, 0.175, 0.2, 0.225,
    0.25, 0.275, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.675, 0.75, 0.85, 1.0, 1.15, 1.3, 1.5, 1.75, 2.0, 2.5, 3.0,
    4.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}
// Inter-token latency and time per output token.
inline std::vector<double> TokenLatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
          0.75, 1.0, 2.5};
}
// End-to-end request latency.
inline std::vector<double> RequestLatencyBuckets() {
  return {0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0};
}
// KV transfer of one request.
inline std::vector<double> TransferBuckets() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0};
}

}  // namespace tandem
