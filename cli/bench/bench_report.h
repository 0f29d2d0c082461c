// Statistics of a serving benchmark run, in the shape `vllm bench serve` reports them:
// TTFT, TPOT, ITL and end-to-end latency (mean, median, p90, p99), request and token
// throughput, and goodput under latency SLOs.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace tandem::cli {

struct RequestRecord {
  bool ok = false;
  std::string error;             // status message when !ok
  // What kind of failure, counted in the report: "http 503", "grpc UNAVAILABLE",
  // "connection", "timeout", "stream error 500", "protocol".
  std::string error_class;
  int32_t prompt_tokens = 0;
  int32_t output_tokens = 0;
  int32_t cached_prompt_tokens = 0;
  // Speculative decoding (the final usage's draft_tokens, accepted_draft_tokens; gRPC only).
  int32_t draft_tokens = 0;
  int32_t accepted_draft_tokens = 0;
  double start_s = 0;            // since the run started
  double ttft_s = 0;             // first token - start
  double e2e_s = 0;              // last message - start
  std::vector<double> itl_s;     // gaps between consecutive streamed chunks
  int32_t chunks = 0;            // streamed pieces that carried output (the first included)
};

struct Slo {
  double ttft_ms = 0;  // 0: no bound
  double tpot_ms = 0;
};

struct LatencySummary {
  double mean = 0, median = 0, p90 = 0, p99 = 0, max = 0;
  nlohmann::json ToJson() const;
};

LatencySummary Summarize(std::vector<double> values_ms);

struct BenchReport {
  int completed = 0;
  int failed = 0;
  double duration_s = 0;
  int64_t total_input_tokens = 0;
  int64_t total_output_tokens = 0;
  int64_t cached_input_tokens = 0;
  // Beside TTFT, so that a figure says how much of it was a prefix-cache (or kvstore) hit:
  // how many completed requests had cached prompt tokens (the final usage's
  // cached_prompt_tokens), their distribution per request, and the TTFT of the requests
  // that had none.
  int requests_with_cached_tokens = 0;
  LatencySummary cached_tokens_per_request;  // tokens, not ms
  LatencySummary ttft_uncached_ms;
  double request_throughput = 0;       // completed requests / s
  double output_throughput = 0;        // output tokens / s
  double total_token_throughput = 0;   // (input + output) tokens / s
  double goodput = 0;                  // requests / s meeting every SLO
  LatencySummary ttft_ms, tpot_ms, itl_ms, e2e_ms;
  std::vector<std::string> sample_errors;
  std::map<std::string, int> errors_by_class;  // failed requests per RequestRecord::error_class
  // Streamed pieces carrying output over all completed requests: more than one per
  // request says the answers really were streamed.
  int64_t total_output_chunks = 0;
  // Speculative decoding, when the servers draft (reported only then): draft tokens
  // verified and accepted over all completed requests. The mean accepted drafts per verify
  // step is the workers' tandem_spec_accepted_length (_sum / _count): a request's usage
  // does not count its steps.
  int64_t draft_tokens = 0;
  int64_t accepted_draft_tokens = 0;
  double draft_acceptance_rate = 0;  // accepted / drafted

  nlohmann::json ToJson() const;
  std::string ToText() const;  // the human-readable table
};

BenchReport Compute(const std::vector<RequestRecord>& records, double duration_s, const Slo& slo);

}  // namespace tandem::cli
