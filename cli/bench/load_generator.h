// A serving load generator in the style of `vllm bench serve`: requests with random token
// prompts (optionally sharing prefixes) arrive as a Poisson process (or all at once),
// under a concurrency cap, as streaming Generate calls; every streamed chunk is
// timestamped for TTFT, TPOT and ITL.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/bench/bench_report.h"
#include "cli/client_security.h"

namespace tandem::cli {

struct LoadOptions {
  std::string addr;
  ClientSecurityArgs security;
  std::string model;
  int num_prompts = 1000;
  double request_rate = 0;   // requests/s; 0 or inf: all at once
  int max_concurrency = 0;   // 0: unbounded
  int input_len = 512;
  int output_len = 128;
  double range_ratio = 0;    // lengths uniform in [len*(1-r), len*(1+r)]
  int prefix_len = 0;        // shared-prefix dataset: each prompt = prefix + random part
  int num_prefixes = 1;
  bool ignore_eos = false;
  double temperature = 0;
  uint64_t seed = 0;
  int num_warmup = 1;
  double request_timeout_s = 600;
  // Called with (done, failed, total) as requests finish (progress display).
  std::function<void(int, int, int)> progress;
};

struct LoadResult {
  std::vector<RequestRecord> records;
  double duration_s = 0;
  int64_t vocab_size = 0;
  std::string model;
};

// Errors: UNAVAILABLE when the server cannot be reached (ListModels fails),
// INVALID_ARGUMENT for inconsistent options.
absl::StatusOr<LoadResult> RunLoad(const LoadOptions& options);

}  // namespace tandem::cli
