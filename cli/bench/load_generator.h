// A serving load generator in the style of `vllm bench serve`: requests from the dataset
// (cli/bench/dataset.h) arrive as a Poisson process (or all at once), under a
// concurrency cap, as streaming requests of a backend (cli/bench/bench_backend.h); every
// streamed piece is timestamped for TTFT, TPOT and ITL.
//
// Backends can also be compared in one run: the same load through each in turn, in
// rounds whose order alternates (A B, B A, A B, ...), so that drift of the cluster (a
// cache warming, another process) falls on all of them alike.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/bench/bench_backend.h"
#include "cli/bench/bench_report.h"
#include "cli/bench/dataset.h"

namespace tandem::cli {

struct LoadOptions {
  DatasetOptions dataset;
  double request_rate = 0;  // requests/s; 0 or inf: all at once
  int max_concurrency = 0;  // 0: unbounded
  int64_t vocab_size = 0;   // of the random prompts; 0: the server's
  // Called with (done, failed, total) as requests finish (progress display).
  std::function<void(int, int, int)> progress;
};

struct LoadResult {
  std::string backend;
  std::vector<RequestRecord> records;
  double duration_s = 0;  // compared: the sum of this backend's rounds
  int64_t vocab_size = 0;
  std::string model;
  nlohmann::json transport;  // BenchBackend::TransportStats after the run
  // Compared only: the median TTFT of each round (ms), in round order.
  std::vector<double> round_ttft_p50_ms;
};

// Connects, prepares the dataset, warms up (one request at a time, not measured), then
// runs the load. Errors: those of Connect and Prepare (UNAVAILABLE when the server
// cannot be reached), INVALID_ARGUMENT for inconsistent options.
absl::StatusOr<LoadResult> RunLoad(BenchBackend& backend, const LoadOptions& options);

// The same load through every backend: options.dataset.num_prompts requests each, in
// `rounds` rounds (at most num_prompts), each backend with prompts of its own of the same
// shape (cli/bench/dataset.h) and its own warm-up. Results in the order of `backends`.
// The backends must serve the same model (INVALID_ARGUMENT otherwise).
absl::StatusOr<std::vector<LoadResult>> RunCompare(const std::vector<BenchBackend*>& backends,
                                                   const LoadOptions& options, int rounds);

}  // namespace tandem::cli
